/**
 * The MCP Streamable HTTP transport, served by node:http: one MCP session per client (`Mcp-Session-Id`), each with
 * its own server (tools, outputs, background commands). Every request needs `Authorization: Bearer <token>`; the
 * listener is on loopback unless told otherwise, and then Host and Origin must name the loopback address (a web
 * page cannot reach it through DNS rebinding). The token file must be the process's own and unreadable to other
 * users (as the daemon's token file).
 */
import { createHash, randomUUID, timingSafeEqual } from "node:crypto";
import { readFile, stat } from "node:fs/promises";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { MIN_TOKEN_BYTES } from "../common/limits.js";
import type { Controller } from "../sdk/index.js";
import { createMcpSession, type ForkdMcpSession } from "./server.js";

/** The path MCP clients post to. */
export const MCP_PATH = "/mcp";
/** Largest JSON-RPC request body accepted. */
export const MAX_BODY_BYTES = 4 * 1024 * 1024;
/** Sessions alive at once; an initialize beyond this is refused until one ends. */
export const MAX_SESSIONS = 64;
/** A session nobody used for this long is closed (its background commands stopped). */
export const SESSION_IDLE_MS = 30 * 60_000;

export interface HttpOptions {
  host: string;
  port: number;
  /** Accepted bearer tokens (at least one). */
  tokens: string[];
  controller: Controller;
  log?: (line: string) => void;
}

export interface RunningHttp {
  url: string;
  close(): Promise<void>;
}

interface Session {
  transport: StreamableHTTPServerTransport;
  mcp: ForkdMcpSession;
  lastUsed: number;
  /** The digest of the token that opened it: a session is used only with that token. */
  token: Buffer;
}

/**
 * Who an MCP session acts as: the client its tools call the daemon (or the cluster gateway) through, for the
 * bearer token the caller presented, or undefined when the token is not accepted.
 */
export type SessionClients = (token: string) => Controller | undefined;

/**
 * Where sessions are when a listener is one of several serving the same clients (the cluster gateway's
 * replicas): `newId` names a session this listener opens, and `elsewhere` serves a request for a session this
 * listener does not hold (by relaying it to the one that does), answering true, or answers false when no other
 * listener holds it either (the request then gets the transport's 404 and the client initializes again).
 */
export interface SessionRouting {
  newId(): string;
  elsewhere(sessionId: string, request: IncomingMessage, response: ServerResponse): Promise<boolean>;
}

export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** Tokens from a file: one per line, `#` comments; each at least MIN_TOKEN_BYTES without whitespace. */
export async function loadTokens(file: string): Promise<string[]> {
  const info = await stat(file).catch((err: NodeJS.ErrnoException) => {
    throw new Error(`cannot read the MCP token file ${file}: ${err.code ?? err.message}`);
  });
  // Anyone who can read or replace the file holds (or chooses) every credential of the listener.
  const uid = process.getuid?.();
  if (uid !== undefined && info.uid !== uid) {
    throw new Error(
      `the MCP token file ${file} is owned by uid ${info.uid}, not by this process's (uid ${uid}): chown it`,
    );
  }
  if ((info.mode & 0o077) !== 0) {
    throw new Error(
      `the MCP token file ${file} is open to other users (mode ${(info.mode & 0o777).toString(8)}): chmod 600 it`,
    );
  }
  const text = await readFile(file, "utf8").catch((err: NodeJS.ErrnoException) => {
    throw new Error(`cannot read the MCP token file ${file}: ${err.code ?? err.message}`);
  });
  const tokens = text
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"));
  for (const token of tokens) checkToken(token, file);
  if (tokens.length === 0) throw new Error(`the MCP token file ${file} holds no token`);
  return tokens;
}

export function checkToken(token: string, source: string): void {
  if (token.length < MIN_TOKEN_BYTES || /\s/.test(token)) {
    throw new Error(
      `a token from ${source} is shorter than ${MIN_TOKEN_BYTES} characters or contains whitespace`,
    );
  }
}

export async function serveHttp(options: HttpOptions): Promise<RunningHttp> {
  if (options.tokens.length === 0) throw new Error("the MCP HTTP transport needs a token");
  for (const token of options.tokens) checkToken(token, "the token option");
  const log = options.log ?? (() => {});
  const digests = options.tokens.map(digest);
  const listener = new McpListener(
    (token) => (matches(digests, digest(token)) ? options.controller : undefined),
    options.host,
    log,
  );
  const server = http.createServer((request, response) => {
    listener.handle(request, response).catch((err: unknown) => {
      log(`MCP request failed: ${err instanceof Error ? err.message : String(err)}`);
      if (!response.headersSent) jsonError(response, 500, "internal error");
      else response.destroy();
    });
  });
  server.headersTimeout = 30_000;
  server.requestTimeout = 0; // streamed responses (SSE) stay open; idle sessions are closed by the sweeper
  const sweeper = setInterval(() => listener.closeIdle(), 60_000);
  sweeper.unref();

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port, options.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const address = server.address();
  if (address !== null && typeof address === "object") listener.port = address.port;
  const shownHost = options.host.includes(":") ? `[${options.host}]` : options.host;
  return {
    url: `http://${shownHost}:${listener.port}${MCP_PATH}`,
    close: async () => {
      clearInterval(sweeper);
      await listener.closeAll();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * MCP sessions over the Streamable HTTP transport: the path and token checks, one session per client, each
 * acting through the client `clients` gives for the token that opened it. Served by `serveHttp` on a listener
 * of its own, and by the cluster gateway on its listener (src/gateway/mcp.ts).
 */
export class McpListener {
  private readonly sessions = new Map<string, Session>();
  private readonly loopback: boolean;
  /** The bound port (0 until listening tells the real one). */
  port = 0;

  /** `host`: the listener's bind address; on loopback, Host and Origin must name it. Undefined: not checked. */
  constructor(
    private readonly clients: SessionClients,
    private readonly host: string | undefined,
    private readonly log: (line: string) => void,
    private readonly routing?: SessionRouting,
  ) {
    this.loopback = host !== undefined && isLoopback(host);
  }

  async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const url = new URL(request.url ?? "/", "http://mcp.invalid");
    if (url.pathname !== MCP_PATH)
      return jsonError(response, 404, `no such path; MCP is served at ${MCP_PATH}`);
    if (!this.allowedHost(request))
      return jsonError(response, 403, "Host/Origin must name the loopback address");
    const token = bearerToken(request);
    const controller = token === undefined ? undefined : this.clients(token);
    if (token === undefined || controller === undefined) {
      response.setHeader("WWW-Authenticate", 'Bearer realm="forkd-mcp"');
      return jsonError(response, 401, "missing or invalid bearer token (Authorization: Bearer <token>)");
    }
    const sessionId = headerValue(request.headers["mcp-session-id"]);
    const existing = sessionId === undefined ? undefined : this.sessions.get(sessionId);
    if (existing && !timingSafeEqual(existing.token, digest(token))) {
      return jsonError(response, 404, UNKNOWN_SESSION);
    }
    if (existing) {
      existing.lastUsed = Date.now();
      const body = request.method === "POST" ? await readJson(request, response) : undefined;
      if (body === REFUSED) return;
      await existing.transport.handleRequest(request, response, body);
      return;
    }
    if (sessionId !== undefined) {
      if (await this.routing?.elsewhere(sessionId, request, response)) return;
      return jsonError(response, 404, UNKNOWN_SESSION);
    }
    await this.open(request, response, controller, digest(token));
  }

  /** Closes sessions nobody used for SESSION_IDLE_MS (their background commands stop). */
  closeIdle(): void {
    const now = Date.now();
    for (const [id, session] of this.sessions) {
      if (now - session.lastUsed > SESSION_IDLE_MS)
        void session.transport.close().catch(() => this.sessions.delete(id));
    }
  }

  async closeAll(): Promise<void> {
    const open = [...this.sessions.values()];
    this.sessions.clear();
    await Promise.all(
      open.map(async (s) => {
        await s.transport.close().catch(() => {});
        await s.mcp.close().catch(() => {});
      }),
    );
  }

  /** A request without a session: an initialize opens one (within MAX_SESSIONS); anything else is refused. */
  private async open(
    request: IncomingMessage,
    response: ServerResponse,
    controller: Controller,
    token: Buffer,
  ): Promise<void> {
    if (request.method !== "POST")
      return jsonError(response, 400, "no session: send an initialize request first");
    const body = await readJson(request, response);
    if (body === REFUSED) return;
    if (!isInitializeRequest(body))
      return jsonError(response, 400, "no session: send an initialize request first");
    if (this.sessions.size >= MAX_SESSIONS)
      return jsonError(response, 503, `${MAX_SESSIONS} MCP sessions are open; retry later`);
    const mcp = createMcpSession(controller);
    const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => this.routing?.newId() ?? randomUUID(),
      onsessioninitialized: (id) => {
        this.sessions.set(id, { transport, mcp, lastUsed: Date.now(), token });
        this.log(`MCP session ${id} opened`);
      },
    });
    transport.onclose = () => {
      const id = transport.sessionId;
      if (id !== undefined && this.sessions.delete(id)) {
        this.log(`MCP session ${id} closed`);
        void mcp.close();
      }
    };
    await mcp.server.connect(transport);
    await transport.handleRequest(request, response, body);
  }

  private allowedHost(request: IncomingMessage): boolean {
    if (!this.loopback) return true;
    const port = this.port;
    const names = [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`, `${this.host}:${port}`];
    const origin = request.headers.origin;
    const originOk = origin === undefined || names.some((n) => origin === `http://${n}`);
    return names.includes(request.headers.host ?? "") && originOk;
  }
}

const REFUSED = Symbol("refused");

/** What a request for a session nobody holds gets (with 404, which tells MCP clients to initialize again). */
export const UNKNOWN_SESSION = "unknown or expired MCP session; initialize again";

/** The request's JSON body, or REFUSED after answering 400/413 itself. */
async function readJson(
  request: IncomingMessage,
  response: ServerResponse,
): Promise<unknown | typeof REFUSED> {
  const parts: Buffer[] = [];
  let size = 0;
  for await (const chunk of request as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) {
      jsonError(response, 413, `request body over ${MAX_BODY_BYTES} bytes`);
      request.destroy();
      return REFUSED;
    }
    parts.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(parts).toString("utf8"));
  } catch {
    jsonError(response, 400, "the body is not JSON");
    return REFUSED;
  }
}

export function jsonError(response: ServerResponse, status: number, message: string): void {
  response.writeHead(status, { "content-type": "application/json" });
  response.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

function bearerToken(request: IncomingMessage): string | undefined {
  const match = /^Bearer ([^\s]+)$/.exec(request.headers.authorization ?? "");
  return match?.[1];
}

/** Whether `presented` is one of `digests`: every one compared, in constant time, whatever matched first. */
function matches(digests: readonly Buffer[], presented: Buffer): boolean {
  return digests.map((d) => timingSafeEqual(d, presented)).includes(true);
}

function digest(token: string): Buffer {
  return createHash("sha256").update(token).digest();
}
