/**
 * forkd's limits and names, declared once for every end: the daemon (controller, API schemas, E2B), the CLI, the
 * MCP server and both SDKs. This module imports nothing, so the TypeScript SDK ships it as it is (the only file
 * outside src/sdk the SDK may import) and loading it loads no engine. The Python SDK's copy,
 * sdk/python/forkd/_limits.py, is generated from it (`npm run limits:python`; a test fails when it is stale).
 *
 * Only plain values live here: numbers, strings, and the error catalogue. Durations are in milliseconds unless the
 * name says otherwise. Patterns are anchored JavaScript regular expressions written so that Python's `re` reads them
 * alike (no `.`, `\d`, `\w`, `\s`, lookarounds); the generator refuses any other.
 */

// --- Names -------------------------------------------------------------------------------------------------------

/** Snapshot tags and template names: one safe path component (no '/', no leading '.' or '-'). */
export const TAG_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";
/** The ids this daemon gives sandboxes. */
export const SANDBOX_ID_PATTERN = "^sb-[0-9a-f]{12}$";
/**
 * Any name a caller may ask about as a sandbox: a safe path component. Our ids match SANDBOX_ID_PATTERN; another
 * (e.g. forkd v0.5's sb-<hex>-<hex>) is an unknown sandbox, not a bad request.
 */
export const SANDBOX_REF_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$";
/** E2B template names and aliases (they may carry ':' and '/', like image references). */
export const TEMPLATE_ALIAS_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$";
/** forkd v0.5's workspace names. */
export const WORKSPACE_NAME_PATTERN = "^[A-Za-z0-9_-]{1,64}$";
/** Environment variable names (a sandbox's, a command's). */
export const ENV_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*$";
/** Longest environment variable name a sandbox keeps. */
export const MAX_ENV_NAME_CHARS = 256;
/** Permission bits of a written file, in octal ("644", "0755"). */
export const FILE_MODE_PATTERN = "^0?[0-7]{3,4}$";
/** Permission bits as a number: at most 0o7777. */
export const MAX_FILE_MODE = 0o7777;

// --- Spawns and lifetimes ----------------------------------------------------------------------------------------

/** The largest fan-out one spawn (or fork) asks for (forkd v0.5's sanity cap, kept). */
export const MAX_SPAWN_N = 1000;
/** The longest lifetime a sandbox may be given. */
export const MAX_SANDBOX_TIMEOUT_MS = 7 * 24 * 3_600_000;
/** The longest timeout of one call into a guest (a command, an evaluation); "no limit" is sent as this. */
export const MAX_GUEST_TIMEOUT_MS = 24 * 3_600_000;
/** forkd v0.5's command timeout when a request names none, in seconds. */
export const DEFAULT_EXEC_TIMEOUT_SECS = 30;

// --- What a sandbox may use of the host (docs/security.md, Limits) ------------------------------------------------

export const MIN_MEMORY_LIMIT_MIB = 64;
export const MAX_MEMORY_LIMIT_MIB = 1024 * 1024;
export const MIN_CPU_LIMIT_MILLICORES = 10;
export const MAX_CPU_LIMIT_MILLICORES = 256_000;
export const MIN_PIDS_LIMIT = 16;
export const MAX_PIDS_LIMIT = 65_536;
export const MIN_DISK_LIMIT_MIB = 16;
export const MAX_DISK_LIMIT_MIB = 1024 * 1024;
/**
 * Memory for QEMU itself on top of the guest's RAM by default: its translation cache (16 MiB by default under
 * TCG), device models, I/O buffers; a child measured 34 MiB of PSS all told. The guest's own pages can never
 * exceed its RAM, so the default only stops QEMU itself from growing without bound.
 */
export const DEFAULT_MEMORY_OVERHEAD_MIB = 256;
/**
 * Threads QEMU may have by default: its block layer's worker pool grows to 64 threads under parallel I/O, plus
 * one per vCPU and a handful of its own. A guest that pushes past it only makes its own QEMU fail.
 */
export const DEFAULT_PIDS_LIMIT = 128;
/** The writable disk layer a sandbox may grow to by default (`forkd daemon --disk-limit-mib`). */
export const DEFAULT_DISK_LIMIT_MIB = 2048;

// --- What a caller attaches to a sandbox -------------------------------------------------------------------------

export const MAX_METADATA_ENTRIES = 64;
export const MAX_METADATA_KEY_CHARS = 128;
export const MAX_METADATA_VALUE_CHARS = 1024;
export const MAX_ENV_VARS = 256;
/**
 * Sandbox env vars ride in every process start's request header to the guest agent (64 KiB), next to argv and
 * the call's own env: they may take this much of it.
 */
export const MAX_ENV_BYTES = 24 * 1024;
/** Entries of one egress list (allow_out, deny_out). */
export const MAX_POLICY_ENTRIES = 512;
/** E2B's ALL_TRAFFIC: in a deny list it means "deny whatever no allow entry names" (egress "deny"). */
export const ALL_TRAFFIC = "0.0.0.0/0";

// --- Calls into the guest ----------------------------------------------------------------------------------------

/** Argument vectors: Linux caps one argument at 128 KiB (MAX_ARG_STRLEN). */
export const MAX_EXEC_ARGS = 4096;
export const MAX_EXEC_ARG_CHARS = 128 * 1024;
/** Python source of one eval, in characters. */
export const MAX_EVAL_CODE_CHARS = 1024 * 1024;
/** Longest path any file call accepts (Linux PATH_MAX). */
export const MAX_PATH_CHARS = 4096;
/** Stdin bytes per NDJSON frame of a streamed-stdin exec (base64 in one line, well under the daemon's line limit). */
export const STDIN_FRAME_BYTES = 256 * 1024;
/**
 * Output buffered for a client that reads slower than a process (or a cell) writes. Past this the call is cancelled
 * rather than holding unbounded memory in a root daemon.
 */
export const MAX_UNREAD_OUTPUT_BYTES = 8 * 1024 * 1024;
/** How the SDKs and the MCP server run a command line (`sandbox.commands.run`, `run_command`): bash -c LINE. */
export const COMMAND_SHELL_ARGV = ["/bin/bash", "-c"] as const;
/** What GET /v1/sandboxes/:id/console returns by default, and at most (bytes of the console's end). */
export const CONSOLE_READ_BYTES = 64 * 1024;
export const MAX_CONSOLE_READ_BYTES = 4 * 1024 * 1024;

// --- Tokens ------------------------------------------------------------------------------------------------------

/**
 * Bearer tokens (the daemon's, the MCP server's) are at least this long: guessing is out of reach for any online
 * attacker, and forkd v0.5 tokens of that size keep working.
 */
export const MIN_TOKEN_BYTES = 16;

// --- Clients: where the daemon is and how long to wait for it -----------------------------------------------------

/** The daemon's Unix socket, and the address clients use when they are given none. */
export const DEFAULT_SOCKET_PATH = "/run/forkd/forkd.sock";
export const DEFAULT_DAEMON_URL = `unix:${DEFAULT_SOCKET_PATH}`;
/** Environment variables every client reads: the daemon's address and its bearer token. */
export const DAEMON_URL_ENV = "FORKD_URL";
export const DAEMON_TOKEN_ENV = "FORKD_TOKEN";
/** One HTTP exchange with the daemon; distinct from a sandbox's lifetime and a command's timeout. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
/**
 * The lifetime the SDKs (and the E2B API) give a sandbox unless told otherwise, like the SDKs agents already use:
 * a sandbox nobody extends dies after five minutes. (The daemon's own default for a spawn naming none is no limit.)
 */
export const SDK_SANDBOX_TIMEOUT_MS = 300_000;
/** A command (or an evaluation) an SDK runs is killed in the guest after this long unless told otherwise. */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;
/** Building an image, booting and warming a parent takes minutes under TCG. */
export const DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS = 30 * 60_000;
/** Network allowance on top of a command's own timeout, for calls that wait for guest work. */
export const GUEST_WORK_GRACE_MS = 10_000;
/** Deadline allowance per child of a spawn request, on top of the request timeout. */
export const SPAWN_MS_PER_CHILD = 1_000;
/** The health check (GET /healthz) a client makes after a dropped connection. */
export const HEALTH_CHECK_TIMEOUT_MS = 2_000;
/** Larger answers are refused rather than buffered (the daemon's own limits are far lower). */
export const MAX_RESPONSE_BYTES = 1024 * 1024 * 1024;
/** A streamed record (an NDJSON line, an SSE event) longer than this is a broken or hostile stream. */
export const MAX_STREAM_RECORD_BYTES = 16 * 1024 * 1024;

// --- Template builds (E2B's Template.build; docs/e2b.md, Template builds) ------------------------------------------

/** Instructions one build may send. */
export const MAX_TEMPLATE_BUILD_STEPS = 1000;
/** Arguments of one instruction, and characters of one argument (a RUN's command, a start or ready command). */
export const MAX_TEMPLATE_STEP_ARGS = 64;
export const MAX_TEMPLATE_STEP_ARG_CHARS = 64 * 1024;
/** What a template's sandboxes (and its build's parent VM) may be given; the defaults when a build names none. */
export const MAX_TEMPLATE_CPU_COUNT = 8;
export const DEFAULT_TEMPLATE_CPU_COUNT = 1;
export const MIN_TEMPLATE_MEMORY_MIB = 128;
export const MAX_TEMPLATE_MEMORY_MIB = 16 * 1024;
export const DEFAULT_TEMPLATE_MEMORY_MIB = 1024;
/** The disk of a template's image: the default, and the largest `minFreeDiskMb` may make it. */
export const DEFAULT_TEMPLATE_DISK_MIB = 4096;
export const MAX_TEMPLATE_DISK_MIB = 64 * 1024;
/** One uploaded archive of a build's files: bytes as sent, bytes unpacked, entries. */
export const MAX_TEMPLATE_UPLOAD_BYTES = 1024 * 1024 * 1024;
export const MAX_TEMPLATE_UNPACKED_BYTES = 4 * 1024 * 1024 * 1024;
export const MAX_TEMPLATE_UPLOAD_ENTRIES = 100_000;

// --- A template's start and ready commands (format 2 `[start]`/`[ready]`, E2B's setStartCmd) -----------------------
// Declared here because a snapshot's manifest records them too (the store checks them when it reads one).

/** A user a start or ready command runs as: a name of the image's passwd (the guest agent takes names). */
export const GUEST_USER_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_.-]{0,31}$";
/** Characters of a command (a shell command, or one argv item), argv items, env entries, an env value, a cwd. */
export const MAX_TEMPLATE_COMMAND_CHARS = 64 * 1024;
export const MAX_TEMPLATE_COMMAND_ARGV = 1024;
export const MAX_TEMPLATE_COMMAND_ENV = 256;
export const MAX_TEMPLATE_ENV_VALUE_CHARS = 32 * 1024;
export const MAX_GUEST_CWD_CHARS = 1024;
/** How long a ready command may take to succeed (seconds), and the pause between two of its attempts (ms). */
export const MIN_READY_TIMEOUT_S = 1;
export const MAX_READY_TIMEOUT_S = 3600;
export const DEFAULT_READY_TIMEOUT_S = 300;
export const MIN_READY_INTERVAL_MS = 50;
export const MAX_READY_INTERVAL_MS = 60_000;
export const DEFAULT_READY_INTERVAL_MS = 500;

// --- Wire names --------------------------------------------------------------------------------------------------

/** The streamed exec's request and answer (one JSON document per line). */
export const NDJSON_CONTENT_TYPE = "application/x-ndjson";
/** Snapshot packs (forkd pack, GET /v1/snapshots/:tag/pack, POST /v1/snapshots/unpack). */
export const PACK_CONTENT_TYPE = "application/zstd";
/** The header of a pack download naming its chain, root first, comma-separated. */
export const PACK_CHAIN_HEADER = "x-forkd-pack-chain";

// --- Errors ------------------------------------------------------------------------------------------------------

/**
 * The error codes of every layer, each with the HTTP status the API answers with, so the CLI, the REST API and
 * the SDKs agree on what a failure means. An error body is `{"error": message, "code": one of these}`.
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
  /** A bounded store is full (a node's durable pauses). */
  insufficient_storage: 507,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;
