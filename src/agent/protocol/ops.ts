/**
 * Every op the agent serves: its arguments, its result, and what travels in the request and response bodies.
 * Arguments reject unknown fields (an older agent must not silently ignore an option it does not know);
 * results accept them (a newer agent may add fields).
 */
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { MAX_FILE_BYTES, MAX_LIST_ENTRIES, MAX_PATH_CHARS, MAX_TIMEOUT_MS } from "./limits.js";
import { Interpreter, WarmState } from "./messages.js";
import { type Validator, validator } from "./validate.js";

const strict = { additionalProperties: false } as const;
const NO_NUL = "^[^\\x00]*$";

export const GuestPath = Type.String({
  minLength: 1,
  maxLength: MAX_PATH_CHARS,
  pattern: "^/[^\\x00]*$",
  description: "an absolute path without NUL bytes",
});
export const TimeoutMs = Type.Integer({ minimum: 1, maximum: MAX_TIMEOUT_MS });
const Count = Type.Integer({ minimum: 0 });

// ---- ping

export const PingArgs = Type.Object({}, strict);
export const PingResult = Type.Object({
  protocol: Type.Integer(),
  agent_version: Type.String({ maxLength: 64 }),
  template: Type.String({ maxLength: 128 }),
  interpreter: Interpreter,
  warm: WarmState,
  sandbox_id: Type.Union([Type.String({ maxLength: 64 }), Type.Null()]),
  hostname: Type.String({ maxLength: 256 }),
  uptime_ms: Count,
});

// ---- restore: request body = entropy bytes (MIN_ENTROPY_BYTES..MAX_ENTROPY_BYTES of limits.ts)

export const HOSTNAME_PATTERN =
  "^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$";

export const RestoreArgs = Type.Object(
  {
    /** CLOCK_REALTIME to set, in ns since the epoch, as a decimal string (JSON numbers lose precision). */
    time_ns: Type.String({ pattern: "^[0-9]{1,19}$" }),
    hostname: Type.String({ minLength: 1, maxLength: 64, pattern: HOSTNAME_PATTERN }),
    sandbox_id: Type.String({ minLength: 1, maxLength: 64 }),
  },
  strict,
);
export const RestoreResult = Type.Object({
  /** "dry-run" when the agent runs with injected fix-ups that do not touch the system (host tests). */
  applied: Type.Union([Type.Literal("system"), Type.Literal("dry-run")]),
  entropy_bytes: Count,
  hostname: Type.String({ maxLength: 64 }),
  sandbox_id: Type.String({ maxLength: 64 }),
  duration_ms: Type.Number({ minimum: 0 }),
});

// ---- eval / warmup: request body = UTF-8 Python code

export const EvalArgs = Type.Object({ timeout_ms: TimeoutMs }, strict);
export const PythonError = Type.Object({
  type: Type.String(),
  message: Type.String(),
  traceback: Type.String(),
});
export const EvalResult = Type.Object({
  /** repr() of the cell's last expression, or null when it was not an expression or was None. */
  result: Type.Union([Type.String(), Type.Null()]),
  result_truncated: Type.Boolean(),
  stdout: Type.String(),
  stderr: Type.String(),
  stdout_truncated: Type.Boolean(),
  stderr_truncated: Type.Boolean(),
  error: Type.Union([PythonError, Type.Null()]),
  timed_out: Type.Boolean(),
  duration_ms: Type.Number({ minimum: 0 }),
});
export const WarmupArgs = EvalArgs;
export const WarmupResult = Type.Composite([EvalResult, Type.Object({ warm: WarmState })]);

// ---- exec: request body = stdin when args.stdin is "body"; events stdout/stderr (+ stdin_ack when streaming)

export const ExecArgs = Type.Object(
  {
    argv: Type.Array(Type.String({ maxLength: 128 * 1024, pattern: NO_NUL }), {
      minItems: 1,
      maxItems: 4096,
    }),
    env: Type.Optional(
      Type.Record(
        Type.String({ pattern: "^[A-Za-z_][A-Za-z0-9_]{0,255}$" }),
        Type.String({ pattern: NO_NUL }),
      ),
    ),
    cwd: Type.Optional(GuestPath),
    /** none: stdin is /dev/null-like (closed at once); body: the request body is all of stdin; stream: `in` frames. */
    stdin: Type.Union([Type.Literal("none"), Type.Literal("body"), Type.Literal("stream")]),
    timeout_ms: TimeoutMs,
  },
  strict,
);
export const ExecResult = Type.Object({
  exit_code: Type.Union([Type.Integer(), Type.Null()]),
  signal: Type.Union([Type.String({ maxLength: 32 }), Type.Null()]),
  timed_out: Type.Boolean(),
  duration_ms: Type.Number({ minimum: 0 }),
  stdout_bytes: Count,
  stderr_bytes: Count,
});

// ---- files

export const FileType = Type.Union([
  Type.Literal("file"),
  Type.Literal("dir"),
  Type.Literal("symlink"),
  Type.Literal("other"),
]);
export const FileInfo = Type.Object({
  name: Type.String(),
  type: FileType,
  size: Count,
  /** Permission bits (st_mode & 0o7777). */
  mode: Type.Integer({ minimum: 0, maximum: 0o7777 }),
  mtime_ms: Type.Number(),
  /** Where a symlink points (file.stat only). */
  link_target: Type.Optional(Type.String()),
});

export const FileWriteArgs = Type.Object(
  {
    path: GuestPath,
    mode: Type.Optional(Type.Integer({ minimum: 0, maximum: 0o7777 })),
    /** Create missing parent directories (default true). */
    parents: Type.Optional(Type.Boolean()),
  },
  strict,
);
export const FileWriteResult = Type.Object({ bytes: Count });

export const FileReadArgs = Type.Object(
  {
    path: GuestPath,
    offset: Type.Optional(Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER })),
    max_bytes: Type.Integer({ minimum: 0, maximum: MAX_FILE_BYTES }),
  },
  strict,
);
/** Response body = the bytes read. */
export const FileReadResult = Type.Object({ size: Count, truncated: Type.Boolean() });

export const FileListArgs = Type.Object(
  { path: GuestPath, max_entries: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIST_ENTRIES })) },
  strict,
);
export const FileListResult = Type.Object({
  entries: Type.Array(FileInfo, { maxItems: MAX_LIST_ENTRIES }),
  truncated: Type.Boolean(),
});

export const FileStatArgs = Type.Object({ path: GuestPath }, strict);
export const FileStatResult = FileInfo;

export const FileRemoveArgs = Type.Object(
  { path: GuestPath, recursive: Type.Optional(Type.Boolean()) },
  strict,
);
export const FileRemoveResult = Type.Object({});

// ---- the table

export type BodyKind = "none" | "bytes" | "text";

interface OpSpec<A extends TSchema, R extends TSchema> {
  args: A;
  result: R;
  /** What the request body carries: nothing, raw bytes, or UTF-8 text. */
  requestBody: BodyKind;
  /** Whether the response body carries raw bytes (then the result stays in the header). */
  responseBody: "none" | "bytes";
  /** Whether the call accepts `in` frames while it runs. */
  input: boolean;
}

const op = <A extends TSchema, R extends TSchema>(spec: OpSpec<A, R>) => spec;

export const OPS = {
  ping: op({ args: PingArgs, result: PingResult, requestBody: "none", responseBody: "none", input: false }),
  restore: op({
    args: RestoreArgs,
    result: RestoreResult,
    requestBody: "bytes",
    responseBody: "none",
    input: false,
  }),
  warmup: op({
    args: WarmupArgs,
    result: WarmupResult,
    requestBody: "text",
    responseBody: "none",
    input: false,
  }),
  exec: op({ args: ExecArgs, result: ExecResult, requestBody: "bytes", responseBody: "none", input: true }),
  eval: op({ args: EvalArgs, result: EvalResult, requestBody: "text", responseBody: "none", input: false }),
  "file.write": op({
    args: FileWriteArgs,
    result: FileWriteResult,
    requestBody: "bytes",
    responseBody: "none",
    input: false,
  }),
  "file.read": op({
    args: FileReadArgs,
    result: FileReadResult,
    requestBody: "none",
    responseBody: "bytes",
    input: false,
  }),
  "file.list": op({
    args: FileListArgs,
    result: FileListResult,
    requestBody: "none",
    responseBody: "none",
    input: false,
  }),
  "file.stat": op({
    args: FileStatArgs,
    result: FileStatResult,
    requestBody: "none",
    responseBody: "none",
    input: false,
  }),
  "file.remove": op({
    args: FileRemoveArgs,
    result: FileRemoveResult,
    requestBody: "none",
    responseBody: "none",
    input: false,
  }),
} as const;

export type OpName = keyof typeof OPS;
export type OpArgs<O extends OpName> = Static<(typeof OPS)[O]["args"]>;
export type OpResult<O extends OpName> = Static<(typeof OPS)[O]["result"]>;

export type PingResult = Static<typeof PingResult>;
export type RestoreArgs = Static<typeof RestoreArgs>;
export type RestoreResult = Static<typeof RestoreResult>;
export type EvalArgs = Static<typeof EvalArgs>;
export type EvalResult = Static<typeof EvalResult>;
export type WarmupResult = Static<typeof WarmupResult>;
export type ExecArgs = Static<typeof ExecArgs>;
export type ExecResult = Static<typeof ExecResult>;
export type FileInfo = Static<typeof FileInfo>;
export type FileType = Static<typeof FileType>;
export type FileListResult = Static<typeof FileListResult>;
export type FileReadResult = Static<typeof FileReadResult>;

export function isOpName(name: string): name is OpName {
  return Object.hasOwn(OPS, name);
}

type Validators = {
  [O in OpName]: { args: Validator<(typeof OPS)[O]["args"]>; result: Validator<(typeof OPS)[O]["result"]> };
};

/** Per-op validators, compiled on first use. */
export const opValidators = Object.fromEntries(
  Object.entries(OPS).map(([name, spec]) => [
    name,
    { args: validator(spec.args), result: validator(spec.result) },
  ]),
) as Validators;

/** Compiles every op's argument validator now (see Validator.compile). */
export function precompileOpArgs(): void {
  for (const validators of Object.values(opValidators)) validators.args.compile();
}
