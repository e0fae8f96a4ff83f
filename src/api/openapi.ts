/**
 * The OpenAPI document, generated from the route schemas by @fastify/swagger. docs/openapi.json is this output,
 * checked in (`npm run openapi` rewrites it; test/api/openapi.test.ts fails when it is stale).
 */
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { ForkdError } from "../common/errors.js";
import { e2bOpenApi } from "../e2b/control/openapi.js";
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

/** The documents a documentation-only instance serves: the forkd API's and the E2B API's. */
export async function generateOpenApi(): Promise<{
  forkd: Record<string, unknown>;
  e2b: Record<string, unknown>;
}> {
  const app = await buildApi({
    services: refusingServices(),
    snapshotsDir: "/var/lib/forkd/snapshots",
    transport: "inject",
  });
  try {
    await app.ready();
    return {
      forkd: app.swagger() as unknown as Record<string, unknown>,
      e2b: e2bOpenApi(app.e2bControlRoutes),
    };
  } finally {
    await app.close();
  }
}

/** The documents as they are written to docs/openapi.json and docs/e2b-openapi.json. */
export async function renderOpenApi(): Promise<{ forkd: string; e2b: string }> {
  const docs = await generateOpenApi();
  return {
    forkd: `${JSON.stringify(docs.forkd, null, 2)}\n`,
    e2b: `${JSON.stringify(docs.e2b, null, 2)}\n`,
  };
}

/** docs/<name> of the source tree, from src/api (tsx) or dist/src/api (compiled). */
export function checkedInOpenApiPath(name: "openapi.json" | "e2b-openapi.json" = "openapi.json"): string {
  for (const up of ["../../", "../../../"]) {
    if (existsSync(new URL(`${up}package.json`, import.meta.url))) {
      return fileURLToPath(new URL(`${up}docs/${name}`, import.meta.url));
    }
  }
  throw new ForkdError("not_found", "cannot find the source tree's docs/ next to package.json");
}
