/**
 * The CLI's HTTP client for the daemon, over its Unix socket or TCP (node:http; fetch cannot use a Unix socket).
 * Non-2xx answers become ForkdErrors with the daemon's message and code; a daemon that cannot be reached becomes
 * one line that says what to do.
 */
import http, { type IncomingMessage } from "node:http";
import https from "node:https";
import type { Command } from "commander";
import { ERROR_CODES, type ErrorCode, ForkdError, invalidArgument } from "../common/errors.js";
import { DEFAULT_SOCKET_PATH } from "../common/limits.js";

export interface DaemonTarget {
  /** "unix:/run/forkd/forkd.sock", "http://127.0.0.1:8889", "https://host:8889". */
  url: string;
  token?: string;
}

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined>;
  json?: unknown;
  body?: Buffer;
  /** A streamed (chunked) request body, e.g. NDJSON stdin frames. */
  bodyStream?: AsyncIterable<Buffer | string>;
  contentType?: string;
  signal?: AbortSignal;
}

export interface DaemonResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** Daemon responses the CLI buffers are small (lists, results); files are bounded by the daemon at 16 MiB. */
const MAX_BUFFERED_RESPONSE_BYTES = 64 * 1024 * 1024;
const UNREACHABLE = new Set([
  "ENOENT",
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
]);
const CODES = new Set(Object.keys(ERROR_CODES));

/** `--daemon-url`/`--daemon-token` on a command (and on the program, for `forkd --daemon-url ... ls`). */
export function addDaemonOptions(command: Command): Command {
  return command
    .option("--daemon-url <url>", "daemon address: unix:/path or http(s)://host:port (env FORKD_URL)")
    .option(
      "--daemon-token <token>",
      "bearer token for a TCP daemon (prefer env FORKD_TOKEN: arguments are visible to other users)",
    );
}

/** Resolves the target: command line, then FORKD_URL / FORKD_TOKEN, then the default Unix socket. */
export function daemonTarget(command: Command, env: NodeJS.ProcessEnv = process.env): DaemonTarget {
  const opts = command.optsWithGlobals() as { daemonUrl?: string; daemonToken?: string };
  const url = opts.daemonUrl ?? env.FORKD_URL ?? `unix:${DEFAULT_SOCKET_PATH}`;
  const token = opts.daemonToken ?? env.FORKD_TOKEN;
  return token ? { url, token } : { url };
}

export class DaemonClient {
  private readonly transport: { socketPath: string } | { base: URL; secure: boolean };

  constructor(readonly target: DaemonTarget) {
    if (target.url.startsWith("unix:")) {
      const socketPath = target.url.slice("unix:".length).replace(/^\/\/(?=\/)/, "");
      if (!socketPath.startsWith("/")) {
        throw invalidArgument(`invalid daemon URL ${target.url}: expected unix:/absolute/path`);
      }
      this.transport = { socketPath };
    } else {
      let base: URL;
      try {
        base = new URL(target.url);
      } catch {
        throw invalidArgument(
          `invalid daemon URL ${JSON.stringify(target.url)}: expected unix:/path or http(s)://host:port`,
        );
      }
      if (base.protocol !== "http:" && base.protocol !== "https:") {
        throw invalidArgument(`invalid daemon URL ${target.url}: expected unix:/path or http(s)://host:port`);
      }
      this.transport = { base, secure: base.protocol === "https:" };
    }
  }

  /** Where the daemon is, for a client that proxies to it (`forkd port`): a socket path or a base URL, and the token. */
  get endpoint(): { socketPath: string } | { base: URL } {
    return "socketPath" in this.transport
      ? { socketPath: this.transport.socketPath }
      : { base: this.transport.base };
  }

  get token(): string | undefined {
    return this.target.token;
  }

  static from(command: Command): DaemonClient {
    return new DaemonClient(daemonTarget(command));
  }

  /** Sends a request and buffers the answer; throws a ForkdError for non-2xx. */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<DaemonResponse> {
    const response = await this.open(method, path, options);
    const body = await readBody(response, MAX_BUFFERED_RESPONSE_BYTES);
    const status = response.statusCode ?? 0;
    if (status < 200 || status >= 300) throw this.errorFrom(status, body);
    return { status, headers: response.headers, body };
  }

  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const { body } = await this.request(method, path, options);
    return (body.length === 0 ? null : JSON.parse(body.toString("utf8"))) as T;
  }

  /** Opens a request whose answer is read as a stream; a non-2xx answer is read and thrown. */
  async stream(method: string, path: string, options: RequestOptions = {}): Promise<IncomingMessage> {
    const response = await this.open(method, path, options);
    const status = response.statusCode ?? 0;
    if (status < 200 || status >= 300) throw this.errorFrom(status, await readBody(response, 1024 * 1024));
    return response;
  }

  /** True when a daemon answers /healthz; false when nothing listens there. Other failures are thrown. */
  async reachable(timeoutMs = 2000): Promise<boolean> {
    try {
      await this.request("GET", "/healthz", { signal: AbortSignal.timeout(timeoutMs) });
      return true;
    } catch (err) {
      if (err instanceof ForkdError && err.detail?.unreachable === true) return false;
      throw err;
    }
  }

  private open(method: string, path: string, options: RequestOptions): Promise<IncomingMessage> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (this.target.token) headers.authorization = `Bearer ${this.target.token}`;
    let payload: Buffer | undefined;
    if (options.json !== undefined) {
      payload = Buffer.from(JSON.stringify(options.json));
      headers["content-type"] = "application/json";
    } else if (options.body !== undefined) {
      payload = options.body;
      headers["content-type"] = options.contentType ?? "application/octet-stream";
    } else if (options.bodyStream !== undefined) {
      headers["content-type"] = options.contentType ?? "application/octet-stream";
    }
    if (payload !== undefined) headers["content-length"] = String(payload.length);
    const fullPath = path + queryString(options.query);
    const common = { method, headers, signal: options.signal };
    const request =
      "socketPath" in this.transport
        ? http.request({ ...common, socketPath: this.transport.socketPath, path: fullPath })
        : (this.transport.secure ? https : http).request(new URL(fullPath, this.transport.base), common);
    return new Promise<IncomingMessage>((resolve, reject) => {
      request.once("response", resolve);
      request.once("error", (err: NodeJS.ErrnoException) =>
        reject(this.connectionError(err, options.signal)),
      );
      if (options.bodyStream !== undefined) {
        pumpBody(request, options.bodyStream).catch((err: unknown) => request.destroy(err as Error));
      } else {
        request.end(payload);
      }
    });
  }

  private errorFrom(status: number, body: Buffer): ForkdError {
    let message = `HTTP ${status}`;
    let code: ErrorCode | undefined;
    try {
      const parsed = JSON.parse(body.toString("utf8")) as { error?: unknown; code?: unknown };
      if (typeof parsed.error === "string") message = parsed.error;
      if (typeof parsed.code === "string" && CODES.has(parsed.code)) code = parsed.code as ErrorCode;
    } catch {
      if (body.length > 0) message = `HTTP ${status}: ${body.toString("utf8").slice(0, 200)}`;
    }
    code ??= codeOfStatus(status);
    if (status === 401) {
      message += ` (daemon at ${this.target.url}: pass --daemon-token or set FORKD_TOKEN)`;
    }
    return new ForkdError(code, message, { detail: { status } });
  }

  private connectionError(err: NodeJS.ErrnoException, signal: AbortSignal | undefined): Error {
    if (signal?.aborted) {
      const reason: unknown = signal.reason;
      if (reason instanceof DOMException && reason.name === "TimeoutError") {
        return new ForkdError("timeout", `the forkd daemon at ${this.target.url} did not answer in time`, {
          detail: { unreachable: true },
        });
      }
      return reason instanceof Error ? reason : new ForkdError("unavailable", "cancelled");
    }
    const where = this.target.url;
    if (err.code !== undefined && UNREACHABLE.has(err.code)) {
      return new ForkdError(
        "unavailable",
        `cannot reach the forkd daemon at ${where}: is \`forkd daemon\` running?`,
        {
          detail: { unreachable: true },
          cause: err,
        },
      );
    }
    if (err.code === "EACCES" || err.code === "EPERM") {
      return new ForkdError(
        "unavailable",
        `permission denied on the forkd daemon socket ${where}: run as root or as a member of its group`,
        { cause: err },
      );
    }
    return new ForkdError("unavailable", `talking to the forkd daemon at ${where} failed: ${err.message}`, {
      cause: err,
    });
  }
}

function codeOfStatus(status: number): ErrorCode {
  for (const [code, s] of Object.entries(ERROR_CODES)) if (s === status) return code as ErrorCode;
  return status >= 500 ? "internal" : "invalid_argument";
}

function queryString(query: RequestOptions["query"]): string {
  if (!query) return "";
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) if (value !== undefined) params.set(key, String(value));
  const text = params.toString();
  return text === "" ? "" : `?${text}`;
}

async function pumpBody(request: http.ClientRequest, source: AsyncIterable<Buffer | string>): Promise<void> {
  for await (const chunk of source) {
    if (request.destroyed) return;
    if (!request.write(chunk)) await new Promise((resolve) => request.once("drain", resolve));
  }
  request.end();
}

async function readBody(response: IncomingMessage, maxBytes: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  let total = 0;
  for await (const chunk of response as AsyncIterable<Buffer>) {
    total += chunk.length;
    if (total > maxBytes) {
      response.destroy();
      throw new ForkdError("payload_too_large", `the daemon's answer is larger than ${maxBytes} bytes`);
    }
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

/** Percent-encodes each value into a path template: routePath`/v1/sandboxes/${id}`. */
export function routePath(strings: TemplateStringsArray, ...values: string[]): string {
  return strings.reduce(
    (out, s, i) => out + s + (i < values.length ? encodeURIComponent(values[i] as string) : ""),
    "",
  );
}
