/**
 * E2B's error shapes. The REST API and envd's HTTP routes answer `{"code": <HTTP status>, "message": "..."}`
 * (the SDK reads both fields: `code === 404` becomes SandboxNotFoundError, 401 AuthenticationError, ...);
 * Connect calls fail with Connect error codes (Unauthenticated -> AuthenticationError, NotFound -> NotFoundError,
 * ...). Both are derived from the forkd error catalogue, so every layer agrees on what a failure means.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { FastifyReply } from "fastify";
import { type ErrorCode, ForkdError } from "../common/errors.js";

export interface E2bErrorBody {
  code: number;
  message: string;
}

/**
 * A sandbox the data plane cannot reach: unknown, not running, or a port nothing serves. E2B's proxy answers
 * 502, which the SDK reads as "the sandbox is gone" (isRunning() false, TimeoutError, SandboxNotFoundError).
 */
export class SandboxUnreachable extends Error {
  override readonly name = "SandboxUnreachable";
}

/** HTTP status and message of any error thrown while serving an E2B request. */
export function toE2bError(err: unknown): E2bErrorBody {
  if (err instanceof SandboxUnreachable) return { code: 502, message: err.message };
  if (err instanceof ForkdError) return { code: err.httpStatus, message: err.message };
  const e = err as { statusCode?: unknown; message?: unknown; code?: unknown };
  const message = typeof e.message === "string" ? e.message : String(err);
  if (e.code === "FST_ERR_CTP_INVALID_JSON_BODY" || err instanceof SyntaxError) {
    return { code: 400, message: `malformed JSON body: ${message}` };
  }
  if (typeof e.statusCode === "number" && e.statusCode >= 400 && e.statusCode < 500) {
    return { code: e.statusCode, message };
  }
  return { code: 500, message: `internal error: ${message}` };
}

export function sendE2bError(reply: FastifyReply, err: unknown): FastifyReply {
  const body = toE2bError(err);
  return reply.status(body.code).type("application/json").send(body);
}

const CONNECT_CODES: Record<ErrorCode, Code> = {
  invalid_argument: Code.InvalidArgument,
  unauthorized: Code.Unauthenticated,
  forbidden: Code.PermissionDenied,
  not_found: Code.NotFound,
  conflict: Code.FailedPrecondition,
  payload_too_large: Code.InvalidArgument,
  unprocessable: Code.InvalidArgument,
  too_many_requests: Code.ResourceExhausted,
  internal: Code.Internal,
  not_implemented: Code.Unimplemented,
  unavailable: Code.Unavailable,
  timeout: Code.DeadlineExceeded,
  insufficient_storage: Code.ResourceExhausted,
};

/** A Connect error for anything a handler throws (ConnectErrors pass through). */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof SandboxUnreachable) return new ConnectError(err.message, Code.Unavailable);
  if (err instanceof ForkdError) return new ConnectError(err.message, CONNECT_CODES[err.code]);
  if (err instanceof Error && err.name === "AbortError") return new ConnectError(err.message, Code.Canceled);
  return new ConnectError(err instanceof Error ? err.message : String(err), Code.Internal);
}

const CODE_NAMES: Partial<Record<Code, string>> = {
  [Code.Canceled]: "canceled",
  [Code.InvalidArgument]: "invalid_argument",
  [Code.DeadlineExceeded]: "deadline_exceeded",
  [Code.NotFound]: "not_found",
  [Code.AlreadyExists]: "already_exists",
  [Code.ResourceExhausted]: "resource_exhausted",
  [Code.FailedPrecondition]: "failed_precondition",
  [Code.Unimplemented]: "unimplemented",
  [Code.Internal]: "internal",
  [Code.Unavailable]: "unavailable",
  [Code.Unauthenticated]: "unauthenticated",
};

/** The HTTP status the Connect protocol pairs with a code (a unary error before any response). */
const CONNECT_HTTP_STATUS: Partial<Record<Code, number>> = {
  [Code.InvalidArgument]: 400,
  [Code.Unauthenticated]: 401,
  [Code.NotFound]: 404,
  [Code.Unimplemented]: 404,
  [Code.Unavailable]: 503,
};

/**
 * Answers a Connect call refused before it reached its handler (no such sandbox, wrong access token, unknown
 * method) the way Connect clients read it: the HTTP status and a JSON body `{"code": "<connect code>"}`.
 */
export function sendConnectError(reply: FastifyReply, err: unknown): FastifyReply {
  const status = err instanceof ConnectError ? (CONNECT_HTTP_STATUS[err.code] ?? 500) : toE2bError(err).code;
  const connect = err instanceof ConnectError ? err : toConnectError(err);
  return reply
    .status(status)
    .type("application/json")
    .send({ code: CODE_NAMES[connect.code] ?? "unknown", message: connect.rawMessage });
}
