/**
 * `forkd gateway`: the cluster's front door. Every request is first checked against the listener's Host/Origin
 * policy, then routed:
 *
 * - E2B's data plane (E2b-Sandbox-Id/-Port headers, or `<port>-<id>.<domain>` host names) and calls for one
 *   sandbox (/v1/sandboxes/<id>/..., /sandboxes/<id>/...) are relayed to that sandbox's node as they are
 *   (proxy.ts), after the caller is authenticated (the data plane is the node's to authenticate, by the
 *   sandbox's own tokens) and the sandbox located (locate.ts: "lost" and "unknown" answer at once);
 * - MCP (/mcp) is served here, its tools calling this gateway's own REST API with the caller's token;
 * - everything else is a route of the gateway's own (forkd-routes.ts, e2b-routes.ts) on Fastify.
 *
 * Nothing here holds state that a restart loses: the directory is rebuilt from the nodes' event streams.
 */
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import https from "node:https";
import type net from "node:net";
import Fastify, { type FastifyInstance, LogController } from "fastify";
import type { Logger } from "pino";
import { toHttpError } from "../api/errors.js";
import { isLoopbackHost, type TcpAddress } from "../api/listen.js";
import { checkHostAndOrigin, type OriginPolicy, originPolicyFor } from "../api/origin-policy.js";
import { typeboxValidatorCompiler } from "../api/validation.js";
import { errorMessage, ForkdError, invalidArgument } from "../common/errors.js";
import type { Token } from "../common/tokens.js";
import { toE2bError } from "../e2b/errors.js";
import { isSandboxOrigin, sandboxAddressOf } from "../e2b/routing.js";
import { loadKubeConfig } from "../kube/config.js";
import { Leases } from "../kube/leases.js";
import { forkdObjects } from "../kube/objects.js";
import { TenantAdmission } from "./admission.js";
import { type Caller, GatewayAuth } from "./auth.js";
import { type ClusterReads, ClusterView, kubeReads } from "./cluster-view.js";
import type { GatewayContext } from "./context.js";
import { Directory } from "./directory.js";
import { registerE2bRoutes } from "./e2b-routes.js";
import { registerForkdRoutes } from "./forkd-routes.js";
import { SandboxLocator } from "./locate.js";
import { GatewayMcp } from "./mcp.js";
import { advertisedUrl } from "./mcp-sessions.js";
import { NodeCaller } from "./node-calls.js";
import { NodeLinks } from "./node-links.js";
import { Placer } from "./placement.js";
import { NodeProxy } from "./proxy.js";
import { Spawner } from "./spawn.js";

export interface GatewayOptions {
  listen: TcpAddress;
  tls?: { key: Buffer; cert: Buffer };
  namespace: string;
  kubeconfig?: string;
  /**
   * Where the cluster's lists come from instead of the API server named by `kubeconfig` (the gateway's unit
   * tests: a stand-in at that boundary).
   */
  cluster?: ClusterReads;
  /** The cluster credential nodes take (the node token). */
  nodeToken: string;
  /** The admin token and users' tokens (with their tenants). */
  tokens: readonly Token[];
  e2bDomain?: string;
  allowedHosts?: string[];
  allowedOrigins?: string[];
  defaultSnapshot: string;
  tenantMaxSandboxes?: number;
  insecureRegistry?: boolean;
  perSandboxMiB?: number;
  /** Where the other replicas reach this one (its pod IP): MCP sessions then work through any replica. */
  advertiseAddress?: string;
  /** Every pause with memory made durable (docs/kubernetes.md, "The durable pause"): E2B's pauses too. */
  durablePause?: boolean;
  logger: Logger;
}

export interface RunningGateway {
  url: string;
  context: GatewayContext;
  stop(): Promise<void>;
}

type Surface = "forkd" | "e2b" | "data";

/** `/v1/sandboxes/<id>[/...]` and `/[v2/]sandboxes/<id>[/...]`: calls for one sandbox. */
const FORKD_SANDBOX = /^\/v1\/sandboxes\/(sb-[0-9a-f]{12})(?:\/([^?]*))?(?:\?.*)?$/;
/**
 * A sandbox's POST routes the gateway answers itself (forkd-routes.ts): fork (across nodes), branch (host paths),
 * pause (a durable one).
 */
const ANSWERED_HERE = new Set(["fork", "branch", "pause"]);
const E2B_SANDBOX = /^\/(v2\/)?sandboxes\/(sb-[0-9a-f]{12})(?:\/([^?]*))?(?:\?.*)?$/;

/** E2B's pause, answered here (e2b-routes.ts) under --durable-pause so that it can be made durable. */
const answeredHereE2b = (context: GatewayContext, method: string | undefined, call: RegExpExecArray) =>
  context.durablePause &&
  method === "POST" &&
  call[1] === undefined &&
  call[3]?.replace(/\/$/, "") === "pause";

export async function startGateway(options: GatewayOptions): Promise<RunningGateway> {
  const { logger } = options;
  const context = gatewayContext(options);
  const { view, links, proxy } = context;
  // Calls in flight to a node seen lost are cut: none waits on a dead link.
  view.onChange(() => {
    for (const node of view.allNodes()) {
      if (!node.leaseHeld && proxy.cut(node.name) > 0)
        logger.warn({ node: node.name }, "cut calls to a lost node");
    }
  });
  view.start();
  await view.ready;

  let ownUrl = "";
  const mcp = new GatewayMcp(context, () => ownUrl, peerUrlOf(options));
  const app = gatewayApp(context, mcp, options);
  await app.listen({ host: options.listen.host, port: options.listen.port });
  ownUrl = ownUrlOf(options, listeningPort(app, options));
  if (!options.tls && !isWildcard(options.listen.host) && !isLoopbackHost(options.listen.host)) {
    logger.warn("the gateway listens without TLS: tokens cross the network in clear text");
  }
  await links.settled(5_000);
  logger.info({ url: ownUrl, nodes: view.allNodes().length }, "forkd gateway listening");
  return {
    url: ownUrl,
    context,
    stop: async () => {
      view.stop();
      links.close();
      await mcp.close();
      proxy.close();
      await app.close();
    },
  };
}

/** The gateway's parts, wired: what it reads of the cluster, its directory, links, placement and relay. */
function gatewayContext(options: GatewayOptions): GatewayContext {
  const { logger } = options;
  const view = new ClusterView(options.cluster ?? clusterReadsOf(options), logger);
  const directory = new Directory((node, epoch) => view.isLost(node, epoch).lost);
  const links = new NodeLinks(view, options.nodeToken, directory, logger);
  const calls = new NodeCaller(links);
  const placer = new Placer(view, links, directory, calls, {
    perSandboxMiB: options.perSandboxMiB,
    insecureRegistry: options.insecureRegistry,
  });
  const admission = new TenantAdmission(directory, view, options.tenantMaxSandboxes);
  const proxy = new NodeProxy(options.tokens, (err) =>
    logger.debug({ err: errorMessage(err) }, "relay error"),
  );
  return {
    view,
    directory,
    links,
    calls,
    placer,
    locator: new SandboxLocator(view, links, directory, calls),
    admission,
    spawner: new Spawner(placer, calls, directory, admission, logger),
    proxy,
    auth: new GatewayAuth(options.tokens),
    nodeToken: options.nodeToken,
    registry: { insecure: options.insecureRegistry === true },
    defaultSnapshot: options.defaultSnapshot,
    durablePause: options.durablePause === true,
    logger,
  };
}

function clusterReadsOf(options: GatewayOptions): ClusterReads {
  const config = loadKubeConfig(options.kubeconfig);
  return kubeReads(forkdObjects(config, options.namespace), new Leases(config, options.namespace));
}

/** Fastify behind the gateway's own dispatch (relay, MCP) for requests and upgrades. */
function gatewayApp(context: GatewayContext, mcp: GatewayMcp, options: GatewayOptions): FastifyInstance {
  let policy: OriginPolicy | undefined;
  const scheme = options.tls ? "https" : "http";
  const policyOf = (port: number) => {
    policy ??= originPolicyFor(options.listen.host, port, {
      hosts: [...(options.allowedHosts ?? []), ...(options.e2bDomain ? [`*.${options.e2bDomain}`] : [])],
      origins: options.allowedOrigins,
    });
    return policy;
  };
  const port = () => listeningPort(app, options);
  const app = Fastify({
    logController: new LogController({ disableRequestLogging: true }),
    loggerInstance: options.logger,
    bodyLimit: 2 * 1024 * 1024,
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 1024 },
    serverFactory: (handler) => {
      const onRequest = (req: IncomingMessage, res: ServerResponse) =>
        void dispatch(context, mcp, req, res, () => handler(req, res), policyOf(port()), scheme);
      return options.tls ? https.createServer(options.tls, onRequest) : http.createServer(onRequest);
    },
  }) as unknown as FastifyInstance;
  configureApp(app, context);
  app.server.on(
    "upgrade",
    (req: IncomingMessage, socket: net.Socket, head: Buffer) =>
      void upgrade(context, req, socket, head, policyOf(port()), scheme),
  );
  return app;
}

function listeningPort(app: FastifyInstance, options: GatewayOptions): number {
  const address = app.server.address();
  return typeof address === "object" && address ? address.port : options.listen.port;
}

const isWildcard = (host: string) => host === "0.0.0.0" || host === "::";

/** The gateway's own address for its MCP sessions' calls: loopback when it listens everywhere. */
function ownUrlOf(options: GatewayOptions, port: number): string {
  const scheme = options.tls ? "https" : "http";
  const host = options.listen.host.includes(":") ? `[${options.listen.host}]` : options.listen.host;
  return `${scheme}://${isWildcard(options.listen.host) ? "127.0.0.1" : host}:${port}`;
}

/** Where peers reach this replica: its advertised address on its listener's scheme and (fixed) port. */
function peerUrlOf(options: GatewayOptions): string | undefined {
  if (options.advertiseAddress === undefined) return undefined;
  if (options.listen.port === 0) throw invalidArgument("an advertised address needs a fixed listen port");
  return advertisedUrl(options.advertiseAddress, options.listen.port, options.tls !== undefined);
}

function configureApp(app: FastifyInstance, context: GatewayContext): void {
  app.setValidatorCompiler(typeboxValidatorCompiler);
  app.decorateRequest("tenant", null);
  app.decorateRequest("callerId", "");
  app.addHook("onRequest", async (request) => {
    const surface = request.routeOptions.config.surface;
    if (surface === undefined || surface === "public") return;
    const caller: Caller =
      surface === "e2b" ? context.auth.apiKey(request.headers) : context.auth.bearer(request.headers);
    request.tenant = caller.tenant;
    request.callerId = caller.id;
  });
  app.setErrorHandler((err, request, reply) => {
    const surface = request.routeOptions.config?.surface === "e2b" ? "e2b" : "forkd";
    if (!(err instanceof ForkdError) || err.httpStatus >= 500) {
      request.log.warn({ err: errorMessage(err), url: request.url }, "gateway call failed");
    }
    sendIn(surface, reply.raw, err);
  });
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split("?")[0] as string;
    const surface = path.startsWith("/v1/") || path === "/v1" ? "forkd" : "e2b";
    sendIn(
      surface,
      reply.raw,
      new ForkdError("not_found", `no route ${request.method} ${path} on the cluster gateway`),
    );
  });
  registerForkdRoutes(app, context);
  registerE2bRoutes(app, context);
}

/** Routes one request (see the module comment); errors answer in the shape of the API the request is for. */
async function dispatch(
  context: GatewayContext,
  mcp: GatewayMcp,
  req: IncomingMessage,
  res: ServerResponse,
  toFastify: () => void,
  policy: OriginPolicy,
  scheme: "http" | "https",
): Promise<void> {
  let surface: Surface = "forkd";
  const arrived = performance.now();
  try {
    const url = req.url ?? "/";
    if (url === "/healthz" || url === "/healthz/") return toFastify();
    checkHostAndOrigin(policy, req.headers, scheme);
    const address = sandboxAddressOf(req.headers);
    if (address) {
      surface = "data";
      return await relay(context, { req, res, arrived }, surface, address.sandboxId, undefined);
    }
    if (isSandboxOrigin(req.headers.origin)) {
      throw new ForkdError("forbidden", "a sandbox's page may call sandboxes only, never the cluster's API");
    }
    if (mcp.handles(url)) return await mcp.handle(req, res);
    const forkdCall = FORKD_SANDBOX.exec(url);
    if (forkdCall && !(req.method === "POST" && ANSWERED_HERE.has(forkdCall[2] ?? ""))) {
      const caller = context.auth.bearer(req.headers);
      return await relay(context, { req, res, arrived }, surface, forkdCall[1] as string, caller.tenant);
    }
    const e2bCall = E2B_SANDBOX.exec(url);
    if (e2bCall && !answeredHereE2b(context, req.method, e2bCall)) {
      surface = "e2b";
      const caller = context.auth.apiKey(req.headers);
      return await relay(context, { req, res, arrived }, surface, e2bCall[2] as string, caller.tenant);
    }
    toFastify();
  } catch (err) {
    if (!(err instanceof ForkdError))
      context.logger.warn({ err: errorMessage(err) }, "gateway dispatch failed");
    if (!res.headersSent) sendIn(surface, res, err);
    else res.destroy();
  }
}

/** Relays a call for sandbox `id` to its node; `tenant` undefined: the data plane (any owner). */
async function relay(
  context: GatewayContext,
  call: { req: IncomingMessage; res: ServerResponse; arrived: number },
  surface: Surface,
  id: string,
  tenant: string | null | undefined,
): Promise<void> {
  const placement = await context.locator.locate(id, tenant);
  const node = context.view.node(placement.node);
  const epoch = context.calls.epochOf(placement.node);
  if (!node || epoch === undefined) {
    throw new ForkdError(
      "unavailable",
      `node ${placement.node} of sandbox ${id} is not reachable from this gateway`,
    );
  }
  const { req, res, arrived } = call;
  const target = {
    node: node.name,
    url: node.url,
    epoch,
    nodeToken: context.nodeToken,
    tenant: tenant ?? null,
  };
  const failed = await context.proxy.web(req, res, target, arrived);
  if (failed !== null && !res.headersSent) sendIn(surface, res, new ForkdError("unavailable", failed));
}

/** An HTTP upgrade: a data-plane WebSocket, or forkd's port route; anything else is refused. */
async function upgrade(
  context: GatewayContext,
  req: IncomingMessage,
  socket: net.Socket,
  head: Buffer,
  policy: OriginPolicy,
  scheme: "http" | "https",
): Promise<void> {
  socket.on("error", () => {});
  try {
    checkHostAndOrigin(policy, req.headers, scheme);
    const address = sandboxAddressOf(req.headers);
    let id: string;
    let tenant: string | null | undefined;
    if (address) {
      id = address.sandboxId;
      tenant = undefined;
    } else {
      const forkdCall = FORKD_SANDBOX.exec(req.url ?? "/");
      if (!forkdCall) throw new ForkdError("not_found", "no WebSocket route here");
      id = forkdCall[1] as string;
      tenant = context.auth.bearer(req.headers).tenant;
    }
    const placement = await context.locator.locate(id, tenant);
    const node = context.view.node(placement.node);
    const epoch = context.calls.epochOf(placement.node);
    if (!node || epoch === undefined)
      throw new ForkdError("unavailable", `node ${placement.node} is not reachable`);
    context.proxy.upgrade(req, socket, head, {
      node: node.name,
      url: node.url,
      epoch,
      nodeToken: context.nodeToken,
      tenant: tenant ?? null,
    });
  } catch (err) {
    const status = err instanceof ForkdError ? err.httpStatus : 500;
    const body = JSON.stringify({ error: errorMessage(err) });
    if (socket.writable) {
      socket.end(
        `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? "Error"}\r\ncontent-type: application/json\r\n` +
          `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    }
    socket.destroy();
  }
}

/** An error in the shape of the API the request was for: forkd's {error, code}, E2B's {code, message}. */
function sendIn(surface: Surface | "e2b", res: ServerResponse, err: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  // A sandbox being moved (locate.ts): HTTP's own hint of when to ask again, beside the body's.
  const retryAfter = err instanceof ForkdError ? err.detail?.retry_after_s : undefined;
  if (typeof retryAfter === "number") res.setHeader("retry-after", String(retryAfter));
  if (surface === "forkd") {
    const e = toHttpError(err);
    const detail = err instanceof ForkdError && err.detail ? { detail: err.detail } : {};
    res.writeHead(e.status, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: e.message, code: e.code, ...detail }));
    return;
  }
  // The data plane answers an unreachable sandbox 502, as E2B's proxy does (the SDK reads it as "gone").
  const body = toE2bError(err);
  const status = surface === "data" && (body.code === 404 || body.code === 503) ? 502 : body.code;
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ ...body, code: status }));
}
