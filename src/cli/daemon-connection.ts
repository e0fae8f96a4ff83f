/**
 * How the daemon commands reach the daemon: through the TypeScript SDK (src/sdk: its address parsing, transport and
 * routes), at --daemon-url, else FORKD_URL, else the daemon's Unix socket, with --daemon-token or FORKD_TOKEN.
 * This module only turns the SDK's errors into the CLI's one-line messages and exit codes (run-command.ts).
 */
import type { Command } from "commander";
import { ERROR_CODES, type ErrorCode, ForkdError, invalidArgument } from "../common/errors.js";
import { DAEMON_TOKEN_ENV, DAEMON_URL_ENV, DEFAULT_DAEMON_URL } from "../common/limits.js";
import {
  ConnectionError,
  Controller,
  ForkdSdkError,
  InvalidArgumentError,
  PayloadTooLargeError,
  parseDaemonUrl,
  TimeoutError,
} from "../sdk/index.js";
import { addDaemonOptions } from "./daemon-options.js";
import { runCommand } from "./run-command.js";

export { addDaemonOptions };

/** The daemon as a command reaches it: the SDK's client, and the address as the user gave it (for messages). */
export interface Daemon {
  controller: Controller;
  url: string;
}

const DENIED = new Set(["EACCES", "EPERM"]);

/** True when the command was told where the daemon is (then a daemon that does not answer is an error). */
export function daemonNamed(command: Command, env: NodeJS.ProcessEnv = process.env): boolean {
  const opts = command.optsWithGlobals() as { daemonUrl?: string };
  return opts.daemonUrl !== undefined || setting(env, DAEMON_URL_ENV) !== undefined;
}

/** An environment variable as the SDK reads it: trimmed, and unset when empty. */
function setting(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const value = env[name]?.trim();
  return value === undefined || value === "" ? undefined : value;
}

/** The daemon at the command's address. The SDK reads nothing else: no request timeout (Ctrl-C cancels). */
export function connectDaemon(command: Command, env: NodeJS.ProcessEnv = process.env): Daemon {
  const opts = command.optsWithGlobals() as { daemonUrl?: string; daemonToken?: string };
  const fromEnv = setting(env, DAEMON_URL_ENV);
  const [url, source] =
    opts.daemonUrl !== undefined
      ? [opts.daemonUrl, "--daemon-url"]
      : fromEnv !== undefined
        ? [fromEnv, DAEMON_URL_ENV]
        : [DEFAULT_DAEMON_URL, "the default address"];
  try {
    parseDaemonUrl(url, source);
  } catch (err) {
    throw invalidArgument(`invalid daemon URL: ${(err as Error).message}`);
  }
  const token = opts.daemonToken || setting(env, DAEMON_TOKEN_ENV);
  try {
    return { controller: new Controller({ url, token, requestTimeoutMs: 0, env: {} }), url };
  } catch (err) {
    throw err instanceof ForkdSdkError ? new ForkdError("invalid_argument", err.message) : err;
  }
}

/** Runs a daemon command: connects, runs `action`, and reports the SDK's errors as the CLI does. */
export function runDaemonCommand(
  command: Command,
  action: (daemon: Daemon, signal: AbortSignal) => Promise<number | undefined>,
): Promise<never> {
  return runCommand(async (signal) => {
    const daemon = connectDaemon(command);
    try {
      return await action(daemon, signal);
    } catch (err) {
      throw daemonError(err, daemon.url);
    }
  });
}

/** True when a forkd daemon answers at the address within `timeoutMs`; false when nothing answers there. */
export async function daemonAnswers(daemon: Daemon, timeoutMs: number): Promise<boolean> {
  try {
    await daemon.controller.version({ requestTimeoutMs: timeoutMs });
    return true;
  } catch (err) {
    if (err instanceof TimeoutError || unreachable(err)) return false;
    throw daemonError(err, daemon.url);
  }
}

/** The SDK could not connect: nothing answers at the address, or its socket refuses this user. */
export function connectFailed(err: unknown): boolean {
  return err instanceof ConnectionError && !err.requestSent;
}

/** Nothing answers at the address (not a socket that refuses this user, nor a failed TLS handshake). */
function unreachable(err: unknown): boolean {
  return (
    connectFailed(err) &&
    (err as ConnectionError).daemonReachable === false &&
    !DENIED.has((err as ConnectionError).syscallCode ?? "")
  );
}

/**
 * The CLI's error for an SDK error: the daemon's own message and code for an answer it gave, one line saying what
 * to do when it cannot be reached. Anything else (a ForkdError, the user's interrupt) passes unchanged.
 */
export function daemonError(err: unknown, url: string): unknown {
  if (!(err instanceof ForkdSdkError)) return err;
  if (unreachable(err)) {
    return new ForkdError(
      "unavailable",
      `cannot reach the forkd daemon at ${url}: is \`forkd daemon\` running?`,
      {
        detail: { unreachable: true },
        cause: err,
      },
    );
  }
  if (err instanceof ConnectionError) {
    if (DENIED.has(err.syscallCode ?? "")) {
      return new ForkdError(
        "unavailable",
        `permission denied on the forkd daemon socket ${url}: run as root or as a member of its group`,
        { cause: err },
      );
    }
    const cause = err.cause instanceof Error ? err.cause.message : err.message;
    return new ForkdError("unavailable", `talking to the forkd daemon at ${url} failed: ${cause}`, {
      cause: err,
    });
  }
  if (err.status !== undefined) {
    let message = err.serverMessage || `HTTP ${err.status}`;
    if (err.status === 401) message += ` (daemon at ${url}: pass --daemon-token or set ${DAEMON_TOKEN_ENV})`;
    return new ForkdError(codeOf(err), message, { detail: { status: err.status }, cause: err });
  }
  if (err.code !== undefined)
    return new ForkdError(codeOf(err), err.serverMessage ?? err.message, { cause: err });
  if (err instanceof TimeoutError) {
    return new ForkdError("timeout", `the forkd daemon at ${url} did not answer in time`, { cause: err });
  }
  const code: ErrorCode =
    err instanceof InvalidArgumentError
      ? "invalid_argument"
      : err instanceof PayloadTooLargeError
        ? "payload_too_large"
        : "internal";
  return new ForkdError(code, err.message, { cause: err });
}

/** The catalogue code the daemon sent, else the one of its status. */
function codeOf(err: ForkdSdkError): ErrorCode {
  if (err.code !== undefined && err.code in ERROR_CODES) return err.code as ErrorCode;
  for (const [code, status] of Object.entries(ERROR_CODES))
    if (status === err.status) return code as ErrorCode;
  return (err.status ?? 500) >= 500 ? "internal" : "invalid_argument";
}
