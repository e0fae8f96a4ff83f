/**
 * What a route of any HTTP face of the daemon (src/api's forkd and v0.5 routes, src/e2b's control and data planes,
 * src/console) may use of the daemon for one request: the caller's view of the services, and a signal that fires
 * when the client goes away.
 *
 * A listener is handed the daemon's services once (provideServices, by src/api/app.ts). A route reaches them only
 * as servicesOf(request): the view of whoever authentication says the request acts for (`request.principal`,
 * controller/tenancy/). Route modules are given no services of their own, so none can skip the view.
 */
import type { IncomingMessage } from "node:http";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { responseGoneSignal } from "../common/client-signal.js";
import { ForkdError } from "../common/errors.js";
import { observeSpawns, type SpawnObserver } from "../controller/sandboxes/spawn-observer.js";
import { type Principal, type Services, servicesFor } from "../controller/tenancy/tenant-view.js";
import type { ConnectionBudget } from "./connection-budget.js";

declare module "fastify" {
  interface FastifyRequest {
    /**
     * Who the request acts for; null until authentication sets it (src/api for its routes, src/e2b for its
     * control plane's API key and for the one sandbox a data-plane request addresses).
     */
    principal: Principal | null;
    /**
     * The request came through the listener's trusted front (src/api/front.ts: the cluster gateway), which
     * authenticated its caller and set `principal`: no face authenticates it again.
     */
    viaFront: boolean;
  }
}

/** What a listener was given: the daemon's services, and who observes every spawn made through them. */
interface Provided {
  services: Services;
  spawns: SpawnObserver | undefined;
  connections: ConnectionBudget | undefined;
}

/** The daemon's services behind each request and upgrade of a listener that provideServices was given. */
const daemonServices = new WeakMap<IncomingMessage, Provided>();
const views = new WeakMap<IncomingMessage, { principal: Principal; services: Services }>();

/**
 * Puts the daemon's services behind every request and upgrade of `app`'s listener. Called once per listener,
 * before any other hook, by the code that composes the daemon (src/api/app.ts). Every spawn made through a
 * caller's view is reported to `spawns` (controller/sandboxes/spawn-observer.ts), whichever face made it, and
 * every connection a tenant's view serves counts against its bound in `connections` (connection-budget.ts).
 */
export function provideServices(
  app: FastifyInstance,
  services: Services,
  spawns?: SpawnObserver,
  connections?: ConnectionBudget,
): void {
  const provided: Provided = { services, spawns, connections };
  app.decorateRequest("principal", null);
  app.decorateRequest("viaFront", false);
  app.addHook("onRequest", async (request) => {
    daemonServices.set(request.raw, provided);
  });
  app.server.prependListener("upgrade", (req: IncomingMessage) => daemonServices.set(req, provided));
}

/** The services as the request's principal may use them; refuses a request nobody authenticated. */
export function servicesOf(request: FastifyRequest): Services {
  if (request.principal === null) {
    throw new ForkdError("internal", "request reached a route without an authenticated principal");
  }
  return viewOf(request.raw, request.principal);
}

/**
 * servicesOf for an HTTP upgrade (it reaches no route): the services as `principal`, whom the upgrade's own
 * authentication just named, may use them.
 */
export function servicesOfUpgrade(req: IncomingMessage, principal: Principal): Services {
  return viewOf(req, principal);
}

/** servicesOf for a route only an admin may use (its answer describes every tenant's sandboxes): 403 for a tenant. */
export function adminServicesOf(request: FastifyRequest, what: string): Services {
  const services = servicesOf(request);
  if (request.principal?.tenant !== null || request.principal.sandbox !== undefined) {
    throw new ForkdError("forbidden", `${what} is for admins: it describes every tenant's sandboxes`);
  }
  return services;
}

/** Fires when the client goes away before its response was sent (see common/client-signal.ts). */
export function clientSignal(request: FastifyRequest, reply: FastifyReply): AbortSignal {
  return responseGoneSignal(reply.raw, `request ${request.id}`);
}

function viewOf(req: IncomingMessage, principal: Principal): Services {
  const cached = views.get(req);
  if (cached?.principal === principal) return cached.services;
  const provided = daemonServices.get(req);
  if (provided === undefined) {
    throw new ForkdError("internal", "request on a listener that was given no services (provideServices)");
  }
  // A tenant's connection counts from the first request on it that reaches the services.
  if (principal.tenant !== null) provided.connections?.admit(principal.tenant, req.socket);
  const view = servicesFor(provided.services, principal);
  const observed =
    provided.spawns === undefined
      ? view
      : { ...view, sandboxes: observeSpawns(view.sandboxes, provided.spawns) };
  views.set(req, { principal, services: observed });
  return observed;
}
