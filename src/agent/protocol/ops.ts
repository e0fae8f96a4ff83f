/**
 * Every op the agent serves: its arguments, its result, and what travels in the request and response bodies.
 * Arguments reject unknown fields (an older agent must not silently ignore an option it does not know);
 * results accept them (a newer agent may add fields).
 */
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import {
  MAX_FILE_BYTES,
  MAX_LIST_DEPTH,
  MAX_LIST_ENTRIES,
  MAX_PATH_CHARS,
  MAX_PROCS,
  MAX_TIMEOUT_MS,
} from "./limits.js";
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

/**
 * A user of the guest's /etc/passwd that a process or file op acts as. Absent = root (the forkd API's
 * behaviour); the E2B surface passes E2B's default user, `user`, that every forkd image has.
 */
export const GuestUser = Type.String({
  minLength: 1,
  maxLength: 32,
  pattern: "^[a-z_][a-z0-9_-]*\\$?$",
  description: "a user name of the guest's /etc/passwd",
});
const Argv = Type.Array(Type.String({ maxLength: 128 * 1024, pattern: NO_NUL }), {
  minItems: 1,
  maxItems: 4096,
});
const Env = Type.Record(
  Type.String({ pattern: "^[A-Za-z_][A-Za-z0-9_]{0,255}$" }),
  Type.String({ pattern: NO_NUL }),
);

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

// ---- stats: what the guest uses now (E2B's metrics): memory from /proc/meminfo, a filesystem's statfs

export const StatsArgs = Type.Object(
  {
    /** The filesystem to measure, by a path on it; default `/`. */
    path: Type.Optional(GuestPath),
  },
  strict,
);
export const StatsResult = Type.Object({
  mem_total_bytes: Count,
  /** MemAvailable: what the guest could still use without swapping. */
  mem_available_bytes: Count,
  /** Page cache: Cached + Buffers. */
  mem_cache_bytes: Count,
  disk_total_bytes: Count,
  /** Blocks in use (total - free), as df counts them. */
  disk_used_bytes: Count,
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

/** A namespace of the warm interpreter (E2B's code contexts). `default` is the template's warm namespace. */
export const ContextId = Type.String({
  minLength: 1,
  maxLength: 64,
  pattern: "^[A-Za-z0-9][A-Za-z0-9._-]*$",
  description: "a context id: letters, digits, '.', '_', '-'",
});

export const EvalArgs = Type.Object(
  {
    timeout_ms: TimeoutMs,
    /** Namespace to run in (default `default`); not_found if it was never created. */
    context: Type.Optional(ContextId),
    /**
     * Stream what the cell prints as `stdout`/`stderr` events (UTF-8 text in the body, one line per event, as
     * Jupyter's streams: a line without its newline is sent when the cell flushes or ends) and its display
     * outputs as `display` events while it runs; the result's `stdout`/`stderr` are then empty.
     */
    stream: Type.Optional(Type.Boolean()),
    /** Working directory for the cell (os.chdir before it runs; the context keeps it). */
    cwd: Type.Optional(GuestPath),
    /** Extra environment for the cell, laid over os.environ while it runs. */
    env: Type.Optional(Env),
  },
  strict,
);
export const PythonError = Type.Object({
  type: Type.String(),
  message: Type.String(),
  traceback: Type.String(),
});
/**
 * Richer representations of the result value, from IPython's display protocol (`_repr_html_`, `_repr_png_`,
 * ...) where the value offers them. Binary formats (png, jpeg, pdf) are base64; json is a JSON text.
 */
/** The languages a context runs: Python in the warm interpreter, bash and JavaScript where the image has them. */
export const ContextLanguage = Type.Union([
  Type.Literal("python"),
  Type.Literal("bash"),
  Type.Literal("javascript"),
]);

export const RichFormats = Type.Object({
  html: Type.Optional(Type.String()),
  markdown: Type.Optional(Type.String()),
  svg: Type.Optional(Type.String()),
  png: Type.Optional(Type.String()),
  jpeg: Type.Optional(Type.String()),
  pdf: Type.Optional(Type.String()),
  latex: Type.Optional(Type.String()),
  json: Type.Optional(Type.String()),
  javascript: Type.Optional(Type.String()),
  /** E2B's chart data of a matplotlib figure (the e2b_charts package's dict, where the image has it): JSON text. */
  chart: Type.Optional(Type.String()),
});
/**
 * One display output of a streaming cell (Jupyter's display_data): `display(value)`, or a matplotlib figure
 * still open when the cell ends. `text` is the value's repr; the formats as for a result.
 */
export const DisplayData = Type.Composite([RichFormats, Type.Object({ text: Type.Optional(Type.String()) })]);
export const EvalResult = Type.Object({
  /** repr() of the cell's last expression, or null when it was not an expression or was None. */
  result: Type.Union([Type.String(), Type.Null()]),
  result_truncated: Type.Boolean(),
  /** Present when the result value offers richer representations (see RichFormats). */
  formats: Type.Optional(RichFormats),
  stdout: Type.String(),
  stderr: Type.String(),
  stdout_truncated: Type.Boolean(),
  stderr_truncated: Type.Boolean(),
  error: Type.Union([PythonError, Type.Null()]),
  timed_out: Type.Boolean(),
  duration_ms: Type.Number({ minimum: 0 }),
  /** Cells this context has run, this one included (E2B's execution count). */
  execution_count: Type.Optional(Count),
});
export const WarmupArgs = Type.Object({ timeout_ms: TimeoutMs }, strict);
export const WarmupResult = Type.Composite([EvalResult, Type.Object({ warm: WarmState })]);

// ---- contexts: namespaces of the warm interpreter (E2B code-interpreter contexts)

export const ContextInfo = Type.Object({
  id: ContextId,
  /** Working directory cells of this context start in. */
  cwd: Type.String(),
  language: ContextLanguage,
});
/**
 * A new context starts with the names the template's warm-up defined (a shallow copy of the warm namespace
 * as it was after warm-up), so `numpy` is bound and nothing is imported again.
 */
export const ContextCreateArgs = Type.Object(
  {
    id: Type.Optional(ContextId),
    cwd: Type.Optional(GuestPath),
    /**
     * Default python. A bash context is a bash process of its own (variables, functions, cwd kept between
     * cells); a javascript context a Node.js process (where the image has `node`); not_implemented otherwise.
     */
    language: Type.Optional(ContextLanguage),
  },
  strict,
);
export const ContextListArgs = Type.Object({}, strict);
export const ContextListResult = Type.Object({ contexts: Type.Array(ContextInfo, { maxItems: 1024 }) });
/** restart: the namespace starts again from the warm-up's names; remove: forgotten (not `default`). */
export const ContextRefArgs = Type.Object({ id: ContextId }, strict);
export const EmptyResult = Type.Object({});

// ---- exec: request body = stdin when args.stdin is "body"; events stdout/stderr (+ stdin_ack when streaming)

export const ExecArgs = Type.Object(
  {
    argv: Argv,
    env: Type.Optional(Env),
    /** Default: the user's home directory when `user` is given, else `/`. */
    cwd: Type.Optional(GuestPath),
    user: Type.Optional(GuestUser),
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
  /** Absolute path of the entry (every op that returns FileInfo sets it). */
  path: Type.Optional(Type.String()),
  uid: Type.Optional(Count),
  gid: Type.Optional(Count),
  /** User and group names from the guest's /etc/passwd and /etc/group (the number when unknown). */
  owner: Type.Optional(Type.String({ maxLength: 64 })),
  group: Type.Optional(Type.String({ maxLength: 64 })),
});

export const FileWriteArgs = Type.Object(
  {
    path: GuestPath,
    mode: Type.Optional(Type.Integer({ minimum: 0, maximum: 0o7777 })),
    /** Create missing parent directories (default true). */
    parents: Type.Optional(Type.Boolean()),
    /** Owner of the file and of directories created for it (default root). */
    user: Type.Optional(GuestUser),
    /**
     * Append to the file instead of replacing it atomically (large uploads arrive in several writes to a
     * temporary name, then one file.move puts the whole file in place).
     */
    append: Type.Optional(Type.Boolean()),
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
  {
    path: GuestPath,
    max_entries: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIST_ENTRIES })),
    /**
     * Levels to descend (default 1: the directory's own entries). Deeper entries carry `path`; symlinked
     * directories are not followed.
     */
    depth: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_LIST_DEPTH })),
  },
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

/** Creates a directory (and its parents unless `parents: false`); `created: false` when it already existed. */
export const FileMkdirArgs = Type.Object(
  {
    path: GuestPath,
    parents: Type.Optional(Type.Boolean()),
    mode: Type.Optional(Type.Integer({ minimum: 0, maximum: 0o7777 })),
    user: Type.Optional(GuestUser),
  },
  strict,
);
export const FileMkdirResult = Type.Object({ created: Type.Boolean(), entry: FileInfo });

/** rename(2), creating the destination's parents; not_found if the source is missing. */
export const FileMoveArgs = Type.Object(
  { source: GuestPath, destination: GuestPath, user: Type.Optional(GuestUser) },
  strict,
);
export const FileMoveResult = FileInfo;

// ---- watch: a streaming call; `fs` events until the host cancels it (then it answers)

export const FsOp = Type.Union([
  Type.Literal("create"),
  Type.Literal("write"),
  Type.Literal("remove"),
  Type.Literal("rename"),
  Type.Literal("chmod"),
]);
export const WatchArgs = Type.Object({ path: GuestPath, recursive: Type.Optional(Type.Boolean()) }, strict);
/** Sent when the watch ends (cancelled, or the watched directory went away). */
export const WatchResult = Type.Object({
  events: Count,
  /** Events dropped because the host fell behind (more than MAX_QUEUED_WATCH_EVENTS queued). */
  dropped: Count,
  reason: Type.Union([Type.Literal("cancelled"), Type.Literal("removed")]),
});

// ---- proc: processes that outlive the call that started them (E2B's process service)

/**
 * Selects a process of the agent's table: exactly one of pid (the guest pid) or tag (given at start).
 * not_found if nothing matches.
 */
export const ProcSelector = Type.Object(
  {
    pid: Type.Optional(Type.Integer({ minimum: 1, maximum: 2 ** 22 })),
    tag: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: NO_NUL })),
  },
  strict,
);
export const PtySize = Type.Object(
  {
    cols: Type.Integer({ minimum: 1, maximum: 1000 }),
    rows: Type.Integer({ minimum: 1, maximum: 1000 }),
  },
  strict,
);

/**
 * Starts a process kept in the agent's process table, in its own session and process group. The call streams
 * a `started` event (`pid`), then `stdout`/`stderr` events (or `pty` events for a pty process), and answers
 * with ProcEnd when the process has exited and its output is drained. Cancelling the call, or the host going
 * away, only detaches: the process keeps running and `proc.connect` finds it again. Its exit status is kept
 * until a caller has seen it (at most MAX_EXITED_PROCS records, oldest dropped first).
 */
export const ProcStartArgs = Type.Object(
  {
    argv: Argv,
    env: Type.Optional(Env),
    /** Default: the user's home directory when `user` is given, else `/`. */
    cwd: Type.Optional(GuestPath),
    user: Type.Optional(GuestUser),
    tag: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: NO_NUL })),
    /** Run on a new pseudo-terminal of this size (stdin, stdout and stderr are the terminal; TERM=xterm-256color). */
    pty: Type.Optional(PtySize),
    /** Keep stdin open for proc.input (default: stdin is /dev/null). A pty always takes input. */
    stdin: Type.Optional(Type.Boolean()),
    /** SIGKILL the process group after this long (default: no limit). */
    timeout_ms: Type.Optional(TimeoutMs),
  },
  strict,
);
export const ProcEnd = Type.Object({
  pid: Type.Integer({ minimum: 1 }),
  exit_code: Type.Union([Type.Integer(), Type.Null()]),
  signal: Type.Union([Type.String({ maxLength: 32 }), Type.Null()]),
  timed_out: Type.Boolean(),
  /** Set when the process could not be started or was lost (then exit_code and signal are null). */
  error: Type.Union([Type.String(), Type.Null()]),
  duration_ms: Type.Number({ minimum: 0 }),
});
/** Streams like proc.start from now on (a `started` event first); answers at once for a process that ended. */
export const ProcConnectArgs = ProcSelector;
export const ProcInfo = Type.Object({
  pid: Type.Integer({ minimum: 1 }),
  tag: Type.Union([Type.String(), Type.Null()]),
  argv: Type.Array(Type.String()),
  env: Type.Record(Type.String(), Type.String()),
  cwd: Type.String(),
  user: Type.String(),
  pty: Type.Boolean(),
  running: Type.Boolean(),
  exit_code: Type.Union([Type.Integer(), Type.Null()]),
});
export const ProcListArgs = Type.Object({}, strict);
export const ProcListResult = Type.Object({ processes: Type.Array(ProcInfo, { maxItems: MAX_PROCS }) });
/** Request body = bytes for the process's stdin (or its terminal); `eof` then closes stdin. */
export const ProcInputArgs = Type.Object(
  {
    pid: Type.Optional(Type.Integer({ minimum: 1, maximum: 2 ** 22 })),
    tag: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: NO_NUL })),
    eof: Type.Optional(Type.Boolean()),
  },
  strict,
);
export const ProcSignalName = Type.Union(
  ["SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGSTOP", "SIGCONT"].map((s) =>
    Type.Literal(s),
  ),
);
/** Signals the process's whole process group. */
export const ProcSignalArgs = Type.Object(
  {
    pid: Type.Optional(Type.Integer({ minimum: 1, maximum: 2 ** 22 })),
    tag: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: NO_NUL })),
    signal: ProcSignalName,
  },
  strict,
);
export const ProcResizeArgs = Type.Object(
  {
    pid: Type.Optional(Type.Integer({ minimum: 1, maximum: 2 ** 22 })),
    tag: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: NO_NUL })),
    cols: Type.Integer({ minimum: 1, maximum: 1000 }),
    rows: Type.Integer({ minimum: 1, maximum: 1000 }),
  },
  strict,
);

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
/** No request or response body, no `in` frames. */
const plain = { requestBody: "none", responseBody: "none", input: false } as const;

export const OPS = {
  ping: op({ args: PingArgs, result: PingResult, requestBody: "none", responseBody: "none", input: false }),
  stats: op({ args: StatsArgs, result: StatsResult, ...plain }),
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
  "file.mkdir": op({ args: FileMkdirArgs, result: FileMkdirResult, ...plain }),
  "file.move": op({ args: FileMoveArgs, result: FileMoveResult, ...plain }),
  watch: op({ args: WatchArgs, result: WatchResult, ...plain }),
  "context.create": op({ args: ContextCreateArgs, result: ContextInfo, ...plain }),
  "context.list": op({ args: ContextListArgs, result: ContextListResult, ...plain }),
  "context.restart": op({ args: ContextRefArgs, result: ContextInfo, ...plain }),
  "context.remove": op({ args: ContextRefArgs, result: EmptyResult, ...plain }),
  "proc.start": op({ args: ProcStartArgs, result: ProcEnd, ...plain }),
  "proc.connect": op({ args: ProcConnectArgs, result: ProcEnd, ...plain }),
  "proc.list": op({ args: ProcListArgs, result: ProcListResult, ...plain }),
  "proc.input": op({ args: ProcInputArgs, result: EmptyResult, ...plain, requestBody: "bytes" }),
  "proc.signal": op({ args: ProcSignalArgs, result: EmptyResult, ...plain }),
  "proc.resize": op({ args: ProcResizeArgs, result: EmptyResult, ...plain }),
} as const;

export type OpName = keyof typeof OPS;
export type OpArgs<O extends OpName> = Static<(typeof OPS)[O]["args"]>;
export type OpResult<O extends OpName> = Static<(typeof OPS)[O]["result"]>;

export type PingResult = Static<typeof PingResult>;
export type StatsResult = Static<typeof StatsResult>;
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
export type FileMkdirResult = Static<typeof FileMkdirResult>;
export type ContextInfo = Static<typeof ContextInfo>;
export type RichFormats = Static<typeof RichFormats>;
export type DisplayData = Static<typeof DisplayData>;
export type ContextLanguage = Static<typeof ContextLanguage>;
export type FsOp = Static<typeof FsOp>;
export type WatchResult = Static<typeof WatchResult>;
export type ProcStartArgs = Static<typeof ProcStartArgs>;
export type ProcEnd = Static<typeof ProcEnd>;
export type ProcInfo = Static<typeof ProcInfo>;
export type ProcSignalName = Static<typeof ProcSignalName>;
export type PtySize = Static<typeof PtySize>;

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
