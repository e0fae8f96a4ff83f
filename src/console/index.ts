/**
 * The web console on the daemon's listeners (an API extension, src/api/extensions.ts): the page under /console/,
 * its session routes (login, logout, session), the live feed (server-sent events) and terminals (WebSocket).
 * It reads and acts only through the controller's service interfaces, and through the REST API from the page.
 */
import type http from "node:http";
import type net from "node:net";
import { type Static, Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply } from "fastify";
import { toHttpError } from "../api/errors.js";
import {
  type ApiExtension,
  type ApiExtensionFactory,
  CONSOLE_SESSION_CALLER,
  type ExtensionContext,
  type ListenerInfo,
} from "../api/extensions.js";
import { ForkdError } from "../common/errors.js";
import { matchToken } from "../common/tokens.js";
import { FORKD_VERSION } from "../common/version.js";
import { ADMIN } from "../controller/tenancy/tenant-view.js";
import { adminServicesOf, servicesOfUpgrade } from "../http/request-scope.js";
import { ConsoleAccess } from "./access.js";
import { ConsoleFeed, type FeedOptions } from "./feed.js";
import { HistoryRecorder } from "./history.js";
import { CONSOLE_API, CONSOLE_PATH, type ConsoleSession } from "./protocol.js";
import type { SessionLimits } from "./sessions.js";
import { CONSOLE_HEADERS, type ConsoleFiles, loadConsoleFiles } from "./static.js";
import { TerminalServer } from "./terminal.js";

export { CONSOLE_API, CONSOLE_PATH } from "./protocol.js";

export interface ConsoleOptions {
  /** The built front end (default dist/console of this package). */
  dir?: string;
  sessions?: SessionLimits;
  feed?: FeedOptions;
  history?: { intervalMs?: number; maxPoints?: number };
  maxTerminals?: number;
}

const LoginBody = Type.Object(
  {
    token: Type.String({ minLength: 1, maxLength: 4096, description: "A daemon token (from --token-file)." }),
  },
  { additionalProperties: false },
);

const TERMINAL_PATH = `${CONSOLE_API}/terminal`;

/** The console as an extension of the daemon's API (one per daemon; it registers on every listener). */
export function consoleExtension(options: ConsoleOptions = {}): ApiExtensionFactory {
  return (context) => new WebConsole(context, options);
}

class WebConsole implements ApiExtension {
  private readonly access: ConsoleAccess;
  private readonly history: HistoryRecorder;
  private readonly feed: ConsoleFeed;
  private readonly terminals: TerminalServer;
  private files: Promise<ConsoleFiles> | undefined;
  private readonly log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };

  constructor(
    private readonly context: ExtensionContext,
    private readonly options: ConsoleOptions,
  ) {
    const logger = context.logger?.child({ component: "console" });
    this.log = logger ?? { info: () => {}, warn: () => {} };
    this.access = new ConsoleAccess(options.sessions);
    this.history = new HistoryRecorder(context.services.sandboxes, options.history, this.log);
    this.history.start();
    this.feed = new ConsoleFeed(
      context.services,
      context.metrics,
      this.history,
      context.snapshotsDir,
      options.feed,
      this.log,
    );
    this.terminals = new TerminalServer(this.log, options.maxTerminals);
  }

  screen: ApiExtension["screen"] = (request, listener) => this.access.screen(request, listener);

  identify: ApiExtension["identify"] = (request, listener) => this.access.identify(request, listener);

  async register(app: FastifyInstance, listener: ListenerInfo): Promise<void> {
    this.files ??= loadConsoleFiles(this.options.dir);
    const files = await this.files;
    const streams = new Set<http.ServerResponse>();
    // Event streams never end by themselves: a listener that closes ends its own.
    app.addHook("preClose", async () => {
      for (const res of streams) res.end();
    });
    await app.register(async (scope) => {
      scope.addHook("onSend", async (_request, reply, payload) => {
        reply.headers(CONSOLE_HEADERS);
        return payload;
      });
      this.registerPage(scope, files);
      this.registerSessionRoutes(scope, listener);
      scope.get(
        `${CONSOLE_API}/events`,
        { config: { console: "session" }, schema: { hide: true } },
        async (request, reply) => {
          // The feed shows the whole daemon: an admin's view (a tenant's bearer token is refused here).
          adminServicesOf(request, "the console's event stream");
          if (this.feed.full) throw new ForkdError("unavailable", "too many console event streams are open");
          reply.hijack();
          const res = reply.raw;
          res.writeHead(200, {
            ...CONSOLE_HEADERS,
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-store",
            "x-request-id": request.id,
          });
          // A HEAD has no body to stream: Node would never send its headers, and the connection would hang.
          if (request.method === "HEAD") {
            res.end();
            return;
          }
          streams.add(res);
          await this.feed.subscribe(res);
          streams.delete(res);
        },
      );
    });
  }

  upgrade(req: http.IncomingMessage, socket: net.Socket, head: Buffer, listener: ListenerInfo): boolean {
    const pathname = (req.url ?? "").split("?")[0];
    if (pathname !== TERMINAL_PATH) return false;
    socket.on("error", () => {});
    try {
      const caller = this.access.authorizeUpgrade(
        { method: req.method ?? "GET", url: req.url ?? "", headers: req.headers },
        listener,
      );
      // authorizeUpgrade refused every caller but an admin: a terminal may open any sandbox.
      this.terminals.accept(req, socket, head, caller, servicesOfUpgrade(req, ADMIN).sandboxes);
    } catch (err) {
      refuse(socket, err);
    }
    return true;
  }

  async close(): Promise<void> {
    this.history.stop();
    await Promise.all([this.feed.close(), this.terminals.close()]);
  }

  private registerPage(scope: FastifyInstance, files: ConsoleFiles): void {
    const sendFile = (reply: FastifyReply, name: string, ifNoneMatch: string | undefined) => {
      const file = files.files.get(name);
      if (!file) {
        if (files.files.size === 0) {
          throw new ForkdError(
            "unavailable",
            "the console's front end is not built (npm run build writes dist/console)",
          );
        }
        throw new ForkdError("not_found", `no console file ${JSON.stringify(name.slice(0, 200))}`);
      }
      reply
        .header("etag", file.etag)
        .header("cache-control", file.immutable ? "public, max-age=31536000, immutable" : "no-cache");
      if (ifNoneMatch === file.etag) return reply.status(304).send();
      return reply.type(file.type).send(file.body);
    };
    // The router ignores a trailing slash: /console and /console/ are one route, the page.
    scope.get(
      CONSOLE_PATH,
      { config: { console: "public" }, schema: { hide: true } },
      async (request, reply) => sendFile(reply, "index.html", request.headers["if-none-match"]),
    );
    scope.get(
      `${CONSOLE_PATH}/*`,
      { config: { console: "public" }, schema: { hide: true } },
      async (request, reply) => {
        const name = (request.params as { "*": string })["*"] || "index.html";
        return sendFile(reply, name, request.headers["if-none-match"]);
      },
    );
  }

  private registerSessionRoutes(scope: FastifyInstance, listener: ListenerInfo): void {
    const needsLogin = listener.transport === "tcp" && listener.tokens.length > 0;
    const describe = (session: { csrf: string; expiresAtMs: number } | undefined): ConsoleSession => ({
      auth: needsLogin ? "login" : listener.transport === "unix" ? "socket" : "none",
      authenticated: needsLogin ? session !== undefined : true,
      csrf: needsLogin ? (session?.csrf ?? null) : listener.socketCsrf,
      expires_at_unix_ms: needsLogin ? (session?.expiresAtMs ?? null) : null,
      version: FORKD_VERSION,
      features: { pause: "pause" in this.context.services.sandboxes },
    });

    scope.get(
      `${CONSOLE_API}/session`,
      { config: { console: "public" }, schema: { hide: true } },
      async (request, reply) => {
        reply.header("cache-control", "no-store");
        return describe(needsLogin ? this.access.sessionOf(request.headers, listener) : undefined);
      },
    );

    scope.post<{ Body: Static<typeof LoginBody> }>(
      `${CONSOLE_API}/login`,
      { config: { console: "public" }, schema: { hide: true, body: LoginBody } },
      async (request, reply) => {
        if (!needsLogin) {
          throw new ForkdError(
            "conflict",
            "this listener has no login: the Unix socket's permissions decide who may use it",
          );
        }
        const token = matchToken(request.body.token, listener.tokens);
        if (!token) throw new ForkdError("unauthorized", "that is not one of the daemon's tokens");
        // The console shows the whole daemon (every sandbox, the host, terminals into any sandbox): an admin's.
        if (token.tenant !== null) {
          throw new ForkdError(
            "forbidden",
            "the console is for admin tokens: a tenant's token uses the API, the SDKs or the MCP server",
          );
        }
        this.access.sessions.remove(this.access.cookieValue(request.headers, listener));
        const { id, session } = this.access.sessions.create(token.id);
        request.caller = `${CONSOLE_SESSION_CALLER}${token.id}`;
        this.log.info({ caller: request.caller, ip: request.ip }, "console login");
        reply.header("set-cookie", this.access.setCookie(listener, id)).header("cache-control", "no-store");
        return describe(session);
      },
    );

    scope.post(
      `${CONSOLE_API}/logout`,
      { config: { console: "session" }, schema: { hide: true } },
      async (request, reply) => {
        if (needsLogin) {
          this.access.sessions.remove(this.access.cookieValue(request.headers, listener));
          reply.header("set-cookie", this.access.clearCookie(listener));
        }
        return reply.status(204).send();
      },
    );
  }
}

function refuse(socket: net.Socket, err: unknown): void {
  const { status, code, message } = toHttpError(err);
  const body = JSON.stringify({ error: message, code });
  socket.end(
    `HTTP/1.1 ${status} Error\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n` +
      `connection: close\r\n\r\n${body}`,
  );
}
