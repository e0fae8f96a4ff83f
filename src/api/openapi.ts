/**
 * The OpenAPI document, generated from the route schemas by @fastify/swagger. docs/openapi.json is this output,
 * checked in (`npm run openapi` rewrites it; test/api/openapi.test.ts fails when it is stale).
 */
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { ForkdError } from "../common/errors.js";
import { buildApi, type DaemonServices } from "./app.js";

/** Services for a documentation-only instance: routes are registered, any call is refused. */
function refusingServices(): DaemonServices {
  const refuse = () => {
    throw new ForkdError("unavailable", "documentation-only API instance");
  };
  const object = new Proxy({}, { get: () => refuse });
  return {
    sandboxes: object as DaemonServices["sandboxes"],
    snapshots: object as DaemonServices["snapshots"],
  };
}

export async function generateOpenApi(): Promise<Record<string, unknown>> {
  const app = await buildApi({
    services: refusingServices(),
    snapshotsDir: "/var/lib/forkd/snapshots",
    transport: "inject",
  });
  try {
    await app.ready();
    return app.swagger() as unknown as Record<string, unknown>;
  } finally {
    await app.close();
  }
}

/** The document as it is written to docs/openapi.json. */
export async function renderOpenApi(): Promise<string> {
  return `${JSON.stringify(await generateOpenApi(), null, 2)}\n`;
}

/** docs/openapi.json of the source tree, from src/api (tsx) or dist/src/api (compiled). */
export function checkedInOpenApiPath(): string {
  for (const up of ["../../", "../../../"]) {
    if (existsSync(new URL(`${up}package.json`, import.meta.url))) {
      return fileURLToPath(new URL(`${up}docs/openapi.json`, import.meta.url));
    }
  }
  throw new ForkdError("not_found", "cannot find the source tree's docs/ next to package.json");
}
