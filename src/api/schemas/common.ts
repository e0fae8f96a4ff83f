/** Pieces every route schema shares: error bodies, tags and ids, optional bodies, timeouts, and status. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type TSchema, Type } from "@sinclair/typebox";
import { MAX_FILE_BYTES, MAX_HEADER_BYTES } from "../../agent/protocol/limits.js";
import { ERROR_CODES, MAX_GUEST_TIMEOUT_MS, SANDBOX_REF_PATTERN, TAG_PATTERN } from "../../common/limits.js";

/**
 * argv, env and cwd travel in the guest agent's request header (MAX_HEADER_BYTES); this leaves room for the rest
 * of the header. Larger inputs belong in stdin or a file.
 */
export const MAX_EXEC_REQUEST_BYTES = MAX_HEADER_BYTES - 4096;
/** Largest file a PUT accepts or a GET returns: one agent frame's payload. */
export const MAX_FILE_TRANSFER_BYTES = MAX_FILE_BYTES;

export const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);
/** A JSON body the client may leave out (an empty POST: Fastify hands the validator null). */
export const OptionalBody = <T extends TSchema>(schema: T) =>
  Type.Union([schema, Type.Null(), Type.Undefined()]);

// ---------------------------------------------------------------------------------------------------------------
// Shared pieces

export const ErrorBody = Type.Object(
  {
    error: Type.String({ description: "Human-readable message naming what was wrong." }),
    code: Type.Optional(
      Type.String({
        enum: Object.keys(ERROR_CODES),
        description: "Catalogue code (src/common/limits.ts, ERROR_CODES), e.g. not_found, conflict.",
      }),
    ),
  },
  { description: "Every 4xx/5xx response carries this body (v0.5's ErrorBody plus `code`)." },
);

export const errorResponses = {
  "4xx": ErrorBody,
  "5xx": ErrorBody,
};

export const Tag = Type.String({
  pattern: TAG_PATTERN,
  description: "Snapshot tag: one safe path component.",
});
export const SandboxId = Type.String({
  pattern: SANDBOX_REF_PATTERN,
  description:
    "A sandbox id (this daemon issues sb-<12 hex>). Any other name of letters, digits, '.', '_' and '-' (at most 128, " +
    "not starting with '.' or '-') is an unknown sandbox (404); anything else is refused (400).",
});

export const TagParams = Type.Object({ tag: Tag }, { additionalProperties: false });
export const SandboxParams = Type.Object({ id: SandboxId }, { additionalProperties: false });

export const TimeoutMs = Type.Integer({
  minimum: 1,
  maximum: MAX_GUEST_TIMEOUT_MS,
  description: "Milliseconds.",
});
export const TimeoutSecs = Type.Integer({
  minimum: 1,
  maximum: MAX_GUEST_TIMEOUT_MS / 1000,
  description: "Seconds (v0.5 form; use timeout_ms for finer control). Not both.",
});

/**
 * v0.5 fields whose feature forkd does not have yet: accepted when false/absent, answered 501 when true so an
 * existing client learns why instead of silently getting something else.
 */
export const NotBuiltFlag = (what: string) =>
  Type.Optional(
    Type.Boolean({ description: `forkd v0.5 field; ${what}. Only false is accepted (true: 501).` }),
  );

// ---------------------------------------------------------------------------------------------------------------
// Status

export const HealthResponse = Type.Object({ ok: Type.Literal(true) });
export const VersionResponse = Type.Object({
  version: Type.String(),
  api: Type.Literal("v1"),
});
