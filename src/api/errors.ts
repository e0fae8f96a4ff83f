/**
 * Every failure leaves the API as `{"error": "...", "code": "..."}` with the status of its catalogue code
 * (src/common/errors.ts). Fastify's own errors (bad JSON, body too large, media type) are translated too, so a
 * client never sees a different error shape.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from "fastify";
import { ERROR_CODES, type ErrorCode, ForkdError } from "../common/errors.js";

export interface HttpError {
  status: number;
  code: string;
  message: string;
}

const CODE_BY_STATUS = new Map<number, ErrorCode>(
  Object.entries(ERROR_CODES).map(([code, status]) => [status, code as ErrorCode]),
);

export function toHttpError(err: unknown): HttpError {
  if (err instanceof ForkdError) return { status: err.httpStatus, code: err.code, message: err.message };
  const fastifyError = err as Partial<FastifyError> & { message?: string };
  const status = typeof fastifyError.statusCode === "number" ? fastifyError.statusCode : 500;
  const message = fastifyError.message ?? String(err);
  switch (fastifyError.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return { status: 413, code: "payload_too_large", message: `request body too large: ${message}` };
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return { status: 415, code: "invalid_argument", message: `unsupported content type: ${message}` };
    case "FST_ERR_CTP_INVALID_JSON_BODY":
      return { status: 400, code: "invalid_argument", message: "malformed JSON body" };
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return { status: 400, code: "invalid_argument", message };
  }
  if (status === 400 && err instanceof SyntaxError) {
    return { status, code: "invalid_argument", message: `malformed JSON body: ${message}` };
  }
  if (status >= 400 && status < 500) {
    return { status, code: CODE_BY_STATUS.get(status) ?? "invalid_argument", message };
  }
  return { status: 500, code: "internal", message: `internal error: ${message}` };
}

export function sendError(reply: FastifyReply, err: HttpError): FastifyReply {
  return reply.status(err.status).type("application/json").send({ error: err.message, code: err.code });
}

/** A host directory whose path an API caller is not told, and what its messages say instead. */
export interface HostPathRedaction {
  dir: string;
  /** e.g. "$FORKD_HOME". */
  name: string;
}

/**
 * `message` with every redacted host directory replaced by its name where it appears as a whole path
 * component (longest first, so nested roots work): `/var/lib/forkd/x` is redacted, `/var/lib/forkd-old` is not.
 */
export function redactHostPaths(message: string, redactions: readonly HostPathRedaction[]): string {
  let out = message;
  for (const { dir, name } of [...redactions].sort((a, b) => b.dir.length - a.dir.length)) {
    if (dir.length <= 1) continue;
    const escaped = dir.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    out = out.replace(new RegExp(`${escaped}(?=/|[^A-Za-z0-9._-]|$)`, "g"), () => name);
  }
  return out;
}

/**
 * The error handler: logs the full error (operators see host paths) and answers the caller with host
 * directories redacted (where the daemon keeps its state is none of a caller's business, and a map of it helps
 * an attacker).
 */
export function errorHandlerFor(redactions: readonly HostPathRedaction[] = []) {
  return (err: unknown, request: FastifyRequest, reply: FastifyReply): FastifyReply => {
    const httpError = toHttpError(err);
    if (httpError.status >= 500) request.log.error({ err }, "request failed");
    else request.log.info({ status: httpError.status, error: httpError.message }, "request rejected");
    if (httpError.status === 401) reply.header("www-authenticate", 'Bearer realm="forkd"');
    return sendError(reply, { ...httpError, message: redactHostPaths(httpError.message, redactions) });
  };
}

export function notFoundHandler(request: FastifyRequest, reply: FastifyReply): FastifyReply {
  return sendError(reply, {
    status: 404,
    code: "not_found",
    message: `no route ${request.method} ${request.url.split("?")[0]}`,
  });
}

export const notImplemented = (message: string) => new ForkdError("not_implemented", message);
