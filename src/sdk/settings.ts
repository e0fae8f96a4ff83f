/**
 * Connection settings: where the daemon is, how to authenticate, how long to wait. Each setting resolves per
 * call → client → environment (FORKD_URL, FORKD_TOKEN) → default, and a bad value is reported with the name
 * of the place it came from, so the message says what to change.
 */
import {
  DAEMON_TOKEN_ENV,
  DAEMON_URL_ENV,
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_DAEMON_URL,
  DEFAULT_REQUEST_TIMEOUT_MS,
  SDK_SANDBOX_TIMEOUT_MS,
} from "../common/limits.js";
import { InvalidArgumentError } from "./errors.js";

// The defaults are forkd's table of limits (src/common/limits.ts), shared with the daemon and the Python SDK:
// DEFAULT_DAEMON_URL; DEFAULT_REQUEST_TIMEOUT_MS, one HTTP exchange with the daemon (distinct from a sandbox's
// lifetime and a command's timeout); DEFAULT_SANDBOX_TIMEOUT_MS, like the SDKs agents already use (a sandbox
// nobody extends dies after five minutes); DEFAULT_COMMAND_TIMEOUT_MS (a command that runs longer is killed in
// the guest; 0 disables).
export {
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_DAEMON_URL,
  DEFAULT_REQUEST_TIMEOUT_MS,
  SDK_SANDBOX_TIMEOUT_MS as DEFAULT_SANDBOX_TIMEOUT_MS,
};

export interface ConnectionOptions {
  /**
   * The daemon's address: `unix:/path/to/forkd.sock`, `http://host:port` or `https://host:port`.
   * @default FORKD_URL, then unix:/run/forkd/forkd.sock
   */
  url?: string;
  /**
   * Bearer token (the contents of the daemon's `--token-file`); needed over TCP.
   * @default FORKD_TOKEN
   */
  token?: string;
  /**
   * Longest wait for one HTTP exchange with the daemon, in ms; 0 disables. For a streamed command it bounds
   * the wait for the daemon to accept the command, not the command itself (that is `timeoutMs`).
   * @default 60_000
   */
  requestTimeoutMs?: number;
  /** Extra HTTP headers sent with every request. */
  headers?: Record<string, string>;
  /** Certificate authorities to trust for an `https://` daemon with a private CA (PEM). */
  ca?: string | Buffer | Array<string | Buffer>;
  /** Where FORKD_URL / FORKD_TOKEN are read from. @default process.env */
  env?: Record<string, string | undefined>;
}

/** Options every call accepts: they override the client's for this call only. */
export interface RequestOptions {
  requestTimeoutMs?: number;
  /** Cancels the call; the promise then rejects with the signal's reason (an `AbortError` by default). */
  signal?: AbortSignal;
  token?: string;
  headers?: Record<string, string>;
}

export type DaemonAddress =
  | { kind: "unix"; socketPath: string; display: string }
  | {
      kind: "tcp";
      protocol: "http:" | "https:";
      hostname: string;
      port: number;
      /** As in a Host header: the host name (bracketed if IPv6) and the port unless it is the scheme's default. */
      host: string;
      basePath: string;
      display: string;
    };

export interface ResolvedSettings {
  address: DaemonAddress;
  /** Where the address came from, to name in error messages ("the `url` option", "FORKD_URL", "the default"). */
  addressSource: string;
  token: string | undefined;
  tokenSource: string;
  requestTimeoutMs: number;
  headers: Record<string, string>;
  ca: ConnectionOptions["ca"];
}

/** Resolves the settings of one call. `call` wins over `client`, which wins over the environment and defaults. */
export function resolveSettings(client: ConnectionOptions = {}, call: RequestOptions = {}): ResolvedSettings {
  const env = client.env ?? process.env;
  const [url, addressSource] = pick([
    [client.url, "the `url` option"],
    [nonEmpty(env[DAEMON_URL_ENV]), DAEMON_URL_ENV],
    [DEFAULT_DAEMON_URL, "the default address"],
  ]);
  const [token, tokenSource] = pick([
    [call.token, "the call's `token` option"],
    [client.token, "the `token` option"],
    [nonEmpty(env[DAEMON_TOKEN_ENV]), DAEMON_TOKEN_ENV],
    [undefined, "nothing (no token set)"],
  ]);
  if (token !== undefined) checkToken(token, tokenSource);
  const requestTimeoutMs = call.requestTimeoutMs ?? client.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  checkDurationMs(requestTimeoutMs, "requestTimeoutMs");
  const headers = { ...client.headers, ...call.headers };
  for (const [name, value] of Object.entries(headers)) checkHeader(name, value);
  return {
    address: parseDaemonUrl(url as string, addressSource),
    addressSource,
    token,
    tokenSource,
    requestTimeoutMs,
    headers,
    ca: client.ca,
  };
}

/** Parses `unix:/path`, `unix:///path`, `http://host:port[/prefix]` or `https://...`. */
export function parseDaemonUrl(url: string, source = "the `url` option"): DaemonAddress {
  const hint = "use unix:/path/to/forkd.sock, http://host:port or https://host:port";
  if (url.startsWith("unix:")) {
    const socketPath = url.slice("unix:".length).replace(/^\/\/(?=\/)/, "");
    if (!socketPath.startsWith("/") || socketPath.includes("\0")) {
      throw new InvalidArgumentError(
        `${source} is ${JSON.stringify(url)}: a unix socket path must be absolute; ${hint}`,
      );
    }
    return { kind: "unix", socketPath, display: `unix:${socketPath}` };
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InvalidArgumentError(
      `${source} is ${JSON.stringify(url)}, which is not a daemon address; ${hint}`,
    );
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new InvalidArgumentError(
      `${source} is ${JSON.stringify(url)}: unsupported scheme ${parsed.protocol}; ${hint}`,
    );
  }
  if (parsed.username || parsed.password || parsed.search || parsed.hash) {
    throw new InvalidArgumentError(
      `${source} is ${JSON.stringify(url)}: no credentials, query or fragment in the address (pass the token ` +
        "with the `token` option or FORKD_TOKEN)",
    );
  }
  const port = parsed.port === "" ? (parsed.protocol === "https:" ? 443 : 80) : Number(parsed.port);
  const basePath = parsed.pathname.replace(/\/+$/, "");
  const hostname = parsed.hostname.replace(/^\[(.*)\]$/, "$1");
  return {
    kind: "tcp",
    protocol: parsed.protocol,
    hostname,
    port,
    host: parsed.host,
    basePath,
    display: `${parsed.protocol}//${parsed.host}${basePath}`,
  };
}

/** Durations are integral milliseconds; 0 disables the limit it sets. */
export function checkDurationMs(value: number, name: string): void {
  if (!Number.isInteger(value) || value < 0 || value > 2 ** 31 - 1) {
    throw new InvalidArgumentError(
      `${name} must be a whole number of milliseconds from 0 (no limit) to 2^31-1, got ${value}`,
    );
  }
}

function checkToken(token: string, source: string): void {
  if (token.length === 0 || /[^\x21-\x7e]/.test(token)) {
    throw new InvalidArgumentError(
      `the token from ${source} is empty or contains spaces, control or non-ASCII characters; ` +
        "pass the daemon's token exactly (trailing newline removed)",
    );
  }
}

function checkHeader(name: string, value: string): void {
  if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name) || /[\r\n\0]/.test(String(value))) {
    throw new InvalidArgumentError(
      `header ${JSON.stringify(name)} has an invalid name or value (check the \`headers\` option)`,
    );
  }
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === "" ? undefined : value.trim();
}

function pick<T>(candidates: [T | undefined, string][]): [T | undefined, string] {
  for (const candidate of candidates) if (candidate[0] !== undefined) return candidate;
  const last = candidates[candidates.length - 1] as [T | undefined, string];
  return last;
}
