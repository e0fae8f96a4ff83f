/**
 * Errors of every layer: a ForkdError carries a code of the one catalogue (ERROR_CODES, declared in limits.ts
 * with the HTTP status the API answers with, so the CLI, the REST API and the SDKs agree on what it means).
 */
import { ERROR_CODES, type ErrorCode } from "./limits.js";

export { ERROR_CODES, type ErrorCode };

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
