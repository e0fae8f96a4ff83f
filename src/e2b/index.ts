/**
 * forkd speaking E2B: the control plane E2B's SDKs call at E2B_API_URL, and the sandbox data plane they reach at
 * E2B_SANDBOX_URL (E2b-Sandbox-Id / E2b-Sandbox-Port headers) or at `<port>-<sandboxId>.<domain>`, all on the
 * daemon's own listener. Requests addressed to a sandbox only ever match data-plane routes (see routing.ts).
 */
import type http from "node:http";
import type net from "node:net";
import type { FastifyInstance, RouteOptions } from "fastify";
import { createE2bContext, type E2bContext, type E2bOptions } from "./context.js";
import { registerControlPlane } from "./control/index.js";
import { registerEnvd, registerSignedFiles } from "./envd/index.js";
import { registerInterpreter } from "./interpreter/index.js";
import { registerPorts, upgradeToSandboxPort } from "./ports.js";
import { type SandboxSurface, SURFACE_CONSTRAINT } from "./routing.js";
import { autoResume } from "./session.js";

export type { E2bOptions, E2bSettings } from "./context.js";
export { E2B_ROUTE_TAG } from "./control/index.js";
export {
  defaultSandboxDomain,
  isSandboxOrigin,
  SURFACE_CONSTRAINT,
  sandboxAddressOf,
  surfaceConstraint,
} from "./routing.js";

export interface E2bRegistration {
  /** Routes of the control plane, for the E2B OpenAPI document. */
  controlRoutes: RouteOptions[];
  /**
   * Handles an HTTP upgrade addressed to a sandbox (a WebSocket to one of its ports) and returns true, or
   * returns false for any other upgrade. The listener's Host/Origin check must have passed before.
   */
  upgrade: (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => boolean;
}

/**
 * Registers every E2B surface on `app`, whose router must have been created with `surfaceConstraint`
 * (src/api/app.ts does). E2B routes authenticate their own callers (`config.e2b`).
 */
export async function registerE2b(app: FastifyInstance, options: E2bOptions): Promise<E2bRegistration> {
  const context = createE2bContext(options);
  const controlRoutes: RouteOptions[] = [];
  await registerControlPlane(app, context, (route) => {
    if (route.method !== "HEAD") controlRoutes.push(route);
  });
  await registerSurface(app, context, "envd", registerEnvd);
  await app.register(async (scope) => registerSignedFiles(scope, context));
  await registerSurface(app, context, "interpreter", registerInterpreter);
  await registerSurface(app, context, "port", registerPorts);
  app.addHook("onClose", async () => {
    await context.watchers.closeAll();
  });
  return { controlRoutes, upgrade: upgradeToSandboxPort(context) };
}

async function registerSurface(
  app: FastifyInstance,
  context: E2bContext,
  surface: SandboxSurface,
  register: (scope: FastifyInstance, context: E2bContext) => Promise<void>,
): Promise<void> {
  await app.register(async (scope) => {
    scope.addHook("onRoute", (route) => {
      route.constraints = { ...route.constraints, [SURFACE_CONSTRAINT]: surface };
      route.config = { ...(route.config as object), e2b: true };
      // The data plane is envd's and the interpreter's protocol, not part of the daemon's OpenAPI document.
      route.schema = { ...route.schema, hide: true };
    });
    // Before the surface's own hooks, which want the sandbox running.
    scope.addHook("onRequest", async (request) => autoResume(request, context));
    await register(scope, context);
  });
}
