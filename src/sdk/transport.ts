/**
 * HTTP to the daemon over a Unix socket or TCP (node:http/https; fetch cannot speak to a Unix socket).
 * Buffered exchanges for JSON and file bodies, open responses for streams. Every failure becomes a
 * ForkdSdkError; a dropped connection is followed by a health check so the error says whether the daemon is up.
 */
import http, { type IncomingHttpHeaders, type IncomingMessage } from "node:http";
import https from "node:https";
import { HEALTH_CHECK_TIMEOUT_MS, MAX_RESPONSE_BYTES } from "../common/limits.js";
import { CallScope } from "./call-scope.js";
import { ConnectionError, errorFromResponse, ForkdSdkError, PayloadTooLargeError } from "./errors.js";
import type { ResolvedSettings } from "./settings.js";
import { SDK_VERSION } from "./version.js";

export type HttpMethod = "GET" | "POST" | "PUT" | "DELETE" | "PATCH";

export interface HttpRequest {
  method: HttpMethod;
  /** Path below the daemon's base, already percent-encoded where needed (see `pathOf`). */
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  /** Sent as application/json. */
  json?: unknown;
  /** Sent as is (with `contentType`, default application/octet-stream). */
  body?: Buffer | Uint8Array | string;
  /** Sent chunked as it is produced (with `contentType`); such a request is never re-sent. */
  bodyStream?: AsyncIterable<Buffer>;
  contentType?: string;
  accept?: string;
  /** Largest response body accepted into memory. */
  maxResponseBytes?: number;
  /**
   * Deadline of the whole exchange instead of `requestTimeoutMs` (0 = none), for calls that wait on guest
   * work; `deadlineSetting` is the option named when it fires.
   */
  deadlineMs?: number;
  deadlineSetting?: string;
  /** How the request is named when its deadline fires (default "METHOD /path"). */
  deadlineWhat?: string;
}

export interface HttpResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** Errors that mean nothing answered at the address: the daemon is not reachable there. */
const UNREACHABLE_CODES = new Set([
  "ENOENT",
  "ECONNREFUSED",
  "EACCES",
  "EPERM",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ETIMEDOUT",
  "ENOTSOCK",
]);
/** Errors on a reused keep-alive socket that the daemon had already closed: safe to send again once. */
const STALE_SOCKET_CODES = new Set(["ECONNRESET", "EPIPE"]);

/** Builds a path from literal segments and values, percent-encoding each value. */
export function pathOf(strings: TemplateStringsArray, ...values: string[]): string {
  return strings.reduce(
    (out, literal, i) => out + literal + (i < values.length ? encodeURIComponent(values[i] as string) : ""),
    "",
  );
}

export function describeRequest(request: Pick<HttpRequest, "method" | "path">): string {
  return `${request.method} ${request.path.split("?")[0]}`;
}

/**
 * Sends `request` and buffers the answer. Non-2xx answers throw the error class of their status family.
 * `scope` carries the caller's signal and deadlines; the request timeout is added here.
 */
export async function exchange(
  settings: ResolvedSettings,
  request: HttpRequest,
  scope: CallScope,
): Promise<HttpResponse> {
  const clearDeadline = scope.deadline(
    request.deadlineMs ?? settings.requestTimeoutMs,
    request.deadlineSetting ?? "requestTimeoutMs",
    request.deadlineWhat ?? describeRequest(request),
  );
  try {
    const response = await open(settings, request, scope);
    const body = await readBody(
      response,
      request.maxResponseBytes ?? MAX_RESPONSE_BYTES,
      settings,
      request,
      scope,
    );
    const status = response.statusCode ?? 0;
    if (status < 200 || status > 299) throw responseError(settings, request, response, body);
    return { status, headers: response.headers, body };
  } finally {
    clearDeadline();
  }
}

/** Sends `request` and returns the open response once its headers arrived; non-2xx answers throw. */
export async function openStream(
  settings: ResolvedSettings,
  request: HttpRequest,
  scope: CallScope,
): Promise<IncomingMessage> {
  const response = await open(settings, request, scope);
  const status = response.statusCode ?? 0;
  if (status < 200 || status > 299) {
    const body = await readBody(response, 64 * 1024, settings, request, scope);
    throw responseError(settings, request, response, body);
  }
  return response;
}

function responseError(
  settings: ResolvedSettings,
  request: HttpRequest,
  response: IncomingMessage,
  body: Buffer,
) {
  const retryAfter = response.headers["retry-after"];
  return errorFromResponse(response.statusCode ?? 0, body, {
    request: describeRequest(request),
    retryAfter: Array.isArray(retryAfter) ? retryAfter[0] : retryAfter,
    tokenSource: settings.token === undefined ? undefined : settings.tokenSource,
    daemon: settings.address.display,
  });
}

/** Opens the request; retries once when a reused keep-alive socket turns out to have been closed. */
async function open(
  settings: ResolvedSettings,
  request: HttpRequest,
  scope: CallScope,
): Promise<IncomingMessage> {
  scope.throwIfAborted();
  try {
    return await openOnce(settings, request, scope);
  } catch (err) {
    if (err instanceof StaleSocketError) return openOnce(settings, request, scope, true);
    throw err;
  }
}

class StaleSocketError extends Error {}

function openOnce(
  settings: ResolvedSettings,
  request: HttpRequest,
  scope: CallScope,
  isRetry = false,
): Promise<IncomingMessage> {
  const payload = encodeBody(request);
  const headers: Record<string, string> = {
    "user-agent": `forkd-sdk-ts/${SDK_VERSION}`,
    accept: request.accept ?? "application/json",
    ...settings.headers,
  };
  if (settings.token !== undefined) headers.authorization = `Bearer ${settings.token}`;
  if (payload !== undefined) {
    headers["content-type"] = payload.contentType;
    headers["content-length"] = String(payload.bytes.length);
  } else if (request.bodyStream !== undefined) {
    headers["content-type"] = request.contentType ?? "application/octet-stream";
  }
  const address = settings.address;
  const path = withQuery(request.path, request.query);
  const options: https.RequestOptions =
    address.kind === "unix"
      ? { socketPath: address.socketPath, path, method: request.method, headers }
      : {
          hostname: address.hostname,
          port: address.port,
          path: address.basePath + path,
          method: request.method,
          headers,
          ...(address.protocol === "https:" && settings.ca !== undefined ? { ca: settings.ca } : {}),
        };
  const client = address.kind === "tcp" && address.protocol === "https:" ? https : http;

  return new Promise<IncomingMessage>((resolve, reject) => {
    const req = client.request(options);
    const onAbort = () => req.destroy();
    scope.signal.addEventListener("abort", onAbort, { once: true });
    const detach = () => scope.signal.removeEventListener("abort", onAbort);
    req.on("response", (response) => {
      // The response's own lifetime is governed by the consumer; keep aborting it with the scope.
      detach();
      const onLateAbort = () => response.destroy();
      scope.signal.addEventListener("abort", onLateAbort, { once: true });
      response.once("close", () => scope.signal.removeEventListener("abort", onLateAbort));
      resolve(response);
    });
    req.on("error", (err: NodeJS.ErrnoException) => {
      detach();
      if (scope.signal.aborted) return reject(scope.reason);
      const replayable = request.bodyStream === undefined;
      if (!isRetry && replayable && req.reusedSocket && STALE_SOCKET_CODES.has(err.code ?? "")) {
        return reject(new StaleSocketError(err.message));
      }
      connectionFailure(settings, request, err).then(reject, reject);
    });
    if (payload !== undefined) req.end(payload.bytes);
    else if (request.bodyStream !== undefined) void pump(request.bodyStream, req, scope);
    else req.end();
  });
}

/**
 * Writes a streamed body with back-pressure. The answer may start before the body ends (a command's output
 * while its stdin still flows). If the producer throws, the call aborts with the producer's error.
 */
async function pump(body: AsyncIterable<Buffer>, req: http.ClientRequest, scope: CallScope): Promise<void> {
  try {
    for await (const chunk of body) {
      if (req.destroyed || scope.signal.aborted) return;
      if (!req.write(chunk)) {
        await new Promise<void>((resolve) => {
          const done = () => {
            req.off("drain", done);
            req.off("close", done);
            resolve();
          };
          req.on("drain", done);
          req.on("close", done);
        });
      }
    }
    if (!req.destroyed) req.end();
  } catch (err) {
    scope.abort(err);
  }
}

function encodeBody(request: HttpRequest): { bytes: Buffer; contentType: string } | undefined {
  if (request.json !== undefined) {
    return { bytes: Buffer.from(JSON.stringify(request.json), "utf8"), contentType: "application/json" };
  }
  if (request.body !== undefined) {
    const bytes =
      typeof request.body === "string" ? Buffer.from(request.body, "utf8") : Buffer.from(request.body);
    return { bytes, contentType: request.contentType ?? "application/octet-stream" };
  }
  return undefined;
}

function withQuery(path: string, query: HttpRequest["query"]): string {
  if (query === undefined) return path;
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) if (value !== undefined) params.set(key, String(value));
  const text = params.toString();
  return text === "" ? path : `${path}${path.includes("?") ? "&" : "?"}${text}`;
}

async function readBody(
  response: IncomingMessage,
  maxBytes: number,
  settings: ResolvedSettings,
  request: HttpRequest,
  scope: CallScope,
): Promise<Buffer> {
  const declared = Number(response.headers["content-length"]);
  if (Number.isFinite(declared) && declared > maxBytes) {
    response.destroy();
    throw new PayloadTooLargeError(
      `the daemon's answer to ${describeRequest(request)} is ${declared} bytes, more than the ${maxBytes} this call accepts`,
    );
  }
  const chunks: Buffer[] = [];
  let total = 0;
  try {
    for await (const chunk of response as AsyncIterable<Buffer>) {
      total += chunk.length;
      if (total > maxBytes) {
        response.destroy();
        throw new PayloadTooLargeError(
          `the daemon's answer to ${describeRequest(request)} passed the ${maxBytes} bytes this call accepts`,
        );
      }
      chunks.push(chunk);
    }
  } catch (err) {
    if (err instanceof ForkdSdkError) throw err;
    throw await streamFailure(settings, request, scope, err);
  }
  if (!response.complete)
    throw await streamFailure(settings, request, scope, new Error("response ended early"));
  return Buffer.concat(chunks, total);
}

/** The error for a stream that broke: the scope's reason if it was aborted, else a dropped connection. */
export async function streamFailure(
  settings: ResolvedSettings,
  request: Pick<HttpRequest, "method" | "path">,
  scope: CallScope,
  err: unknown,
): Promise<unknown> {
  if (scope.signal.aborted) return scope.reason;
  if (err instanceof ForkdSdkError) return err;
  return connectionFailure(settings, request, err as NodeJS.ErrnoException, true);
}

/** Names what went wrong reaching the daemon and what to change; probes /healthz when a connection dropped. */
async function connectionFailure(
  settings: ResolvedSettings,
  request: Pick<HttpRequest, "method" | "path">,
  err: NodeJS.ErrnoException,
  afterResponse = false,
): Promise<ConnectionError> {
  const daemon = settings.address.display;
  const code = err.code;
  const what = describeRequest(request);
  if (!afterResponse && code !== undefined && UNREACHABLE_CODES.has(code)) {
    return new ConnectionError(`${unreachableReason(settings, code)} (${what})`, {
      request: what,
      daemonReachable: false,
      requestSent: false,
      syscallCode: code,
      cause: err,
    });
  }
  if (!afterResponse && code !== undefined && /CERT|SSL|TLS|SELF_SIGNED|UNABLE_TO_VERIFY/.test(code)) {
    return new ConnectionError(
      `TLS with the daemon at ${daemon} failed (${code}: ${err.message}); if it uses a private CA, pass the CA ` +
        "certificate with the `ca` option",
      { request: what, daemonReachable: undefined, requestSent: false, syscallCode: code, cause: err },
    );
  }
  const reachable = await isDaemonReachable(settings);
  const state = reachable
    ? "the daemon is still up (its /healthz answers), so the request itself was cut"
    : `the daemon at ${daemon} is unreachable now (stopped, crashed or restarting?)`;
  return new ConnectionError(
    `the connection to the daemon dropped during ${what} (${err.message}); ${state}`,
    {
      request: what,
      daemonReachable: reachable,
      requestSent: true,
      syscallCode: code,
      cause: err,
    },
  );
}

function unreachableReason(settings: ResolvedSettings, code: string): string {
  const address = settings.address;
  const from = `from ${settings.addressSource}`;
  const change = "set FORKD_URL or the `url` option to the daemon's address";
  if (address.kind === "unix") {
    switch (code) {
      case "ENOENT":
        return `no forkd daemon socket at ${address.socketPath} (${from}): is \`forkd daemon\` running? If it listens elsewhere, ${change}`;
      case "ECONNREFUSED":
        return `nothing accepts connections on ${address.socketPath} (${from}): the daemon that made it is gone; start \`forkd daemon\` or ${change}`;
      case "EACCES":
      case "EPERM":
        return `permission denied on the daemon socket ${address.socketPath} (${from}): run as root or as a member of the socket's group`;
      default:
        return `cannot connect to ${address.socketPath} (${from}): ${code}; ${change}`;
    }
  }
  switch (code) {
    case "ECONNREFUSED":
      return `nothing listens at ${address.display} (${from}): is \`forkd daemon --bind ...\` running? Otherwise ${change}`;
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return `cannot resolve the host of ${address.display} (${from}); ${change}`;
    default:
      return `cannot reach the daemon at ${address.display} (${from}): ${code}; ${change}`;
  }
}

/** GET /healthz with a short deadline: true if the daemon answers 200. Never throws. */
export async function isDaemonReachable(settings: ResolvedSettings): Promise<boolean> {
  const scope = new CallScope();
  scope.deadline(HEALTH_CHECK_TIMEOUT_MS, "healthCheck", "GET /healthz");
  try {
    const response = await openOnce(settings, { method: "GET", path: "/healthz" }, scope, true);
    response.resume();
    return response.statusCode === 200;
  } catch {
    return false;
  } finally {
    scope.dispose();
  }
}
