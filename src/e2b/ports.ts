/**
 * Any other port of a sandbox (`E2b-Sandbox-Port: 3000`, `3000-<id>.<domain>`): E2B proxies it to a server
 * inside the sandbox. forkd guests have no network yet, so the answer is E2B's 502 with a message naming why.
 */
import type { FastifyInstance } from "fastify";
import type { E2bContext } from "./context.js";
import { SandboxUnreachable, sendE2bError } from "./errors.js";
import { resolveSandbox } from "./session.js";

export async function registerPorts(scope: FastifyInstance, context: E2bContext): Promise<void> {
  scope.setErrorHandler((err, _request, reply) => sendE2bError(reply, err));
  scope.all("/*", async (request) => {
    const session = resolveSandbox(request, context);
    const port = Number.isNaN(session.port) ? "(none)" : String(session.port);
    throw new SandboxUnreachable(
      `port ${port} of sandbox ${session.sandboxId} is not reachable: forkd sandboxes have no network yet ` +
        "(the networking issue); only envd (49983) and the code interpreter (49999) are served",
    );
  });
  scope.all("/", async (request) => {
    resolveSandbox(request, context);
    throw new SandboxUnreachable("forkd sandboxes have no network yet (the networking issue)");
  });
}
