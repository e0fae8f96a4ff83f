"""forkd's limits and names, shared with the daemon and the TypeScript SDK.

GENERATED from src/common/limits.ts by `npm run limits:python`: do not edit (a test fails when it is stale).
Durations are milliseconds unless a name says otherwise; patterns are meant for ``re.fullmatch``.
"""

from types import MappingProxyType
from typing import Final, Mapping, Tuple

__all__ = [
    "TAG_PATTERN",
    "SANDBOX_ID_PATTERN",
    "SANDBOX_REF_PATTERN",
    "TEMPLATE_ALIAS_PATTERN",
    "WORKSPACE_NAME_PATTERN",
    "ENV_NAME_PATTERN",
    "MAX_ENV_NAME_CHARS",
    "FILE_MODE_PATTERN",
    "MAX_FILE_MODE",
    "MAX_SPAWN_N",
    "MAX_SANDBOX_TIMEOUT_MS",
    "MAX_GUEST_TIMEOUT_MS",
    "DEFAULT_EXEC_TIMEOUT_SECS",
    "MIN_MEMORY_LIMIT_MIB",
    "MAX_MEMORY_LIMIT_MIB",
    "MIN_CPU_LIMIT_MILLICORES",
    "MAX_CPU_LIMIT_MILLICORES",
    "MIN_PIDS_LIMIT",
    "MAX_PIDS_LIMIT",
    "MIN_DISK_LIMIT_MIB",
    "MAX_DISK_LIMIT_MIB",
    "DEFAULT_MEMORY_OVERHEAD_MIB",
    "DEFAULT_PIDS_LIMIT",
    "DEFAULT_DISK_LIMIT_MIB",
    "MAX_METADATA_ENTRIES",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_VALUE_CHARS",
    "MAX_ENV_VARS",
    "MAX_ENV_BYTES",
    "MAX_POLICY_ENTRIES",
    "ALL_TRAFFIC",
    "MAX_EXEC_ARGS",
    "MAX_EXEC_ARG_CHARS",
    "MAX_EVAL_CODE_CHARS",
    "MAX_PATH_CHARS",
    "STDIN_FRAME_BYTES",
    "MAX_UNREAD_OUTPUT_BYTES",
    "COMMAND_SHELL_ARGV",
    "CONSOLE_READ_BYTES",
    "MAX_CONSOLE_READ_BYTES",
    "MIN_TOKEN_BYTES",
    "DEFAULT_SOCKET_PATH",
    "DEFAULT_DAEMON_URL",
    "DAEMON_URL_ENV",
    "DAEMON_TOKEN_ENV",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "SDK_SANDBOX_TIMEOUT_MS",
    "DEFAULT_COMMAND_TIMEOUT_MS",
    "DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS",
    "GUEST_WORK_GRACE_MS",
    "SPAWN_MS_PER_CHILD",
    "HEALTH_CHECK_TIMEOUT_MS",
    "MAX_RESPONSE_BYTES",
    "MAX_STREAM_RECORD_BYTES",
    "MAX_TEMPLATE_BUILD_STEPS",
    "MAX_TEMPLATE_STEP_ARGS",
    "MAX_TEMPLATE_STEP_ARG_CHARS",
    "MAX_TEMPLATE_CPU_COUNT",
    "DEFAULT_TEMPLATE_CPU_COUNT",
    "MIN_TEMPLATE_MEMORY_MIB",
    "MAX_TEMPLATE_MEMORY_MIB",
    "DEFAULT_TEMPLATE_MEMORY_MIB",
    "DEFAULT_TEMPLATE_DISK_MIB",
    "MAX_TEMPLATE_DISK_MIB",
    "MAX_TEMPLATE_UPLOAD_BYTES",
    "MAX_TEMPLATE_UNPACKED_BYTES",
    "MAX_TEMPLATE_UPLOAD_ENTRIES",
    "GUEST_USER_NAME_PATTERN",
    "MAX_TEMPLATE_COMMAND_CHARS",
    "MAX_TEMPLATE_COMMAND_ARGV",
    "MAX_TEMPLATE_COMMAND_ENV",
    "MAX_TEMPLATE_ENV_VALUE_CHARS",
    "MAX_GUEST_CWD_CHARS",
    "MIN_READY_TIMEOUT_S",
    "MAX_READY_TIMEOUT_S",
    "DEFAULT_READY_TIMEOUT_S",
    "MIN_READY_INTERVAL_MS",
    "MAX_READY_INTERVAL_MS",
    "DEFAULT_READY_INTERVAL_MS",
    "NDJSON_CONTENT_TYPE",
    "PACK_CONTENT_TYPE",
    "PACK_CHAIN_HEADER",
    "ERROR_CODES",
]

# --- Names

#: Snapshot tags and template names: one safe path component (no '/', no leading '.' or '-').
TAG_PATTERN: Final[str] = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

#: The ids this daemon gives sandboxes.
SANDBOX_ID_PATTERN: Final[str] = "^sb-[0-9a-f]{12}$"

#: Any name a caller may ask about as a sandbox: a safe path component. Our ids match SANDBOX_ID_PATTERN; another
#: (e.g. forkd v0.5's sb-<hex>-<hex>) is an unknown sandbox, not a bad request.
SANDBOX_REF_PATTERN: Final[str] = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

#: E2B template names and aliases (they may carry ':' and '/', like image references).
TEMPLATE_ALIAS_PATTERN: Final[str] = "^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"

#: forkd v0.5's workspace names.
WORKSPACE_NAME_PATTERN: Final[str] = "^[A-Za-z0-9_-]{1,64}$"

#: Environment variable names (a sandbox's, a command's).
ENV_NAME_PATTERN: Final[str] = "^[A-Za-z_][A-Za-z0-9_]*$"

#: Longest environment variable name a sandbox keeps.
MAX_ENV_NAME_CHARS: Final[int] = 256

#: Permission bits of a written file, in octal ("644", "0755").
FILE_MODE_PATTERN: Final[str] = "^0?[0-7]{3,4}$"

#: Permission bits as a number: at most 0o7777.
MAX_FILE_MODE: Final[int] = 4095

# --- Spawns and lifetimes

#: The largest fan-out one spawn (or fork) asks for (forkd v0.5's sanity cap, kept).
MAX_SPAWN_N: Final[int] = 1000

#: The longest lifetime a sandbox may be given.
MAX_SANDBOX_TIMEOUT_MS: Final[int] = 604800000

#: The longest timeout of one call into a guest (a command, an evaluation); "no limit" is sent as this.
MAX_GUEST_TIMEOUT_MS: Final[int] = 86400000

#: forkd v0.5's command timeout when a request names none, in seconds.
DEFAULT_EXEC_TIMEOUT_SECS: Final[int] = 30

# --- What a sandbox may use of the host (docs/security.md, Limits)

MIN_MEMORY_LIMIT_MIB: Final[int] = 64

MAX_MEMORY_LIMIT_MIB: Final[int] = 1048576

MIN_CPU_LIMIT_MILLICORES: Final[int] = 10

MAX_CPU_LIMIT_MILLICORES: Final[int] = 256000

MIN_PIDS_LIMIT: Final[int] = 16

MAX_PIDS_LIMIT: Final[int] = 65536

MIN_DISK_LIMIT_MIB: Final[int] = 16

MAX_DISK_LIMIT_MIB: Final[int] = 1048576

#: Memory for QEMU itself on top of the guest's RAM by default: its translation cache (16 MiB by default under TCG),
#: device models, I/O buffers; a child measured 34 MiB of PSS all told. The guest's own pages can never exceed its
#: RAM, so the default only stops QEMU itself from growing without bound.
DEFAULT_MEMORY_OVERHEAD_MIB: Final[int] = 256

#: Threads QEMU may have by default: its block layer's worker pool grows to 64 threads under parallel I/O, plus one
#: per vCPU and a handful of its own. A guest that pushes past it only makes its own QEMU fail.
DEFAULT_PIDS_LIMIT: Final[int] = 128

#: The writable disk layer a sandbox may grow to by default (`forkd daemon --disk-limit-mib`).
DEFAULT_DISK_LIMIT_MIB: Final[int] = 2048

# --- What a caller attaches to a sandbox

MAX_METADATA_ENTRIES: Final[int] = 64

MAX_METADATA_KEY_CHARS: Final[int] = 128

MAX_METADATA_VALUE_CHARS: Final[int] = 1024

MAX_ENV_VARS: Final[int] = 256

#: Sandbox env vars ride in every process start's request header to the guest agent (64 KiB), next to argv and the
#: call's own env: they may take this much of it.
MAX_ENV_BYTES: Final[int] = 24576

#: Entries of one egress list (allow_out, deny_out).
MAX_POLICY_ENTRIES: Final[int] = 512

#: E2B's ALL_TRAFFIC: in a deny list it means "deny whatever no allow entry names" (egress "deny").
ALL_TRAFFIC: Final[str] = "0.0.0.0/0"

# --- Calls into the guest

#: Argument vectors: Linux caps one argument at 128 KiB (MAX_ARG_STRLEN).
MAX_EXEC_ARGS: Final[int] = 4096

MAX_EXEC_ARG_CHARS: Final[int] = 131072

#: Python source of one eval, in characters.
MAX_EVAL_CODE_CHARS: Final[int] = 1048576

#: Longest path any file call accepts (Linux PATH_MAX).
MAX_PATH_CHARS: Final[int] = 4096

#: Stdin bytes per NDJSON frame of a streamed-stdin exec (base64 in one line, well under the daemon's line limit).
STDIN_FRAME_BYTES: Final[int] = 262144

#: Output buffered for a client that reads slower than a process (or a cell) writes. Past this the call is cancelled
#: rather than holding unbounded memory in a root daemon.
MAX_UNREAD_OUTPUT_BYTES: Final[int] = 8388608

#: How the SDKs and the MCP server run a command line (`sandbox.commands.run`, `run_command`): bash -c LINE.
COMMAND_SHELL_ARGV: Final[Tuple[str, ...]] = ("/bin/bash", "-c")

#: What GET /v1/sandboxes/:id/console returns by default, and at most (bytes of the console's end).
CONSOLE_READ_BYTES: Final[int] = 65536

MAX_CONSOLE_READ_BYTES: Final[int] = 4194304

# --- Tokens

#: Bearer tokens (the daemon's, the MCP server's) are at least this long: guessing is out of reach for any online
#: attacker, and forkd v0.5 tokens of that size keep working.
MIN_TOKEN_BYTES: Final[int] = 16

# --- Clients: where the daemon is and how long to wait for it

#: The daemon's Unix socket, and the address clients use when they are given none.
DEFAULT_SOCKET_PATH: Final[str] = "/run/forkd/forkd.sock"

DEFAULT_DAEMON_URL: Final[str] = "unix:/run/forkd/forkd.sock"

#: Environment variables every client reads: the daemon's address and its bearer token.
DAEMON_URL_ENV: Final[str] = "FORKD_URL"

DAEMON_TOKEN_ENV: Final[str] = "FORKD_TOKEN"

#: One HTTP exchange with the daemon; distinct from a sandbox's lifetime and a command's timeout.
DEFAULT_REQUEST_TIMEOUT_MS: Final[int] = 60000

#: The lifetime the SDKs (and the E2B API) give a sandbox unless told otherwise, like the SDKs agents already use: a
#: sandbox nobody extends dies after five minutes. (The daemon's own default for a spawn naming none is no limit.)
SDK_SANDBOX_TIMEOUT_MS: Final[int] = 300000

#: A command (or an evaluation) an SDK runs is killed in the guest after this long unless told otherwise.
DEFAULT_COMMAND_TIMEOUT_MS: Final[int] = 60000

#: Building an image, booting and warming a parent takes minutes under TCG.
DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS: Final[int] = 1800000

#: Network allowance on top of a command's own timeout, for calls that wait for guest work.
GUEST_WORK_GRACE_MS: Final[int] = 10000

#: Deadline allowance per child of a spawn request, on top of the request timeout.
SPAWN_MS_PER_CHILD: Final[int] = 1000

#: The health check (GET /healthz) a client makes after a dropped connection.
HEALTH_CHECK_TIMEOUT_MS: Final[int] = 2000

#: Larger answers are refused rather than buffered (the daemon's own limits are far lower).
MAX_RESPONSE_BYTES: Final[int] = 1073741824

#: A streamed record (an NDJSON line, an SSE event) longer than this is a broken or hostile stream.
MAX_STREAM_RECORD_BYTES: Final[int] = 16777216

# --- Template builds (E2B's Template.build; docs/e2b.md, Template builds)

#: Instructions one build may send.
MAX_TEMPLATE_BUILD_STEPS: Final[int] = 1000

#: Arguments of one instruction, and characters of one argument (a RUN's command, a start or ready command).
MAX_TEMPLATE_STEP_ARGS: Final[int] = 64

MAX_TEMPLATE_STEP_ARG_CHARS: Final[int] = 65536

#: What a template's sandboxes (and its build's parent VM) may be given; the defaults when a build names none.
MAX_TEMPLATE_CPU_COUNT: Final[int] = 8

DEFAULT_TEMPLATE_CPU_COUNT: Final[int] = 1

MIN_TEMPLATE_MEMORY_MIB: Final[int] = 128

MAX_TEMPLATE_MEMORY_MIB: Final[int] = 16384

DEFAULT_TEMPLATE_MEMORY_MIB: Final[int] = 1024

#: The disk of a template's image: the default, and the largest `minFreeDiskMb` may make it.
DEFAULT_TEMPLATE_DISK_MIB: Final[int] = 4096

MAX_TEMPLATE_DISK_MIB: Final[int] = 65536

#: One uploaded archive of a build's files: bytes as sent, bytes unpacked, entries.
MAX_TEMPLATE_UPLOAD_BYTES: Final[int] = 1073741824

MAX_TEMPLATE_UNPACKED_BYTES: Final[int] = 4294967296

MAX_TEMPLATE_UPLOAD_ENTRIES: Final[int] = 100000

# --- A template's start and ready commands (format 2 `[start]`/`[ready]`, E2B's setStartCmd)

#: A user a start or ready command runs as: a name of the image's passwd (the guest agent takes names).
GUEST_USER_NAME_PATTERN: Final[str] = "^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"

#: Characters of a command (a shell command, or one argv item), argv items, env entries, an env value, a cwd.
MAX_TEMPLATE_COMMAND_CHARS: Final[int] = 65536

MAX_TEMPLATE_COMMAND_ARGV: Final[int] = 1024

MAX_TEMPLATE_COMMAND_ENV: Final[int] = 256

MAX_TEMPLATE_ENV_VALUE_CHARS: Final[int] = 32768

MAX_GUEST_CWD_CHARS: Final[int] = 1024

#: How long a ready command may take to succeed (seconds), and the pause between two of its attempts (ms).
MIN_READY_TIMEOUT_S: Final[int] = 1

MAX_READY_TIMEOUT_S: Final[int] = 3600

DEFAULT_READY_TIMEOUT_S: Final[int] = 300

MIN_READY_INTERVAL_MS: Final[int] = 50

MAX_READY_INTERVAL_MS: Final[int] = 60000

DEFAULT_READY_INTERVAL_MS: Final[int] = 500

# --- Wire names

#: The streamed exec's request and answer (one JSON document per line).
NDJSON_CONTENT_TYPE: Final[str] = "application/x-ndjson"

#: Snapshot packs (forkd pack, GET /v1/snapshots/:tag/pack, POST /v1/snapshots/unpack).
PACK_CONTENT_TYPE: Final[str] = "application/zstd"

#: The header of a pack download naming its chain, root first, comma-separated.
PACK_CHAIN_HEADER: Final[str] = "x-forkd-pack-chain"

# --- Errors

#: The error codes of every layer, each with the HTTP status the API answers with, so the CLI, the REST API and the
#: SDKs agree on what a failure means. An error body is `{"error": message, "code": one of these}`.
ERROR_CODES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "invalid_argument": 400,
        "unauthorized": 401,
        "forbidden": 403,
        "not_found": 404,
        "conflict": 409,
        "payload_too_large": 413,
        "unprocessable": 422,
        "too_many_requests": 429,
        "internal": 500,
        "not_implemented": 501,
        "unavailable": 503,
        "timeout": 504,
        "insufficient_storage": 507,
    }
)
