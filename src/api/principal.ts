/**
 * The request-scoped principal: who a request acts for (an admin, or one tenant), resolved once when the request
 * is authenticated (app.ts), and the services as that principal may use them (controller/tenancy). Routes
 * reach the services only through `servicesOf(request)`, so no route can forget the scope.
 */
import type { FastifyRequest } from "fastify";
import { ForkdError } from "../common/errors.js";
import type { Token } from "../common/tokens.js";
import { ADMIN, type Principal, type Services, servicesFor } from "../controller/tenancy/tenant-view.js";

export { ADMIN, type Principal } from "../controller/tenancy/tenant-view.js";

declare module "fastify" {
  interface FastifyRequest {
    /** Who the request acts for; null until it is authenticated (src/e2b sets it for its control plane too). */
    principal: Principal | null;
  }
}

export function principalOf(token: Token): Principal {
  return token.tenant === null ? ADMIN : { tenant: token.tenant };
}

const scoped = new WeakMap<FastifyRequest, Services>();

/** The services as the request's principal may use them; refuses a request nobody authenticated. */
export function servicesOf(request: FastifyRequest, context: { services: Services }): Services {
  let services = scoped.get(request);
  if (services === undefined) {
    if (request.principal === null) {
      throw new ForkdError("internal", "request reached a route without an authenticated principal");
    }
    services = servicesFor(context.services, request.principal);
    scoped.set(request, services);
  }
  return services;
}
