/**
 * One catalogue of error codes for every layer. Each code carries the HTTP status the API answers with, so
 * the CLI, the REST API and the SDKs agree on what a failure means.
 */
export const ERROR_CODES = {
  invalid_argument: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  payload_too_large: 413,
  unprocessable: 422,
  too_many_requests: 429,
  internal: 500,
  not_implemented: 501,
  unavailable: 503,
  timeout: 504,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export class ForkdError extends Error {
  readonly code: ErrorCode;
  /** Extra machine-readable detail (e.g. the dependents blocking a delete). */
  readonly detail: Record<string, unknown> | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options?: { cause?: unknown; detail?: Record<string, unknown> },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ForkdError";
    this.code = code;
    this.detail = options?.detail;
  }

  get httpStatus(): number {
    return ERROR_CODES[this.code];
  }
}

export const invalidArgument = (message: string) => new ForkdError("invalid_argument", message);
export const notFound = (message: string) => new ForkdError("not_found", message);
export const conflict = (message: string, detail?: Record<string, unknown>) =>
  new ForkdError("conflict", message, { detail });

/** Message of any thrown value, for logs and one-line CLI errors. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}
