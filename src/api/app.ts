/**
 * Builds the REST API as a Fastify instance over the daemon's services. One instance per listener (Unix socket,
 * TCP): they share services, metrics and the audit log and differ only in how a caller is identified and whether
 * a bearer token is required. The HTTP layer never touches VM state itself; every route calls a service.
 */
import { randomUUID } from "node:crypto";
import type { IncomingHttpHeaders, IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import path from "node:path";
import swagger from "@fastify/swagger";
import type { TSchema } from "@sinclair/typebox";
import Fastify, {
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  type FastifyServerOptions,
  LogController,
  type RouteOptions,
} from "fastify";
import type { Logger } from "pino";
import { ForkdError } from "../common/errors.js";
import { PORT_PROXY_HEADER } from "../common/proxied-path.js";
import { FORKD_VERSION } from "../common/version.js";
import {
  E2B_ROUTE_TAG,
  type E2bSettings,
  isSandboxOrigin,
  registerE2b,
  SURFACE_CONSTRAINT,
  sandboxAddressOf,
  surfaceConstraint,
} from "../e2b/index.js";
import { ConnectionBudget } from "../http/connection-budget.js";
import { provideServices } from "../http/request-scope.js";
import { type AuditLog, redactUrl } from "./audit.js";
import { authenticate, type Token } from "./auth.js";
import type { ApiContext, DaemonServices } from "./context.js";
import { errorHandlerFor, type HostPathRedaction, notFoundHandler, toHttpError } from "./errors.js";
import { type ApiExtension, CONSOLE_SESSION_CALLER, type ListenerInfo } from "./extensions.js";
import { type FrontAdmission, isProbe, type TrustedFront } from "./front.js";
import { createMetrics, type DaemonMetrics } from "./metrics.js";
import { checkHostAndOrigin, type OriginPolicy, originPolicyFor } from "./origin-policy.js";
import { peerCredentials } from "./peer-cred.js";
import { ADMIN, principalOf } from "./principal.js";
import { registerExecStreamRoute } from "./routes/exec-stream.js";
import { registerFileRoutes } from "./routes/files.js";
import { registerHostRoutes } from "./routes/host.js";
import {
  checkPortProxied,
  portUpgradeHandler,
  refuseUpgrade,
  registerNetworkRoutes,
  registerPortProxyRoutes,
} from "./routes/network.js";
import { registerPackRoutes } from "./routes/packs.js";
import { registerSandboxRoutes } from "./routes/sandboxes.js";
import { registerSnapshotDiffRoutes } from "./routes/snapshot-diff.js";
import { registerSnapshotRoutes } from "./routes/snapshots.js";
import { registerStatusRoutes } from "./routes/status.js";
import { registerTemplateAliasRoutes } from "./routes/template-aliases.js";
import { registerWorkspaceRoutes } from "./routes/workspaces.js";
import { newSocketCsrf, screenSocketBrowser } from "./socket-browser.js";
import { typeboxValidatorCompiler } from "./validation.js";

/**
 * JSON bodies: eval code (up to 1 MiB of characters) is the largest legitimate one. Larger stdin goes through
 * exec/stream, larger files through the files route (its own limit).
 */
export const MAX_JSON_BODY_BYTES = 2 * 1024 * 1024;

/**
 * Time a client gets to send a whole request (headers and body; responses may take longer): a client trickling
 * bytes would otherwise hold a socket and its buffers for ever. Long enough for the largest upload (the files
 * route's limit) over a slow link.
 */
export const REQUEST_TIMEOUT_MS = 120_000;
/** Time a client gets to send the request headers. */
export const HEADERS_TIMEOUT_MS = 20_000;
/** Connections one listener holds at once; more are refused by the kernel's accept path (Node closes them). */
export const DEFAULT_MAX_CONNECTIONS = 1024;

export type { ApiContext, DaemonServices } from "./context.js";

export interface ApiOptions {
  services: DaemonServices;
  /** Where snapshots live on the host (reported as SnapshotInfo.dir). */
  snapshotsDir: string;
  /** Host directories named in error messages that callers get redacted (default: FORKD_HOME from snapshotsDir). */
  hostPaths?: readonly HostPathRedaction[];
  /** "unix": caller = peer uid, no token; "tcp": tokens required when configured; "inject": tests, docs. */
  transport: "unix" | "tcp" | "inject";
  /** Bearer tokens; on TCP every route but /healthz requires one of them when the list is non-empty. */
  tokens?: readonly Token[];
  /**
   * Every token of the daemon, whichever listener takes them (default `tokens`): removed from requests the
   * port proxy passes on to a sandbox, so a client's daemon credential never reaches a guest.
   */
  daemonTokens?: readonly Token[];
  /**
   * TCP only: the names this listener answers to (see origin-policy.ts). The port is read from the bound
   * server, so a listener on port 0 gets its real one.
   */
  origin?: { bindHost: string; allowedHosts?: readonly string[]; allowedOrigins?: readonly string[] };
  /** Connections held at once (default DEFAULT_MAX_CONNECTIONS). */
  maxConnections?: number;
  /** Connections per tenant, shared by the daemon's listeners (default: a budget of this listener's own). */
  connections?: ConnectionBudget;
  /** Time to receive the request headers (default HEADERS_TIMEOUT_MS; tests shorten it). */
  headersTimeoutMs?: number;
  metrics?: DaemonMetrics;
  audit?: AuditLog;
  logger?: Logger;
  https?: { key: Buffer; cert: Buffer };
  /** The E2B API's settings (see src/e2b). */
  e2b?: E2bSettings;
  /** Surfaces of layers above the API mounted on this listener (the web console); see extensions.ts. */
  extensions?: readonly ApiExtension[];
  /**
   * TCP only: the front every request must come through (front.ts; a node daemon's cluster gateway). Its
   * credential is checked before the Host/Origin policy, which the front has applied to the caller already.
   */
  front?: TrustedFront;
}

declare module "fastify" {
  interface FastifyInstance {
    /** The E2B control plane's routes, for its OpenAPI document (src/e2b/control/openapi.ts). */
    e2bControlRoutes: RouteOptions[];
    /** Every route this listener serves, as registered (see registeredRoutes). */
    allRoutes: RouteOptions[];
  }
  interface FastifyRequest {
    /** Who made the request, for the audit log. */
    caller: string;
    /** Sandbox ids / snapshot tags the request touched beyond its path parameters (e.g. spawned ids). */
    auditIds: string[];
  }
}

const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;
const MUTATING_METHODS = new Set(["POST", "PUT", "DELETE", "PATCH"]);

export async function buildApi(options: ApiOptions): Promise<FastifyInstance> {
  const app = Fastify(fastifyOptionsFor(options)) as unknown as FastifyInstance;
  const metrics = options.metrics ?? createMetrics(options.services, { version: FORKD_VERSION });
  // First of all hooks: every route reaches the services only as its caller's view (servicesOf), and every
  // spawn through a view is timed for /metrics, whichever face asks for it (forkd, E2B).
  provideServices(app, options.services, metrics.spawns, options.connections ?? new ConnectionBudget());
  recordRoutes(app);
  installRequestHandling(app, options);

  const extensions = options.extensions ?? [];
  const listener: ListenerInfo = {
    transport: options.transport,
    tls: options.https !== undefined,
    tokens: options.transport === "tcp" ? (options.tokens ?? []) : [],
    snapshotsDir: options.snapshotsDir,
    socketCsrf: options.transport === "unix" ? newSocketCsrf() : "",
  };
  const checkOrigin = originCheckFor(app, options);
  app.addHook("onRequest", async (request, reply) => {
    reply.header("x-request-id", request.id);
    request.caller = `${options.transport}:${request.ip}`;
    const admitted = admitThroughFront(options.front, request.raw);
    if (admitted) {
      request.viaFront = true;
      request.principal = admitted.principal;
      request.caller = admitted.caller;
    } else checkOrigin(request.headers);
    checkPortProxied(request.headers, request.routeOptions.url);
    if (listener.transport === "unix") screenSocketBrowser(request, listener.socketCsrf);
    for (const extension of extensions) extension.screen?.(request, listener);
    request.caller = await identifyCaller(request, options, extensions, listener);
  });
  app.addHook("onResponse", async (request, reply) => recordResponse(request, reply, metrics, options.audit));

  await app.register(swagger, OPENAPI_OPTIONS);
  const daemonTokens = options.daemonTokens ?? options.tokens ?? [];
  const context: ApiContext = { snapshotsDir: options.snapshotsDir, metrics, daemonTokens };
  await registerForkdRoutes(app, context);
  for (const extension of extensions) await extension.register(app, listener);
  const e2b = await registerE2b(app, {
    services: options.services,
    tokens: listener.tokens,
    daemonTokens,
    ...options.e2b,
  });
  app.decorate("e2bControlRoutes", e2b.controlRoutes);
  installUpgrades(app, options, { context, extensions, listener, checkOrigin, e2bUpgrade: e2b.upgrade });
  return app;
}

/** Every route the listener registers, kept for registeredRoutes. */
function recordRoutes(app: FastifyInstance): void {
  const routes: RouteOptions[] = [];
  app.decorate("allRoutes", routes);
  app.addHook("onRoute", (route) => {
    routes.push(route);
  });
}

/** Connection bounds, routing, validation, errors, the JSON parser and the request decorations. */
function installRequestHandling(app: FastifyInstance, options: ApiOptions): void {
  app.server.maxConnections = options.maxConnections ?? DEFAULT_MAX_CONNECTIONS;
  // E2B requests addressed to a sandbox match only the E2B data plane's routes (src/e2b/routing.ts).
  app.addConstraintStrategy(surfaceConstraint);
  app.setValidatorCompiler<TSchema>(typeboxValidatorCompiler);
  app.setErrorHandler(
    errorHandlerFor(options.hostPaths ?? [{ dir: path.dirname(options.snapshotsDir), name: "$FORKD_HOME" }]),
  );
  app.setNotFoundHandler(notFoundHandler);
  installJsonParser(app);
  app.decorateRequest("caller", "");
  app.decorateRequest("auditIds", {
    getter(this: FastifyRequest & { _auditIds?: string[] }) {
      this._auditIds ??= [];
      return this._auditIds;
    },
  });
}

/**
 * WebSocket upgrades never reach a route (nor the onRequest hook): the same Host/Origin check first (and on the
 * socket its browser rule, socket-browser.ts), then the routing every request gets: addressed to a sandbox, E2B's data plane and its rules; otherwise the forkd port
 * route, with the listener's authentication.
 */
function installUpgrades(
  app: FastifyInstance,
  options: ApiOptions,
  wiring: {
    context: ApiContext;
    extensions: readonly ApiExtension[];
    listener: ListenerInfo;
    checkOrigin: (headers: IncomingHttpHeaders) => void;
    e2bUpgrade: (req: IncomingMessage, socket: Socket, head: Buffer) => boolean;
  },
): void {
  const { context, extensions, listener, checkOrigin, e2bUpgrade } = wiring;
  // The front's admission of an upgrade, for the port route's principal below.
  const frontUpgrades = new WeakMap<IncomingMessage, FrontAdmission>();
  const forkdUpgrade = portUpgradeHandler(context, async (req) => {
    const admitted = frontUpgrades.get(req);
    if (admitted) return admitted.principal;
    if (options.transport === "tcp" && options.tokens && options.tokens.length > 0) {
      return principalOf(authenticate(req.headers.authorization, options.tokens));
    }
    return ADMIN;
  });
  app.server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    socket.on("error", () => {});
    try {
      const admitted = admitThroughFront(options.front, req);
      if (admitted) frontUpgrades.set(req, admitted);
      else checkOrigin(req.headers);
      if (listener.transport === "unix") {
        screenSocketBrowser(
          { method: "GET", url: req.url ?? "", headers: req.headers },
          listener.socketCsrf,
          {
            upgrade: true,
          },
        );
      }
    } catch (err) {
      refuseUpgrade(socket, err);
      return;
    }
    // What `forkd port` proxies is for the port route only (refused there when it is not).
    if (req.headers[PORT_PROXY_HEADER] !== undefined) {
      forkdUpgrade(req, socket, head);
      return;
    }
    // An extension's upgrade (the console's terminals) authenticates its own.
    for (const extension of extensions) {
      if (extension.upgrade?.(req, socket, head, listener)) return;
    }
    if (!e2bUpgrade(req, socket, head)) forkdUpgrade(req, socket, head);
  });
}

/** The forkd API's own routes (v0.5's included), each module with the route context and no services. */
async function registerForkdRoutes(app: FastifyInstance, context: ApiContext): Promise<void> {
  registerStatusRoutes(app, context);
  registerSnapshotRoutes(app, context);
  registerSnapshotDiffRoutes(app, context);
  registerSandboxRoutes(app, context);
  registerTemplateAliasRoutes(app);
  registerWorkspaceRoutes(app);
  registerHostRoutes(app);
  await app.register(async (scope) => registerExecStreamRoute(scope, context));
  await app.register(async (scope) => registerFileRoutes(scope));
  await app.register(async (scope) => registerPackRoutes(scope));
  registerNetworkRoutes(app);
  await app.register(async (scope) => registerPortProxyRoutes(scope, context));
}

/** Fastify's options for one listener: request ids, timeouts, body and parameter bounds, logging, TLS. */
function fastifyOptionsFor(options: ApiOptions) {
  const headersTimeout = options.headersTimeoutMs ?? HEADERS_TIMEOUT_MS;
  // Node checks these timeouts on an interval (30 s by default): check often enough to honour them.
  const serverTimeouts = {
    headersTimeout,
    requestTimeout: Math.max(REQUEST_TIMEOUT_MS, headersTimeout),
    connectionsCheckingInterval: Math.min(1000, headersTimeout),
  };
  const fastifyOptions: FastifyServerOptions & {
    https?: { key: Buffer; cert: Buffer } & typeof serverTimeouts;
    http?: typeof serverTimeouts;
  } = {
    bodyLimit: MAX_JSON_BODY_BYTES,
    genReqId: (req: IncomingMessage) => {
      const header = req.headers["x-request-id"];
      return typeof header === "string" && REQUEST_ID_PATTERN.test(header) ? header : randomUUID();
    },
    return503OnClosing: true,
    forceCloseConnections: "idle",
    // Idle keep-alive sockets would otherwise pin a client's connection slot for 72 s.
    keepAliveTimeout: 5_000,
    requestTimeout: serverTimeouts.requestTimeout,
    http: serverTimeouts,
    // Params longer than the router's default (100) would get its own 414 body; the schemas bound them instead
    // (ids 128, tags 64) and answer 400 naming the field.
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 1024 },
    // One debug line per request (below) instead of Fastify's two info lines; mutations are in the audit log.
    logController: new LogController({ disableRequestLogging: true }),
    ...(options.logger ? { loggerInstance: options.logger } : { logger: false }),
  };
  if (options.https) fastifyOptions.https = { ...options.https, ...serverTimeouts };
  return fastifyOptions;
}

/**
 * The listener's Host/Origin check, run before authentication (a rebinding page must learn nothing, not even
 * whether it needs a token) on every request and upgrade.
 */
function originCheckFor(app: FastifyInstance, options: ApiOptions): (headers: IncomingHttpHeaders) => void {
  const originPolicy = lazyOriginPolicy(app, options.origin);
  const scheme = options.https ? "https" : "http";
  return (headers) => {
    const policy = originPolicy();
    if (!policy) return;
    checkHostAndOrigin(policy, headers, scheme);
    // A page served from a sandbox's port is the guest's content: it may call sandboxes, never the daemon.
    if (sandboxAddressOf(headers) === null && isSandboxOrigin(headers.origin)) {
      throw new ForkdError(
        "forbidden",
        `cross-origin request from a sandbox's page (${JSON.stringify(String(headers.origin).slice(0, 200))}) ` +
          "refused: sandbox pages reach sandboxes only, never the daemon's API",
      );
    }
  };
}

/** After each response: the debug line, the request and error counters, and (for mutations) the audit log. */
function recordResponse(
  request: FastifyRequest,
  reply: FastifyReply,
  metrics: DaemonMetrics,
  audit: AuditLog | undefined,
): void {
  const route = request.routeOptions.url ?? "unmatched";
  const status = reply.statusCode;
  request.log.debug(
    {
      method: request.method,
      url: redactUrl(request.url),
      status,
      ms: Math.round(reply.elapsedTime),
      caller: request.caller,
    },
    "request",
  );
  metrics.httpRequests.inc({ method: request.method, route, status: String(status) });
  if (status >= 400) {
    metrics.httpErrors.inc({ method: request.method, route, code: errorCodeOf(reply) });
  }
  if (!audit || !MUTATING_METHODS.has(request.method)) return;
  const params = (request.params ?? {}) as { id?: string; tag?: string };
  const ids = [params.id, params.tag, ...request.auditIds].filter(
    (v, i, all): v is string => typeof v === "string" && all.indexOf(v) === i,
  );
  audit.write({
    time: new Date().toISOString(),
    request_id: request.id,
    caller: request.caller || "unknown",
    method: request.method,
    url: redactUrl(request.url),
    status,
    latency_ms: Math.round(reply.elapsedTime * 100) / 100,
    ids,
  });
}

/** The forkd API's OpenAPI document (docs/openapi.json); E2B's routes are in their own (hidden here). */
const OPENAPI_OPTIONS = {
  // The E2B API has its own document (docs/e2b-openapi.json, src/e2b/control/openapi.ts).
  hiddenTag: E2B_ROUTE_TAG,
  openapi: {
    openapi: "3.0.3",
    info: {
      title: "forkd daemon API",
      version: FORKD_VERSION,
      description:
        "REST API of the forkd daemon (compatible with forkd v0.5's /v1 routes). Errors are " +
        '{"error": "...", "code": "..."}. See docs/api.md.',
    },
    components: {
      securitySchemes: { bearer: { type: "http" as const, scheme: "bearer" } },
    },
    security: [{ bearer: [] }],
    tags: [
      { name: "status", description: "Health, version, metrics" },
      { name: "snapshots", description: "Warm parent VMs children fork from" },
      { name: "sandboxes", description: "Child VMs" },
      { name: "files", description: "Files inside a sandbox" },
      { name: "network", description: "Egress policies and the port proxy" },
      {
        name: "workspaces",
        description: "forkd v0.5's workspaces: sandboxes suspended and resumed by name",
      },
    ],
  },
};

/** One route a listener serves: its method, URL pattern, and the E2B data-plane surface it answers on. */
export interface RegisteredRoute {
  method: string;
  url: string;
  /** envd, interpreter or port: a route only requests addressed to a sandbox reach (src/e2b/routing.ts). */
  surface: string | undefined;
  /** Its request schemas as declared (params, querystring, body: JSON Schema), if any. */
  schema: unknown;
}

/**
 * Every route `app` serves (forkd, v0.5, E2B's control and data planes, the extensions'), one per method, as
 * Fastify registered them: for what must cover all of them (the tenancy test walks every one).
 */
export function registeredRoutes(app: FastifyInstance): RegisteredRoute[] {
  return app.allRoutes.flatMap((route) =>
    [route.method].flat().map((method) => ({
      method,
      url: route.url,
      // Read now, not at registration: the E2B surfaces' own onRoute hooks set it after this listener's.
      surface: (route.constraints as Record<string, string> | undefined)?.[SURFACE_CONSTRAINT],
      schema: route.schema,
    })),
  );
}

/**
 * JSON parsing: Fastify's parser (prototype-poisoning safe) except that an empty body counts as no body. forkd
 * v0.5's CLI POSTs `ping` with `Content-Type: application/json` and an empty body.
 */
function installJsonParser(app: FastifyInstance): void {
  const parseSafely = app.getDefaultJsonParser("error", "error");
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (request, body, done) => {
    const text = body.toString();
    if (text.trim() === "") {
      done(null, undefined);
      return;
    }
    // Parsed once plainly for a message that says where the syntax error is (Fastify's parser does not say).
    try {
      JSON.parse(text);
    } catch (err) {
      done(new ForkdError("invalid_argument", `malformed JSON body: ${(err as Error).message}`), undefined);
      return;
    }
    parseSafely(request, text, (err, value) => {
      if (err) {
        done(
          new ForkdError(
            "invalid_argument",
            "JSON body contains a forbidden __proto__ or constructor.prototype key",
          ),
          undefined,
        );
      } else done(null, value);
    });
  });
}

/** The listener's origin policy, built on the first request (when the bound port is known). */
function lazyOriginPolicy(
  app: FastifyInstance,
  origin: ApiOptions["origin"],
): () => OriginPolicy | undefined {
  let policy: OriginPolicy | undefined;
  return () => {
    if (origin === undefined) return undefined;
    if (policy === undefined) {
      const address = app.server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      policy = originPolicyFor(origin.bindHost, port, {
        hosts: origin.allowedHosts,
        origins: origin.allowedOrigins,
      });
    }
    return policy;
  };
}

const callerBySocket = new WeakMap<Socket, Promise<string>>();

/**
 * Names the caller (for the audit log) and sets the request's principal: a tenant's token acts for its tenant;
 * an admin token, the Unix socket (root or the socket's group), a listener without tokens and a console session
 * (the console logs in admin tokens only) act as admin. E2B routes authenticate their own callers (src/e2b) and
 * set the principal themselves.
 */
async function identifyCaller(
  request: FastifyRequest,
  options: ApiOptions,
  extensions: readonly ApiExtension[],
  listener: ListenerInfo,
): Promise<string> {
  if (options.transport === "unix") {
    request.principal = ADMIN;
    const socket = request.raw.socket;
    let caller = callerBySocket.get(socket);
    if (!caller) {
      caller = peerCredentials(socket).then((c) => (c ? `uid:${c.uid}` : "unix"));
      callerBySocket.set(socket, caller);
    }
    return caller;
  }
  // The front authenticated the caller and named its principal (onRequest).
  if (request.viaFront) return request.caller;
  const address = `${options.transport}:${request.ip}`;
  // E2B routes check their own credentials (an API key, or a sandbox's access token).
  if (request.routeOptions.config.e2b) return address;
  if (options.transport === "tcp" && options.tokens && options.tokens.length > 0) {
    if (request.url === "/healthz" || request.url === "/healthz/") return address;
    // Named before the check so a rejected request is audited with where it came from.
    request.caller = address;
    if (request.headers.authorization === undefined) {
      for (const extension of extensions) {
        const caller = extension.identify?.(request, listener);
        if (caller !== undefined) {
          // A console session acts for the admin token it logged in with; the console's public routes (its
          // page, login) get no principal, so they can reach no service.
          if (caller.startsWith(CONSOLE_SESSION_CALLER)) request.principal = ADMIN;
          return caller;
        }
      }
    }
    const token = authenticate(request.headers.authorization, options.tokens);
    request.principal = principalOf(token);
    return token.id;
  }
  request.principal = ADMIN;
  return address;
}

/**
 * The front's admission of a request (a ForkdError when it is refused), or undefined on a listener without a
 * front and for the probes' /healthz.
 */
function admitThroughFront(
  front: TrustedFront | undefined,
  req: IncomingMessage,
): FrontAdmission | undefined {
  if (front === undefined || isProbe(req.url)) return undefined;
  return front.admit(req);
}

/** The catalogue code of an error reply, for the errors-by-route counter (the body is already serialized). */
function errorCodeOf(reply: { statusCode: number }): string {
  return toHttpError({ statusCode: reply.statusCode, message: "" }).code;
}
