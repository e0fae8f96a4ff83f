/**
 * The E2B control plane (what the SDK calls at E2B_API_URL with X-API-Key): sandboxes, forks, snapshots,
 * templates. One Fastify scope with its own key check and E2B's error body; every route it registers is
 * recorded for the E2B OpenAPI document.
 */
import type { FastifyInstance, FastifyRequest, RouteOptions } from "fastify";
import { ForkdError } from "../../common/errors.js";
import { matchToken } from "../../common/tokens.js";
import { ADMIN } from "../../controller/tenancy/tenant-view.js";
import type { E2bContext } from "../context.js";
import { sendE2bError } from "../errors.js";
import { registerTemplateBuildRoutes } from "../templates/index.js";
import { registerForkRoutes } from "./forks.js";
import { registerSandboxRoutes } from "./sandboxes.js";
import { registerTemplateRoutes } from "./templates.js";

/** Route families of E2B's API that forkd does not serve (secrets, volumes, teams, logs, unknown versions). */
const UNSERVED_FAMILIES = [
  "/v2/*",
  "/v3/*",
  "/sandboxes/*",
  "/templates/*",
  "/secrets",
  "/secrets/*",
  "/volumes",
  "/volumes/*",
  "/teams",
  "/teams/*",
];

export const E2B_ROUTE_TAG = "E2B";

/** Registers the control plane; `onRoute` sees every route (for the OpenAPI document). */
export async function registerControlPlane(
  app: FastifyInstance,
  context: E2bContext,
  onRoute: (route: RouteOptions) => void = () => {},
): Promise<void> {
  await app.register(async (scope) => {
    scope.addHook("onRoute", (route) => {
      route.config = { ...(route.config as object), e2b: true };
      route.schema = { ...route.schema, tags: [E2B_ROUTE_TAG] };
      if (!route.url.endsWith("*")) onRoute(route);
    });
    scope.addHook("onRequest", async (request) => {
      // A signed upload URL authenticates itself (templates/files.ts): the SDK sends it no API key.
      if (request.routeOptions.config?.e2bSignedUpload) return;
      request.caller = apiKeyCaller(request, context);
      // The audit log names the sandbox a mutation touched (E2B calls the path parameter sandboxID).
      const sandboxId = (request.params as { sandboxID?: unknown } | undefined)?.sandboxID;
      if (typeof sandboxId === "string" && sandboxId !== "") request.auditIds.push(sandboxId.slice(0, 128));
    });
    scope.setErrorHandler((err, request, reply) => {
      const status = err instanceof ForkdError ? err.httpStatus : 500;
      if (status >= 500 && status !== 501) request.log.error({ err }, "E2B request failed");
      return sendE2bError(reply, err);
    });

    registerSandboxRoutes(scope, context);
    registerForkRoutes(scope, context);
    registerTemplateRoutes(scope, context);
    await registerTemplateBuildRoutes(scope);
    for (const url of UNSERVED_FAMILIES) {
      scope.all(url, async (request) => {
        throw new ForkdError(
          "not_implemented",
          `${request.method} ${request.url.split("?")[0]} is part of E2B's API that forkd does not serve`,
        );
      });
    }
  });
}

/**
 * The caller by its API key: X-API-Key (what the SDK sends) or a bearer token, matched in constant time against
 * the daemon's tokens; sets the request's principal (the key's tenant, or admin). No tokens configured: no key
 * is needed and the caller is an admin, as on the forkd API.
 */
function apiKeyCaller(request: FastifyRequest, context: E2bContext): string {
  // A trusted front (the cluster gateway) checked the caller's key and set the principal (src/api/front.ts).
  if (request.viaFront) return request.caller;
  const address = `tcp:${request.ip}`;
  if (context.tokens.length === 0) {
    request.principal = ADMIN;
    return request.caller || address;
  }
  request.caller = address;
  const header = request.headers["x-api-key"];
  const bearer = /^Bearer[ ]+(\S+)[ ]*$/i.exec(request.headers.authorization ?? "")?.[1];
  const key = (Array.isArray(header) ? header[0] : header) ?? bearer;
  if (key === undefined || key === "") {
    throw new ForkdError("unauthorized", "missing API key: send X-API-Key: <a forkd daemon token>");
  }
  const token = matchToken(key, context.tokens);
  if (!token) throw new ForkdError("unauthorized", "invalid API key");
  request.principal = token.tenant === null ? ADMIN : { tenant: token.tenant };
  return token.id;
}
