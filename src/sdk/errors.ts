/**
 * Every error the SDK throws is a ForkdSdkError: one subclass per HTTP status family the daemon answers with,
 * TimeoutError for deadlines on either side, ConnectionError when the daemon cannot be reached or the connection
 * drops, and CommandExitError for a command that exited non-zero. Messages say which setting to change.
 * (A call cancelled through its own AbortSignal rejects with the signal's reason instead, like fetch.)
 */

export interface ErrorContext {
  /**
   * HTTP status the daemon answered with, if it answered with an error. Undefined for an error the daemon reported
   * inside a stream it had answered 200 (an exec's `{"type":"error"}` line): then `code` says what failed.
   */
  status?: number;
  /** The request that failed, e.g. "POST /v1/sandboxes". */
  request?: string;
  /** The daemon's own message (`{"error": "..."}`), if any. */
  serverMessage?: string;
  /** The daemon's error code (e.g. "not_found"), if its body carried one. */
  code?: string;
  cause?: unknown;
}

export class ForkdSdkError extends Error {
  readonly status: number | undefined;
  readonly request: string | undefined;
  readonly serverMessage: string | undefined;
  readonly code: string | undefined;

  constructor(message: string, context: ErrorContext = {}) {
    super(message, context.cause === undefined ? undefined : { cause: context.cause });
    this.name = new.target.name;
    this.status = context.status;
    this.request = context.request;
    this.serverMessage = context.serverMessage;
    this.code = context.code;
  }
}

/** 400 (and 422): the daemon rejected the request's content; or the SDK rejected an argument before sending. */
export class InvalidArgumentError extends ForkdSdkError {}

/** 401: missing or wrong token; 403: the listener refused the request's Host or Origin. */
export class AuthenticationError extends ForkdSdkError {}

/** 404: no such sandbox, snapshot, file or route. */
export class NotFoundError extends ForkdSdkError {}

/** The sandbox itself is gone: killed, or its lifetime (`timeoutMs`) ran out. */
export class SandboxNotFoundError extends NotFoundError {}

/** 409: the resource is in a state that forbids the call (tag exists, snapshot not bootable, in use...). */
export class ConflictError extends ForkdSdkError {}

/** 413: the request body is larger than the daemon accepts. */
export class PayloadTooLargeError extends ForkdSdkError {}

/** 429: admission control refused the call for now. */
export class RateLimitError extends ForkdSdkError {
  /** From the daemon's Retry-After header, if it sent one. */
  readonly retryAfterMs: number | undefined;
  constructor(message: string, context: ErrorContext & { retryAfterMs?: number } = {}) {
    super(message, context);
    this.retryAfterMs = context.retryAfterMs;
  }
}

/** 500: the daemon failed internally. */
export class ServerError extends ForkdSdkError {}

/** 501: the daemon does not implement this (yet), or a feature flag asked for something not built. */
export class NotImplementedError extends ForkdSdkError {}

/** 502/503: the daemon (or a sandbox) cannot serve the call now. */
export class UnavailableError extends ForkdSdkError {
  readonly retryAfterMs: number | undefined;
  constructor(message: string, context: ErrorContext & { retryAfterMs?: number } = {}) {
    super(message, context);
    this.retryAfterMs = context.retryAfterMs;
  }
}

/**
 * The daemon could not be reached, or the connection dropped before the answer was complete.
 * `daemonReachable` says what a follow-up health check found: false = the daemon is down or not at that
 * address; true = the daemon is up (so the request itself was cut); undefined = not checked.
 */
export class ConnectionError extends UnavailableError {
  readonly daemonReachable: boolean | undefined;
  /**
   * Whether the request had left for the daemon: false when no connection could be made (nothing listens, the
   * socket refuses this user, TLS failed), so the daemon did nothing; true when a made connection dropped, so the
   * daemon may have served it.
   */
  readonly requestSent: boolean;
  /** The system error code (ECONNREFUSED, ENOENT, EACCES, ECONNRESET, ...), if any. */
  readonly syscallCode: string | undefined;
  constructor(
    message: string,
    context: ErrorContext & { daemonReachable?: boolean; requestSent?: boolean; syscallCode?: string } = {},
  ) {
    super(message, context);
    this.daemonReachable = context.daemonReachable;
    this.requestSent = context.requestSent ?? true;
    this.syscallCode = context.syscallCode;
  }
}

/**
 * A deadline passed: the SDK's `requestTimeoutMs` or a command's `timeoutMs` (client side), or the daemon's
 * own (504). `setting` names the option that sets the deadline that fired.
 */
export class TimeoutError extends ForkdSdkError {
  readonly setting: string | undefined;
  constructor(message: string, context: ErrorContext & { setting?: string } = {}) {
    super(message, context);
    this.setting = context.setting;
  }
}

export interface CommandResult {
  /** 0 on success; 128+N when the process was killed by signal N. */
  exitCode: number;
  stdout: string;
  stderr: string;
  /** Signal that killed the process (e.g. "SIGKILL"), if any. */
  signal?: string | null;
  /** The command was killed because it ran past its `timeoutMs`. */
  timedOut?: boolean;
}

/** Thrown by `sandbox.commands.run` when the command exits non-zero (or is killed); carries its output. */
export class CommandExitError extends ForkdSdkError implements CommandResult {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  readonly signal: string | null;
  readonly timedOut: boolean;

  constructor(result: CommandResult, command: string) {
    const how = result.timedOut
      ? "was killed after running past its timeoutMs (pass a larger `timeoutMs`, 0 disables)"
      : result.signal
        ? `was killed by ${result.signal} (exit code ${result.exitCode})`
        : `exited with code ${result.exitCode}`;
    const tail = lastLine(result.stderr);
    super(`command ${command} ${how}${tail ? `: ${tail}` : ""}`);
    this.exitCode = result.exitCode;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
    this.signal = result.signal ?? null;
    this.timedOut = result.timedOut ?? false;
  }
}

/** Maps a non-2xx answer from the daemon to the error class of its status family. */
export function errorFromResponse(
  status: number,
  body: Buffer | string,
  context: {
    request: string;
    retryAfter?: string | undefined;
    tokenSource?: string;
    daemon?: string;
    /** The error came as a record of a stream, not as the answer's status (`status` is then its code's). */
    inStream?: boolean;
  },
): ForkdSdkError {
  const { message: serverMessage, code } = parseErrorBody(body);
  const shown = serverMessage || `HTTP ${status}`;
  const ctx: ErrorContext = {
    status: context.inStream ? undefined : status,
    request: context.request,
    serverMessage,
    code,
  };
  const where = context.inStream
    ? `(reported in the answer to ${context.request})`
    : `(HTTP ${status} from ${context.request})`;
  const retryAfterMs = parseRetryAfter(context.retryAfter);
  const retryHint = retryAfterMs === undefined ? "" : `; retry after ${retryAfterMs} ms`;
  switch (status) {
    case 400:
    case 415:
    case 422:
      return new InvalidArgumentError(`${shown} ${where}`, ctx);
    case 401:
    case 403: {
      if (code === "forbidden") {
        return new AuthenticationError(
          `${shown} ${where}; the daemon serves only the names it is configured for: connect with its own address ` +
            "or have it started with --allowed-host",
          ctx,
        );
      }
      const fix =
        context.tokenSource === undefined || context.tokenSource.startsWith("nothing")
          ? "no token was sent: set FORKD_TOKEN or the `token` option to the contents of the daemon's --token-file"
          : `the token from ${context.tokenSource} was refused: set it to the contents of the daemon's --token-file`;
      return new AuthenticationError(`${shown} ${where}; ${fix}`, ctx);
    }
    case 404:
      return new NotFoundError(`${shown} ${where}`, ctx);
    case 409:
      return new ConflictError(`${shown} ${where}`, ctx);
    case 413:
      return new PayloadTooLargeError(
        `${shown} ${where}; the request or its answer is larger than the daemon moves in one call: send less per call`,
        ctx,
      );
    case 429:
      return new RateLimitError(`${shown} ${where}${retryHint}`, { ...ctx, retryAfterMs });
    case 501:
      return new NotImplementedError(`${shown} ${where}; this daemon does not implement it yet`, ctx);
    case 502:
    case 503:
      return new UnavailableError(`${shown} ${where}${retryHint}`, { ...ctx, retryAfterMs });
    case 408:
    case 504:
      return new TimeoutError(`${shown} ${where}; the daemon's own deadline passed`, ctx);
    default:
      if (status >= 500) return new ServerError(`${shown} ${where}`, ctx);
      return new ForkdSdkError(`${shown} ${where}`, ctx);
  }
}

/** The daemon answers errors as `{"error": "..."}` (optionally with a `code`); anything else is shown as text. */
function parseErrorBody(body: Buffer | string): { message: string; code: string | undefined } {
  const text = (typeof body === "string" ? body : body.toString("utf8")).slice(0, 4096).trim();
  if (text === "") return { message: "", code: undefined };
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed !== null && typeof parsed === "object") {
      const record = parsed as Record<string, unknown>;
      const message =
        typeof record.error === "string"
          ? record.error
          : typeof record.message === "string"
            ? record.message
            : "";
      const code = typeof record.code === "string" ? record.code : undefined;
      if (message !== "") return { message, code };
    }
  } catch {
    // not JSON: fall through and show the text
  }
  return { message: text.split("\n", 1)[0] ?? "", code: undefined };
}

/** Retry-After is either delay-seconds or an HTTP date. */
export function parseRetryAfter(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  const at = Date.parse(trimmed);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - Date.now());
}

function lastLine(text: string): string {
  const lines = text.trimEnd().split("\n");
  const line = lines[lines.length - 1] ?? "";
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
}
