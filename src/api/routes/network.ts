/**
 * Sandbox networks: the daemon's network status, a running sandbox's egress policy, and the port proxy
 * (`/v1/sandboxes/:id/ports/:port/<path>`: HTTP requests and WebSocket upgrades to TCP port `port` in the
 * sandbox, streamed both ways). The proxied path is `<path>` plus the query string, exactly as the request
 * spelled them (never decoded or normalised); the bearer token that opened the route is not passed on to the
 * guest. A request marked by `forkd port` (PORT_PROXY_HEADER) is served by these routes only.
 */
import type http from "node:http";
import type net from "node:net";
import type { Static } from "@sinclair/typebox";
import type { FastifyInstance } from "fastify";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { SANDBOX_ID_PATTERN } from "../../common/limits.js";
import { assertSandboxId, unanchored } from "../../common/names.js";
import { PORT_PROXY_HEADER } from "../../common/proxied-path.js";
import { stripCredentialsForGuest } from "../../common/tokens.js";
import type { Principal } from "../../controller/tenancy/tenant-view.js";
import { servicesOf, servicesOfUpgrade } from "../../http/request-scope.js";
import type { ApiContext } from "../context.js";
import { toHttpError } from "../errors.js";
import {
  EgressPolicyWire,
  errorResponses,
  NetworkStatusWire,
  PortParams,
  SandboxInfoWire,
  SandboxParams,
} from "../schemas.js";
import { policyFromWire, sandboxToWire } from "../wire.js";

const PORT_ROUTE = new RegExp(
  `^/v1/sandboxes/(${unanchored(SANDBOX_ID_PATTERN)})/ports/(\\d{1,5})(/[^?#]*)?(\\?.*)?$`,
);
const PROXIED_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] as const;

export function registerNetworkRoutes(app: FastifyInstance): void {
  app.get(
    "/v1/network",
    {
      schema: {
        tags: ["network"],
        summary: "How this daemon networks its sandboxes",
        response: { 200: NetworkStatusWire, ...errorResponses },
      },
    },
    async (request) => servicesOf(request).sandboxes.networkStatus(),
  );

  app.put<{ Params: Static<typeof SandboxParams>; Body: Static<typeof EgressPolicyWire> }>(
    "/v1/sandboxes/:id/network",
    {
      schema: {
        tags: ["network"],
        summary: "Replace a running sandbox's egress policy",
        description:
          "Takes effect at once: new connections follow it, established ones are decided again at their next " +
          "packet, names resolve (or not) under it. 409 for a sandbox without a network of its own.",
        params: SandboxParams,
        body: EgressPolicyWire,
        response: { 200: SandboxInfoWire, ...errorResponses },
      },
    },
    async (request) =>
      sandboxToWire(
        await servicesOf(request).sandboxes.setNetworkPolicy(request.params.id, policyFromWire(request.body)),
      ),
  );
}

/** The port proxy's routes, as Fastify names them (src/console screens browsers' requests to them). */
export const PORT_ROUTES: readonly string[] = [
  "/v1/sandboxes/:id/ports/:port",
  "/v1/sandboxes/:id/ports/:port/*",
];

/**
 * Refuses a request `forkd port` proxied (it carries the operator's credential for whoever reached its local
 * listener) unless it is for the port route: `route` is the matched route pattern (undefined: none matched).
 */
export function checkPortProxied(headers: http.IncomingHttpHeaders, route: string | undefined): void {
  if (headers[PORT_PROXY_HEADER] === undefined) return;
  if (route !== undefined && PORT_ROUTES.includes(route)) return;
  throw new ForkdError(
    "forbidden",
    "a request proxied by `forkd port` reaches the sandbox's port route only, never another route of the daemon",
  );
}

/** The guest's path and query of a port route request, as the request spelled them. */
function guestTarget(url: string | undefined): string {
  const match = PORT_ROUTE.exec(url ?? "");
  if (!match) {
    throw invalidArgument(
      "the port route's path must be /v1/sandboxes/<id>/ports/<port>/<path> with the id and port spelled plainly",
    );
  }
  return `${match[3] ?? "/"}${match[4] ?? ""}`;
}

/**
 * The port proxy's HTTP side, in its own scope: bodies are not parsed (they stream to the guest as they come),
 * and the reply is handed over to the proxy.
 */
export async function registerPortProxyRoutes(app: FastifyInstance, context: ApiContext): Promise<void> {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", (_request, _payload, done) => done(null, undefined));
  for (const url of PORT_ROUTES) {
    app.route<{ Params: Static<typeof PortParams> }>({
      method: [...PROXIED_METHODS],
      url,
      schema: {
        tags: ["network"],
        summary: "Proxy an HTTP request (or a WebSocket upgrade) to a TCP port in the sandbox",
        description:
          "The rest of the path and the query string are what the guest's server sees. 502 when nothing answers on " +
          "the port; 409 for a sandbox without a network the daemon can reach.",
        params: PortParams,
        response: { ...errorResponses },
      },
      handler: async (request, reply) => {
        const { id, port } = request.params;
        // The router decoded the wildcard parameter (%2F, %3F): the guest gets the raw spelling instead.
        const target = guestTarget(request.raw.url);
        // Errors before this point (unknown sandbox, no network) still answer as JSON through Fastify.
        servicesOf(request).sandboxes.get(id);
        request.raw.url = target;
        stripCredentialsForGuest(request.raw.headers, context.daemonTokens);
        reply.hijack();
        const res = reply.raw;
        const failure = await servicesOf(request)
          .sandboxes.proxyHttp(id, port, request.raw, res)
          .catch((err: unknown) => err);
        if (failure === null) return;
        if (res.headersSent) {
          res.destroy();
          return;
        }
        // Nothing answered on the port (a string), or the sandbox could not be proxied to (an error).
        const { status, code, message } =
          typeof failure === "string"
            ? { status: 502, code: "unavailable", message: failure }
            : toHttpError(failure);
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: message, code }));
      },
    });
  }
}

/**
 * The port proxy's upgrade side (Node delivers upgrades to the server, not to routes). `authorize` runs the
 * listener's authentication on the request, throws when it fails, and says whom the request acts for.
 */
export function portUpgradeHandler(
  context: ApiContext,
  authorize: (req: http.IncomingMessage) => Promise<Principal>,
): (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => void {
  return (req, socket, head) => {
    const match = PORT_ROUTE.exec(req.url ?? "");
    if (!match) {
      if (req.headers[PORT_PROXY_HEADER] !== undefined) {
        refuseUpgrade(socket, new ForkdError("forbidden", "`forkd port` upgrades reach the port route only"));
      } else refuse(socket, 404, "not_found", `no upgrade route for ${req.url}`);
      return;
    }
    const [, id, portText, rest, query] = match as unknown as [string, string, string, string?, string?];
    authorize(req)
      .then((principal) => {
        assertSandboxId(id);
        req.url = `${rest ?? "/"}${query ?? ""}`;
        stripCredentialsForGuest(req.headers, context.daemonTokens);
        servicesOfUpgrade(req, principal).sandboxes.proxyUpgrade(id, Number(portText), req, socket, head);
      })
      .catch((err: unknown) => refuseUpgrade(socket, err));
  };
}

/** Answers an upgrade that is refused (forkd's error body) and closes the connection. */
export function refuseUpgrade(socket: net.Socket, err: unknown): void {
  const httpError = toHttpError(err);
  refuse(socket, httpError.status, httpError.code, httpError.message);
}

function refuse(socket: net.Socket, status: number, code: string, message: string): void {
  const body = JSON.stringify({ error: message, code });
  socket.end(
    `HTTP/1.1 ${status} ${status === 404 ? "Not Found" : "Error"}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}
