/**
 * Any other port of a sandbox (`E2b-Sandbox-Port: 3000`, `3000-<id>.<domain>`): HTTP requests and WebSocket
 * upgrades proxied to that port in the guest through the controller's port proxy, as E2B's proxy does. E2B's
 * traffic rules: a sandbox created with `allowPublicTraffic: false` answers only requests carrying its own
 * traffic access token (E2B-Traffic-Access-Token; else 403), a public one (E2B's default) everyone who reaches
 * the listener. The token and any daemon credential are removed before the request reaches the guest. A
 * sandbox without a network the daemon can reach answers E2B's 502 naming why.
 */
import type http from "node:http";
import type net from "node:net";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ForkdError, invalidArgument } from "../common/errors.js";
import { stripCredentialsForGuest } from "../common/tokens.js";
import type { SandboxService } from "../controller/sandbox-service.js";
import { servicesOf, servicesOfUpgrade } from "../http/request-scope.js";
import type { E2bContext } from "./context.js";
import { SandboxUnreachable, sendE2bError, toE2bError } from "./errors.js";
import { sandboxAddressOf, surfaceOf } from "./routing.js";
import {
  autoResume,
  header,
  resolveSandbox,
  type SandboxSession,
  sandboxSession,
  TRAFFIC_TOKEN_HEADER,
} from "./session.js";

export async function registerPorts(scope: FastifyInstance, context: E2bContext): Promise<void> {
  scope.setErrorHandler((err, _request, reply) => sendE2bError(reply, err));
  // Bodies are not parsed: they stream to the guest as they arrive.
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser("*", (_request, _payload, done) => done(null, undefined));
  const proxy = async (request: FastifyRequest, reply: FastifyReply) => {
    const session = resolveSandbox(request, context);
    const { sandboxes } = servicesOf(request);
    admit(request.raw.headers, context, sandboxes, session);
    reply.hijack();
    const res = reply.raw;
    const failure = await sandboxes
      .proxyHttp(session.sandboxId, session.port, request.raw, res)
      .catch((err: unknown) => toE2bError(err).message);
    if (failure === null) return;
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const body = JSON.stringify({ code: 502, message: failure });
    res.writeHead(502, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  };
  scope.all("/", proxy);
  scope.all("/*", proxy);
}

/**
 * The upgrade side (Node hands upgrades to the server, not to routes): true when `req` is addressed to a
 * sandbox, and then answered here (proxied, or refused with E2B's error body); false for any other request.
 */
export function upgradeToSandboxPort(
  context: E2bContext,
): (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => boolean {
  return (req, socket, head) => {
    const address = sandboxAddressOf(req.headers);
    if (address === null) return false;
    socket.on("error", () => {});
    void (async () => {
      try {
        if (surfaceOf(address.port) !== "port") {
          throw new ForkdError(
            "not_found",
            `port ${address.port} is the daemon's own envd or code interpreter, which take no upgrades`,
          );
        }
        // A paused autoResume sandbox wakes for an upgrade carrying its token, as for any data-plane request.
        await autoResume(req, context);
        if (socket.destroyed) return;
        const session = sandboxSession(req.headers, context);
        const { sandboxes } = servicesOfUpgrade(req, session.principal);
        admit(req.headers, context, sandboxes, session);
        sandboxes.proxyUpgrade(session.sandboxId, session.port, req, socket, head);
      } catch (err) {
        const { code, message } = toE2bError(err);
        const body = JSON.stringify({ code, message });
        socket.end(
          `HTTP/1.1 ${code} ${code === 403 ? "Forbidden" : "Error"}\r\ncontent-type: application/json\r\n` +
            `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
        );
      }
    })();
    return true;
  };
}

/**
 * Whether the request may reach the sandbox's port: a valid port, a network the daemon can reach, and the
 * traffic token when the sandbox is not public. Then strips the credentials the guest must not see.
 */
function admit(
  headers: http.IncomingHttpHeaders,
  context: E2bContext,
  sandboxes: SandboxService,
  session: SandboxSession,
): void {
  const { sandboxId, port } = session;
  if (Number.isNaN(port)) {
    throw invalidArgument("the request names no sandbox port (E2b-Sandbox-Port: 1..65535)");
  }
  const info = sandboxes.get(sandboxId);
  if (info.network.kind !== "netns") {
    const status = sandboxes.networkStatus();
    const why =
      info.network.kind === "none"
        ? "its snapshot has no NIC (the template says network = none)"
        : status.mode === "isolated"
          ? `this daemon runs sandboxes without a network (${status.reason})`
          : 'it was spawned with network "none"';
    throw new SandboxUnreachable(
      `port ${port} of sandbox ${sandboxId} is not reachable: the sandbox has no network the daemon can reach (${why})`,
    );
  }
  // --e2b-private-traffic holds for every sandbox, the ones the forkd API spawned included.
  if (info.inbound.requireTrafficToken || context.privateTraffic === true) {
    const token = header(headers, TRAFFIC_TOKEN_HEADER);
    if (token === undefined || token === "") {
      throw new ForkdError(
        "forbidden",
        `sandbox ${sandboxId} does not allow public traffic: send its traffic access token as E2B-Traffic-Access-Token`,
      );
    }
    if (!sandboxes.verifyAccessToken(sandboxId, "traffic", token)) {
      throw new ForkdError("forbidden", `invalid traffic access token: it is not sandbox ${sandboxId}'s`);
    }
  }
  stripCredentialsForGuest(headers, context.daemonTokens ?? context.tokens);
}
