/**
 * The REST API's wire contract, declared once: these TypeBox schemas validate every request (src/api/validation.ts)
 * and generate the OpenAPI document (docs/openapi.json). Field names are snake_case and follow forkd v0.5 where
 * the route existed there (see docs/api.md, "Compatibility").
 */
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { MAX_FILE_BYTES, MAX_HEADER_BYTES } from "../agent/protocol/limits.js";
import {
  CONSOLE_READ_BYTES,
  DEFAULT_MEMORY_OVERHEAD_MIB,
  DEFAULT_PIDS_LIMIT,
  ENV_NAME_PATTERN,
  ERROR_CODES,
  FILE_MODE_PATTERN,
  MAX_CONSOLE_READ_BYTES,
  MAX_CPU_LIMIT_MILLICORES,
  MAX_DISK_LIMIT_MIB,
  MAX_ENV_BYTES,
  MAX_ENV_VARS,
  MAX_EVAL_CODE_CHARS,
  MAX_EXEC_ARG_CHARS,
  MAX_EXEC_ARGS,
  MAX_GUEST_TIMEOUT_MS,
  MAX_MEMORY_LIMIT_MIB,
  MAX_METADATA_ENTRIES,
  MAX_METADATA_KEY_CHARS,
  MAX_METADATA_VALUE_CHARS,
  MAX_PATH_CHARS,
  MAX_PIDS_LIMIT,
  MAX_POLICY_ENTRIES,
  MAX_SANDBOX_TIMEOUT_MS,
  MAX_SPAWN_N,
  MIN_CPU_LIMIT_MILLICORES,
  MIN_DISK_LIMIT_MIB,
  MIN_MEMORY_LIMIT_MIB,
  MIN_PIDS_LIMIT,
  SANDBOX_ID_PATTERN,
  SANDBOX_REF_PATTERN,
  TAG_PATTERN,
  TEMPLATE_ALIAS_PATTERN,
} from "../common/limits.js";

/**
 * argv, env and cwd travel in the guest agent's request header (MAX_HEADER_BYTES); this leaves room for the rest
 * of the header. Larger inputs belong in stdin or a file.
 */
export const MAX_EXEC_REQUEST_BYTES = MAX_HEADER_BYTES - 4096;
/** Largest file a PUT accepts or a GET returns: one agent frame's payload. */
export const MAX_FILE_TRANSFER_BYTES = MAX_FILE_BYTES;

const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);
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

const TimeoutMs = Type.Integer({ minimum: 1, maximum: MAX_GUEST_TIMEOUT_MS, description: "Milliseconds." });
const TimeoutSecs = Type.Integer({
  minimum: 1,
  maximum: MAX_GUEST_TIMEOUT_MS / 1000,
  description: "Seconds (v0.5 form; use timeout_ms for finer control). Not both.",
});

/**
 * v0.5 fields whose feature forkd does not have yet: accepted when false/absent, answered 501 when true so an
 * existing client learns why instead of silently getting something else.
 */
const NotBuiltFlag = (what: string) =>
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

// ---------------------------------------------------------------------------------------------------------------
// Snapshots

/** An egress policy as the daemon reports it (every field present). */
export const EgressPolicyOut = Type.Object({
  egress: Type.Union([Type.Literal("allow"), Type.Literal("deny")]),
  allow_out: Type.Array(Type.String()),
  deny_out: Type.Array(Type.String()),
});

export const SnapshotInfoWire = Type.Object(
  {
    tag: Type.String(),
    dir: Type.String({ description: "Where the snapshot lives on the daemon's host." }),
    created_at_unix: Type.Integer(),
    status: Type.Union([Type.Literal("writing"), Type.Literal("ready"), Type.Literal("failed")]),
    bootable: Type.Boolean(),
    template: Nullable(Type.String()),
    accelerator: Nullable(Type.Union([Type.Literal("kvm"), Type.Literal("tcg")])),
    memory_mib: Nullable(Type.Integer()),
    parent_tag: Nullable(Type.String()),
    bytes: Type.Integer({ description: "Bytes the snapshot's files take (logical sizes)." }),
    error: Nullable(Type.String()),
    vcpus: Nullable(Type.Integer({ description: "vCPUs of the machine its children run on." })),
    source_sandbox: Nullable(Type.String({ description: "The sandbox it was BRANCHed from." })),
    aliases: Type.Array(Type.String(), { description: "Template aliases naming it." }),
    ephemeral: Type.Boolean({
      description: "Made by the daemon for a fork (or superseded under its alias): deleted once unused.",
    }),
    owner: Nullable(
      Type.String({ description: "The tenant that owns it (docs/security.md#tenancy); null: an admin's." }),
    ),
    origin: Nullable(
      Type.Union(
        [Type.Literal("template"), Type.Literal("branch"), Type.Literal("compact"), Type.Literal("pause")],
        {
          description:
            "Booted from a template, BRANCHed from a sandbox, compacted from a chain, or a sandbox's paused " +
            "state; null if not on disk.",
        },
      ),
    ),
    branch_mode: Nullable(
      Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")], {
        description: "A branch's mode: full stands alone, diff and live are layers on parent_tag.",
      }),
    ),
    disk_bytes: Type.Integer({
      description:
        "Bytes its own files occupy on disk (allocated blocks: sparse RAM images count what is stored).",
    }),
    egress_default: Type.Union([EgressPolicyOut, Type.Null()], {
      description:
        "The egress policy its sandboxes get when a spawn names none, from its template's [egress] (fields a " +
        "spawn's policy leaves out come from it too); null: the daemon's --egress.",
    }),
  },
  { description: "SnapshotInfo (v0.5 fields tag, dir, created_at_unix, status, bootable)." },
);
export type SnapshotInfoWire = Static<typeof SnapshotInfoWire>;

const ByteCounts = {
  logical_bytes: Type.Integer({ description: "RAM size (memory) or qcow2 virtual size (disk)." }),
  physical_bytes: Type.Integer({ description: "Bytes the file occupies on disk (st_blocks * 512)." }),
};

export const LayerUsageWire = Type.Object(
  {
    tag: Type.String(),
    origin: Type.String({ description: "template, branch or compact" }),
    memory: Type.Object({
      format: Type.Union([Type.Literal("flat"), Type.Literal("layer")]),
      pages: Type.Integer({ description: "Pages stored in this layer's memory file." }),
      ...ByteCounts,
    }),
    disk: Type.Object({
      ...ByteCounts,
      backing: Nullable(Type.String({ description: "The layer's backing file, as recorded (relative)." })),
    }),
    vmstate_bytes: Type.Integer(),
  },
  { description: "One layer of a snapshot chain and what it takes on disk." },
);

export const SnapshotDetailWire = Type.Composite(
  [
    SnapshotInfoWire,
    Type.Object({
      chain_depth: Type.Integer({ description: "0 for a base snapshot, 1 for one parent, ..." }),
      parent_content_hash: Nullable(
        Type.String({ description: "sha256 of the parent's manifest, as this snapshot recorded it." }),
      ),
      ancestors: Type.Array(Type.String(), { description: "Tags from the chain root to the parent." }),
      dependents: Type.Array(Type.String(), { description: "Snapshots whose parent_tag is this one." }),
      all_dependents: Type.Array(Type.String(), {
        description: "Every snapshot depending on this one, directly or not (parents before children).",
      }),
      layers: Type.Array(LayerUsageWire, { description: "Root first, this snapshot last." }),
      chain_bytes: Type.Object(
        { memory_physical: Type.Integer(), disk_physical: Type.Integer(), vmstate: Type.Integer() },
        { description: "Bytes on disk a child of this snapshot reads from, over the whole chain." },
      ),
      memory_logical_bytes: Type.Integer({ description: "v0.5 name: this snapshot's RAM size." }),
      memory_physical_bytes: Type.Integer({ description: "v0.5 name: its memory file's bytes on disk." }),
      vmstate_bytes: Type.Integer(),
      chain_error: Nullable(
        Type.String({ description: "Why the chain cannot be restored (missing/changed parent), or null." }),
      ),
    }),
  ],
  { description: "GET /v1/snapshots/:tag/info (v0.5's SnapshotInfoDetail plus per-layer bytes)." },
);

export const CreateSnapshotBody = Type.Object(
  {
    tag: Tag,
    template: Type.Optional(
      Type.String({ pattern: TAG_PATTERN, description: "Template name (default: the tag)." }),
    ),
    kernel: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: MAX_PATH_CHARS,
        description:
          "forkd v0.5 field: a kernel on the daemon's host. Accepted when kernel and rootfs are the vmlinuz and " +
          "rootfs.ext4 of one built forkd image in an allowed image directory (the image cache, plus " +
          "`forkd daemon --allow-image-dir`); the snapshot is then made from that image. Anything else is 400.",
      }),
    ),
    rootfs: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: MAX_PATH_CHARS,
        description:
          "forkd v0.5 field: the root filesystem next to `kernel` (see there). Not without kernel.",
      }),
    ),
    rw: Type.Optional(
      Type.Boolean({ description: "forkd v0.5 field; ignored (the image's root is mounted read-write)." }),
    ),
    tap: Type.Optional(Nullable(Type.String({ description: "forkd v0.5 field; 501 when given." }))),
    boot_wait_secs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 60,
        description: "forkd v0.5 field; ignored (readiness is signalled).",
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateSnapshotBody = Static<typeof CreateSnapshotBody>;

export const DeleteSnapshotQuery = Type.Object(
  {
    cascade: Type.Optional(
      Type.Boolean({ description: "Delete every snapshot depending on this one too (leaves first)." }),
    ),
    force: Type.Optional(
      Type.Boolean({ description: "Delete it and leave its dependents orphaned (unbootable, they say so)." }),
    ),
  },
  { additionalProperties: false },
);

/**
 * Largest pack `POST /v1/snapshots/unpack` receives (a chain with its guest image; controller/snapshots/unpack.ts
 * bounds each file).
 */
export const MAX_PACK_UPLOAD_BYTES = 256 * 1024 ** 3;

export const PackQuery = Type.Object(
  {
    without_image: Type.Optional(
      Type.Boolean({
        description: "Leave the guest image out (the pack then unpacks only where that image build exists).",
      }),
    ),
    level: Type.Optional(Type.Integer({ minimum: 1, maximum: 19, description: "zstd level (default 3)." })),
  },
  { additionalProperties: false },
);

export const UnpackQuery = Type.Object(
  {
    tag: Type.Optional(
      Type.String({
        pattern: TAG_PATTERN,
        description: "Install the head under this tag (ancestors keep theirs).",
      }),
    ),
    force: Type.Optional(
      Type.Boolean({
        description: "Replace existing snapshots of the same tags that differ from the packed ones.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const UnpackResultWire = Type.Object({
  head: Type.String(),
  chain: Type.Array(Type.String(), { description: "Root first, as installed." }),
  installed: Type.Array(Type.String()),
  reused: Type.Array(Type.String(), { description: "Layers already present, identical, and kept." }),
  replaced: Type.Array(Type.String(), { description: "Existing snapshots replaced (force)." }),
  orphaned: Type.Array(Type.String(), { description: "Local snapshots left unbootable by a replacement." }),
  image: Type.Union([Type.Literal("installed"), Type.Literal("present")]),
  content_bytes: Type.Integer(),
  ms: Type.Number(),
});

export const CompactSnapshotBody = Type.Object(
  {
    to: Type.String({ pattern: TAG_PATTERN, description: "Tag of the new flat snapshot (must not exist)." }),
  },
  { additionalProperties: false },
);
export type CompactSnapshotBody = Static<typeof CompactSnapshotBody>;

// ---------------------------------------------------------------------------------------------------------------
// Network

const PolicyEntries = (what: string) =>
  Type.Optional(
    Type.Array(Type.String({ minLength: 1, maxLength: 260 }), {
      maxItems: MAX_POLICY_ENTRIES,
      description: `${what}: IPv4 addresses, CIDR blocks (a.b.c.d/n), domain names, or *.domain wildcards (every name below the domain).`,
    }),
  );

export const EgressPolicyWire = Type.Object(
  {
    egress: Type.Optional(
      Type.Union([Type.Literal("allow"), Type.Literal("deny")], {
        description:
          "What happens to destinations no entry names (default: the daemon's --egress). deny_out containing " +
          "0.0.0.0/0 means deny, as in E2B.",
      }),
    ),
    allow_out: PolicyEntries("Allowed destinations; an allow entry wins over a deny entry"),
    deny_out: PolicyEntries("Denied destinations"),
  },
  {
    additionalProperties: false,
    description:
      "Egress policy (E2B's allowInternetAccess / allowOut / denyOut). Domain entries act through the sandbox's " +
      "DNS: only allowed names resolve, and their answers become reachable for the answer's TTL. Other sandboxes, " +
      "the host and the daemon are never reachable, whatever the policy. See docs/network.md.",
  },
);
export type EgressPolicyWire = Static<typeof EgressPolicyWire>;

export const SandboxNetworkWire = Type.Object(
  {
    kind: Type.Union([Type.Literal("netns"), Type.Literal("private"), Type.Literal("none")], {
      description:
        "netns: its own network namespace with an uplink and an egress policy; private: a NIC with no uplink " +
        '(spawned with network "none", or the daemon runs isolated); none: no NIC (its template has network = "none").',
    }),
    address: Nullable(
      Type.String({
        description: "The namespace's address on the host bridge (what the port proxy connects to).",
      }),
    ),
    egress: Nullable(EgressPolicyOut),
  },
  { description: "A sandbox's network." },
);

const CgroupVersion = Nullable(Type.Union([Type.Literal("v1"), Type.Literal("v2")]));

export const ConfinementStatusWire = Type.Object(
  {
    mode: Type.Union([Type.Literal("on"), Type.Literal("off")]),
    summary: Type.String(),
    uid_base: Nullable(
      Type.Integer({
        description: "Each QEMU runs as uid = gid = uid_base + its pid; null: as the daemon's user.",
      }),
    ),
    seccomp: Type.Boolean({ description: "QEMU's seccomp sandbox is on." }),
    cgroups: Type.Object(
      { memory: CgroupVersion, cpu: CgroupVersion, pids: CgroupVersion },
      { description: "Where each controller is (null: this host cannot enforce that limit)." },
    ),
    default_disk_limit_mib: Nullable(Type.Integer()),
    console_log_bytes: Type.Integer({
      description: "The console log kept per sandbox (a ring of two halves).",
    }),
  },
  { description: "How this daemon confines its sandboxes' QEMUs." },
);

export const SandboxLimitsWire = Type.Object(
  {
    memory_mib: Nullable(Type.Integer({ description: "memory.max (no swap)." })),
    cpu_millicores: Nullable(Type.Integer({ description: "CPU bandwidth, thousandths of a CPU." })),
    pids: Nullable(Type.Integer({ description: "pids.max: QEMU's processes and threads." })),
    disk_mib: Nullable(Type.Integer({ description: "Largest size of the writable disk layer." })),
  },
  { description: "What the sandbox may use of the host; null = not enforced here." },
);

export const ConsoleQuery = Type.Object(
  {
    bytes: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_CONSOLE_READ_BYTES,
        default: CONSOLE_READ_BYTES,
        description: "How much of the end of the log to return.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const NetworkStatusWire = Type.Object(
  {
    mode: Type.Union([Type.Literal("netns"), Type.Literal("isolated")], {
      description:
        "netns: sandboxes get namespaces with uplinks; isolated: no root/netns here, no egress at all.",
    }),
    reason: Nullable(Type.String({ description: "Why the mode is isolated." })),
    bridge: Nullable(Type.String()),
    subnet: Nullable(Type.String()),
    dns: Nullable(Type.String({ description: "The DNS forwarder (address:port on the bridge)." })),
    dns_upstreams: Type.Array(Type.String()),
    default_egress: Type.Union([Type.Literal("allow"), Type.Literal("deny")]),
  },
  { description: "How this daemon networks its sandboxes." },
);

export const PortParams = Type.Object(
  {
    id: Type.String({ pattern: SANDBOX_ID_PATTERN }),
    port: Type.Integer({ minimum: 1, maximum: 65535 }),
    "*": Type.Optional(Type.String()),
  },
  { additionalProperties: false },
);

// ---------------------------------------------------------------------------------------------------------------
// Sandboxes

export const SandboxStatusWire = Type.Union(
  [
    Type.Literal("starting"),
    Type.Literal("running"),
    Type.Literal("pausing"),
    Type.Literal("paused"),
    Type.Literal("resuming"),
    Type.Literal("stopping"),
    Type.Literal("dead"),
  ],
  { description: "starting → running ⇄ paused (through pausing/resuming); stopping; dead (its VM died)." },
);

export const OnTimeoutWire = Type.Union([Type.Literal("kill"), Type.Literal("pause")], {
  description: "What the end of the lifetime does: kill (the default) or pause.",
});

export const SandboxInfoWire = Type.Object(
  {
    id: Type.String(),
    snapshot_tag: Type.String(),
    created_at_unix: Type.Integer(),
    pid: Nullable(Type.Integer()),
    memory_limit_mib: Nullable(Type.Integer()),
    status: SandboxStatusWire,
    expires_at_unix_ms: Nullable(
      Type.Integer({
        description: "When the lifetime ends (then on_timeout happens); null = no limit, and while paused.",
      }),
    ),
    timeout_ms: Nullable(
      Type.Integer({
        description: "The lifetime it got at spawn or its last resume, restarted at every resume.",
      }),
    ),
    on_timeout: OnTimeoutWire,
    auto_resume: Type.Boolean({
      description: "E2B's autoResume: a data-plane request through the E2B API resumes it while paused.",
    }),
    pause_tag: Nullable(
      Type.String({
        description:
          "The snapshot layer holding its paused state (kept while it runs again: its disk builds on it).",
      }),
    ),
    paused_at_unix_ms: Nullable(Type.Integer({ description: "When it was paused, while paused." })),
    ready_ms: Nullable(Type.Number({ description: "Restore to ready, in ms." })),
    accelerator: Type.Union([Type.Literal("kvm"), Type.Literal("tcg")]),
    live_fork: Type.Boolean({ description: "RAM on tmpfs: the sandbox can be BRANCHed in live mode." }),
    has_branched: Type.Boolean({ description: "forkd v0.5 field: a BRANCH has been taken of this sandbox." }),
    branch_count: Type.Integer({ description: "forkd v0.5 field: BRANCHes taken of this sandbox." }),
    last_branch_tag: Nullable(
      Type.String({ description: "The latest BRANCH's tag: the parent of this sandbox's next diff branch." }),
    ),
    last_branch_memory_path: Nullable(
      Type.String({
        description:
          "forkd v0.5 field: the latest BRANCH's memory file on the daemon's host (memory.bin of a full branch, " +
          "memory.layer of a diff/live one).",
      }),
    ),
    metadata: Type.Record(Type.String(), Type.String(), {
      description: "String metadata given at spawn (forks inherit it).",
    }),
    template_alias: Nullable(
      Type.String({ description: "The template alias it was created by (E2B API), or null." }),
    ),
    owner: Nullable(
      Type.String({ description: "The tenant that owns it (docs/security.md#tenancy); null: an admin's." }),
    ),
    netns: Nullable(
      Type.String({
        description:
          "forkd v0.5 field: the sandbox's named network namespace (`ip netns exec <netns> ...` reaches the guest).",
      }),
    ),
    guest_addr: Nullable(
      Type.String({
        description:
          'forkd v0.5 field, "<guest ip>:<port>": the guest\'s address (10.42.0.2, the same in every sandbox, reachable ' +
          "inside its netns). The port is 0: forkd's agent is not on TCP.",
      }),
    ),
    network: SandboxNetworkWire,
    limits: SandboxLimitsWire,
  },
  {
    description:
      "SandboxInfo (v0.5 fields id, snapshot_tag, netns, guest_addr, created_at_unix, pid, memory_limit_mib, " +
      "has_branched, branch_count, last_branch_memory_path).",
  },
);
export type SandboxInfoWire = Static<typeof SandboxInfoWire>;

export const SpawnBody = Type.Object(
  {
    snapshot_tag: Tag,
    n: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_SPAWN_N, default: 1 })),
    memory_limit_mib: Type.Optional(
      Nullable(
        Type.Integer({
          minimum: MIN_MEMORY_LIMIT_MIB,
          maximum: MAX_MEMORY_LIMIT_MIB,
          description:
            `memory.max per child (no swap), MiB. Absent or null: guest RAM + ${DEFAULT_MEMORY_OVERHEAD_MIB} MiB where the host has the memory ` +
            "controller. 501 when asked for on a host that cannot enforce it.",
        }),
      ),
    ),
    cpu_limit_millicores: Type.Optional(
      Type.Integer({
        minimum: MIN_CPU_LIMIT_MILLICORES,
        maximum: MAX_CPU_LIMIT_MILLICORES,
        description:
          "CPU bandwidth per child in thousandths of a CPU (default: one CPU per vCPU). 501 if unenforceable.",
      }),
    ),
    pids_limit: Type.Optional(
      Type.Integer({
        minimum: MIN_PIDS_LIMIT,
        maximum: MAX_PIDS_LIMIT,
        description: `pids.max per child: QEMU's processes and threads (default ${DEFAULT_PIDS_LIMIT}). 501 if unenforceable.`,
      }),
    ),
    disk_limit_mib: Type.Optional(
      Type.Integer({
        minimum: MIN_DISK_LIMIT_MIB,
        maximum: MAX_DISK_LIMIT_MIB,
        description:
          "Largest size of each child's writable disk layer, MiB (default: the daemon's --disk-limit-mib); writes " +
          "past it fail in the guest with an I/O error. 501 without confinement.",
      }),
    ),
    timeout_ms: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_SANDBOX_TIMEOUT_MS,
        description:
          "Lifetime in ms; 0 = no limit. Absent: no limit, as in forkd v0.5, unless the daemon was started with " +
          '--default-timeout-ms. Expired sandboxes are killed, or paused with on_timeout "pause".',
      }),
    ),
    on_timeout: Type.Optional(OnTimeoutWire),
    per_child_netns: Type.Optional(
      Type.Boolean({
        description:
          "forkd v0.5 field. Every sandbox with a network has its own namespace: true is accepted (501 if this daemon " +
          'runs isolated; 400 with network "none").',
      }),
    ),
    network: Type.Optional(
      Type.Union([Type.Literal("none"), EgressPolicyWire], {
        description:
          "Egress policy (default: the daemon's --egress), or \"none\": the sandbox's NIC leads nowhere (no namespace of its own).",
      }),
    ),
    prewarm: NotBuiltFlag("fault in guest pages after restore"),
    live_fork: Type.Optional(
      Type.Boolean({
        description:
          "Map guest RAM from a tmpfs copy of the snapshot's image (built once per snapshot), so the sandbox can be " +
          "BRANCHed in live mode (userfaultfd write-protection needs shmem).",
      }),
    ),
    hugepages: NotBuiltFlag("2 MiB pages for memfd RAM"),
    metadata: Type.Optional(
      Type.Record(Type.String({ minLength: 1, maxLength: MAX_METADATA_KEY_CHARS }), Type.String(), {
        description: `String metadata (at most ${MAX_METADATA_ENTRIES} entries, values up to ${MAX_METADATA_VALUE_CHARS} characters).`,
      }),
    ),
    env: Type.Optional(
      Type.Record(Type.String({ pattern: ENV_NAME_PATTERN }), Type.String(), {
        description:
          "Environment variables every process and cell in the sandboxes gets (a call's own env wins); " +
          `at most ${MAX_ENV_VARS} variables, ${MAX_ENV_BYTES} bytes as JSON.`,
      }),
    ),
  },
  { additionalProperties: false },
);
export type SpawnBody = Static<typeof SpawnBody>;

export const ForkBody = Type.Object(
  {
    count: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_SPAWN_N, default: 1 })),
    timeout_ms: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_SANDBOX_TIMEOUT_MS,
        description:
          "Lifetime of each child in ms; 0 = no limit. Absent: as for a spawn (no limit unless the daemon was " +
          "started with --default-timeout-ms).",
      }),
    ),
  },
  { additionalProperties: false },
);

export const ForkResponse = Type.Object(
  {
    snapshot_tag: Type.String({ description: "The BRANCH the children came from (deleted once unused)." }),
    mode: Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")]),
    pause_ms: Type.Number({ description: "How long the source was paused." }),
    children: Type.Array(
      Type.Object({
        sandbox: Nullable(SandboxInfoWire),
        error: Nullable(ErrorBody),
      }),
      { description: "One entry per requested child: its sandbox, or why it did not start." },
    ),
  },
  { description: "A fork: the source BRANCHed once, count children restored from it, each on its own." },
);

export const SandboxMetricsWire = Type.Object({
  timestamp_unix_ms: Type.Integer(),
  cpu_count: Type.Integer(),
  cpu_used_pct: Type.Number({ description: "Host-measured CPU use of the VM over the last window." }),
  mem_total_bytes: Type.Integer({ description: "Guest /proc/meminfo MemTotal." }),
  mem_used_bytes: Type.Integer({ description: "MemTotal - MemAvailable." }),
  mem_cache_bytes: Type.Integer({ description: "Cached + Buffers." }),
  disk_total_bytes: Type.Integer({ description: "Not measured yet: 0." }),
  disk_used_bytes: Type.Integer({ description: "Not measured yet: 0." }),
});

export const SandboxUsageWire = Type.Object(
  {
    id: Type.String(),
    timestamp_unix_ms: Type.Integer(),
    rss_bytes: Type.Integer({ description: "Resident memory of the VM's QEMU process." }),
    pss_bytes: Type.Integer({
      description:
        "Proportional set size: pages shared with the snapshot and other children divided among them.",
    }),
    private_bytes: Type.Integer({ description: "Pages only this VM holds (what killing it frees)." }),
    cpu_seconds: Type.Number({ description: "Host CPU time used since the VM started." }),
    cpu_used_pct: Type.Number({
      description: "CPU seconds per second x100 over cpu_window_ms (100 = one core).",
    }),
    cpu_window_ms: Type.Integer({
      description: "Since the previous usage sample of this sandbox (by any caller), or the VM's whole life.",
    }),
  },
  { description: "What a running sandbox costs the host, measured on the host (no guest call)." },
);

export const UsageResponse = Type.Object({ sandboxes: Type.Array(SandboxUsageWire) });

export const UsageQuery = Type.Object(
  {
    id: Type.Optional(
      Type.Union([SandboxId, Type.Array(SandboxId, { maxItems: 1000 })], {
        description: "Only these sandboxes (repeat the parameter); default all running ones.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const HostStatusWire = Type.Object(
  {
    timestamp_unix_ms: Type.Integer(),
    cpu_count: Type.Integer(),
    cpu_used_pct: Type.Number({ description: "Busy share of all host CPUs over cpu_window_ms, 0..100." }),
    cpu_window_ms: Type.Integer({
      description: "Since the previous host sample (by any caller), or since boot.",
    }),
    load_avg: Type.Tuple([Type.Number(), Type.Number(), Type.Number()]),
    mem_total_bytes: Type.Integer(),
    mem_available_bytes: Type.Integer({ description: "The host's MemAvailable." }),
    daemon_rss_bytes: Type.Integer({ description: "The daemon process's own resident memory." }),
    sandboxes: Type.Object(
      {
        starting: Type.Integer(),
        running: Type.Integer(),
        stopping: Type.Integer(),
        dead: Type.Integer(),
      },
      { description: "Sandboxes the daemon knows, by status." },
    ),
  },
  { description: "The host the daemon runs on." },
);

// ---------------------------------------------------------------------------------------------------------------
// Template aliases

export const TemplateAliasWire = Type.Object({
  alias: Type.String(),
  tag: Type.String(),
  created_at_unix: Type.Integer(),
  owner: Nullable(Type.String({ description: "The tenant that set it; null: an admin's." })),
});
export const AliasParams = Type.Object(
  {
    alias: Type.String({
      pattern: TEMPLATE_ALIAS_PATTERN,
      description: "An alias; '/' is sent percent-encoded.",
    }),
  },
  { additionalProperties: false },
);
export const SetAliasBody = Type.Object({ tag: Tag }, { additionalProperties: false });

export const ListSandboxesQuery = Type.Object(
  { snapshot_tag: Type.Optional(Tag), status: Type.Optional(SandboxStatusWire) },
  { additionalProperties: false },
);

export const PauseBody = Type.Object(
  {
    merge: Type.Optional(
      Type.Boolean({
        description:
          "Write one layer holding everything since the sandbox's base, merging its earlier pause layers (the " +
          "daemon also merges by itself when they would hold 10% more than what changed, or get 4 deep).",
      }),
    ),
  },
  { additionalProperties: false },
);

export const PauseResponse = Type.Object(
  {
    sandbox: SandboxInfoWire,
    tag: Type.String({ description: "The snapshot layer its state is in." }),
    pause_ms: Type.Number({
      description: "How long the guest was stopped before its state was out of the VM.",
    }),
    write_ms: Type.Number({ description: "From the stop to the layer on disk." }),
    bytes_captured: Type.Integer({ description: "Pages the VM had written since it last started, bytes." }),
    bytes_stored: Type.Integer({
      description: "Guest RAM the layer holds (what differs from its parent), bytes.",
    }),
    merged: Type.Boolean({ description: "Its earlier pause layers were merged into this one." }),
    freed_bytes: Type.Integer({ description: "The resident memory its QEMU had: what the pause gave back." }),
  },
  { description: "A pause: the sandbox (status paused) and what it took." },
);
export type PauseResponse = Static<typeof PauseResponse>;

export const ResumeBody = Type.Object(
  {
    timeout_ms: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_SANDBOX_TIMEOUT_MS,
        description: "Lifetime from now in ms (0 = none); absent: the one it had.",
      }),
    ),
  },
  { additionalProperties: false },
);

// ---------------------------------------------------------------------------------------------------------------
// forkd v0.5 workspaces

export const WorkspaceNameParams = Type.Object(
  { name: Type.String({ maxLength: 64 }) },
  { additionalProperties: false },
);

export const WorkspaceInfoWire = Type.Object(
  {
    id: Type.String({ description: "ws-<sandbox id>." }),
    name: Type.String(),
    source_snapshot_tag: Type.String(),
    current_state_tag: Type.Optional(Type.String({ description: "The layer of its latest suspend." })),
    status: Type.Union([Type.Literal("running"), Type.Literal("suspended"), Type.Literal("stale")], {
      description: "stale: its sandbox is gone (a host reboot while it ran); resume starts it again.",
    }),
    live_sandbox_id: Type.Optional(
      Type.String({ description: "Its sandbox while running: the same id across suspends (unlike v0.5)." }),
    ),
    created_at_unix: Type.Integer(),
    last_active_unix: Type.Integer(),
    last_branch_memory_path: Type.Optional(
      Type.String({ description: "The memory file of its latest suspend's layer (memory.layer)." }),
    ),
  },
  { description: "forkd v0.5's WorkspaceInfo." },
);
export type WorkspaceInfoWire = Static<typeof WorkspaceInfoWire>;

export const CreateWorkspaceBody = Type.Object(
  {
    name: Type.String({ description: "1-64 characters: ASCII letters, digits, '-', '_'." }),
    snapshot_tag: Tag,
    per_child_netns: Type.Optional(
      Type.Boolean({ description: "v0.5 field: every sandbox with a network has its own namespace." }),
    ),
    memory_limit_mib: Type.Optional(
      Nullable(Type.Integer({ minimum: MIN_MEMORY_LIMIT_MIB, maximum: MAX_MEMORY_LIMIT_MIB })),
    ),
  },
  { additionalProperties: false },
);

export const SuspendWorkspaceBody = Type.Object(
  {
    diff: Type.Optional(
      Type.Boolean({
        description:
          "v0.5's flag. true: a layer over the previous suspend's (merged automatically when that stops paying); " +
          "false (default): one layer holding everything since the workspace's snapshot.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const KillManyQuery = Type.Object(
  {
    all: Type.Optional(Type.Boolean({ description: "Kill every sandbox (required without snapshot_tag)." })),
    snapshot_tag: Type.Optional(Tag),
  },
  { additionalProperties: false },
);
export const KillManyResponse = Type.Object({ killed: Type.Array(Type.String()) });

export const SetTimeoutBody = Type.Object(
  {
    timeout_ms: Type.Integer({
      minimum: 0,
      maximum: MAX_SANDBOX_TIMEOUT_MS,
      description: "Remaining lifetime from now, in ms; 0 = no limit.",
    }),
  },
  { additionalProperties: false },
);

export const PingResponse = Type.Object({
  pong: Type.Literal(true),
  protocol: Type.Integer(),
  agent_version: Type.String(),
  template: Type.String(),
  interpreter: Type.String(),
  warm: Type.Unknown(),
  sandbox_id: Nullable(Type.String()),
  hostname: Type.String(),
  uptime_ms: Type.Number(),
});

const ExecCommon = {
  args: Type.Array(Type.String({ maxLength: MAX_EXEC_ARG_CHARS }), {
    minItems: 1,
    maxItems: MAX_EXEC_ARGS,
    description: "argv; args[0] is looked up in PATH. No shell is involved.",
  }),
  timeout_secs: Type.Optional(TimeoutSecs),
  timeout_ms: Type.Optional(TimeoutMs),
  env: Type.Optional(
    Type.Record(Type.String({ pattern: ENV_NAME_PATTERN }), Type.String(), {
      additionalProperties: false,
      description: "Environment variables added to the guest's; names are [A-Za-z_][A-Za-z0-9_]*.",
    }),
  ),
  cwd: Type.Optional(Type.String({ minLength: 1, maxLength: MAX_PATH_CHARS, description: "Absolute." })),
  encoding: Type.Optional(
    Type.Union([Type.Literal("utf8"), Type.Literal("base64")], {
      description: "How stdout/stderr bytes are put in JSON strings (default utf8, invalid bytes replaced).",
    }),
  ),
};

export const ExecBody = Type.Object(
  {
    ...ExecCommon,
    stdin: Type.Optional(Type.String({ description: "Text written to the process's stdin, then EOF." })),
    stdin_b64: Type.Optional(Type.String({ description: "Like stdin, base64. Not both." })),
  },
  { additionalProperties: false },
);
export type ExecBody = Static<typeof ExecBody>;

export const ExecResponse = Type.Object({
  stdout: Type.String(),
  stderr: Type.String(),
  exit_code: Type.Integer({
    description: "The exit status; 128+N when killed by signal N (v0.5: always set).",
  }),
  signal: Nullable(Type.String()),
  timed_out: Type.Boolean(),
  stdout_truncated: Type.Boolean(),
  stderr_truncated: Type.Boolean(),
  duration_ms: Type.Number(),
  encoding: Type.Union([Type.Literal("utf8"), Type.Literal("base64")]),
});

export const EvalBody = Type.Object(
  {
    code: Type.String({ maxLength: MAX_EVAL_CODE_CHARS }),
    timeout_ms: Type.Optional(TimeoutMs),
    timeout_secs: Type.Optional(TimeoutSecs),
  },
  { additionalProperties: false },
);
export type EvalBody = Static<typeof EvalBody>;

export const EvalResponse = Type.Object({
  result: Nullable(Type.String({ description: "repr() of the trailing expression, or null." })),
  error: Nullable(Type.String({ description: "'Type: message' of an uncaught exception, or null." })),
  exit_code: Type.Integer({ description: "0 without an error, 1 with one (v0.5 shape)." }),
  error_type: Nullable(Type.String()),
  traceback: Nullable(Type.String()),
  stdout: Type.String(),
  stderr: Type.String(),
  timed_out: Type.Boolean(),
  result_truncated: Type.Boolean(),
  stdout_truncated: Type.Boolean(),
  stderr_truncated: Type.Boolean(),
  duration_ms: Type.Number(),
});

export const BranchResultWire = Type.Composite(
  [
    SnapshotInfoWire,
    Type.Object({
      branched_from: Type.String({ description: "The source sandbox (v0.5 field)." }),
      mode: Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")]),
      pause_ms: Type.Integer({ description: "How long the source was paused, whole ms (v0.5 field)." }),
      bytes_captured: Type.Integer({ description: "Guest RAM captured: the pages the source had changed." }),
      bytes_written: Type.Integer({
        description: "Bytes written for the new snapshot (memory, device state, disk layer).",
      }),
      diff_ms: Type.Optional(
        Type.Integer({
          description:
            "v0.5 field, with measure_diff or mode diff: ms spent finding and copying the pages the source " +
            "changed (inside the pause for full and diff, in the background for live; 0 with wait: false).",
        }),
      ),
      diff_physical_bytes: Type.Optional(
        Type.Integer({ description: "v0.5 field, with measure_diff or mode diff: bytes of those pages." }),
      ),
      diff_logical_bytes: Type.Optional(
        Type.Integer({ description: "v0.5 field, with measure_diff or mode diff: the guest's RAM size." }),
      ),
    }),
  ],
  { description: "The new snapshot (SnapshotInfo) plus what the BRANCH cost." },
);
export type BranchResultWire = Static<typeof BranchResultWire>;

export const BranchBody = Type.Object(
  {
    tag: Type.Optional(Tag),
    mode: Type.Optional(Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")])),
    diff: Type.Optional(Type.Boolean({ description: "Legacy form of mode=diff." })),
    live: Type.Optional(Type.Boolean({ description: "Legacy form of mode=live." })),
    measure_diff: Type.Optional(Type.Boolean()),
    parent_tag: Type.Optional(Tag),
    wait: Type.Optional(Type.Boolean()),
    alias: Type.Optional(
      Type.String({
        pattern: TEMPLATE_ALIAS_PATTERN,
        description:
          "Also point this template alias at the new snapshot (the one it named before is deleted once unused).",
      }),
    ),
  },
  { additionalProperties: false },
);

// ---------------------------------------------------------------------------------------------------------------
// Files

export const GuestPath = Type.String({
  minLength: 1,
  maxLength: MAX_PATH_CHARS,
  description: "Absolute path inside the sandbox; no '..' segments, no NUL.",
});

export const FileQuery = Type.Object({ path: GuestPath }, { additionalProperties: false });
export const PutFileQuery = Type.Object(
  {
    path: GuestPath,
    mode: Type.Optional(Type.String({ pattern: FILE_MODE_PATTERN, description: "Octal permission bits." })),
  },
  { additionalProperties: false },
);
export const RemoveFileQuery = Type.Object(
  { path: GuestPath, recursive: Type.Optional(Type.Boolean()) },
  { additionalProperties: false },
);

export const FileInfoWire = Type.Object({
  name: Type.String(),
  type: Type.Union([
    Type.Literal("file"),
    Type.Literal("dir"),
    Type.Literal("symlink"),
    Type.Literal("other"),
  ]),
  size: Type.Integer(),
  mode: Type.Integer({ description: "Permission bits." }),
  mtime_ms: Type.Number(),
  link_target: Nullable(Type.String()),
});
export type FileInfoWire = Static<typeof FileInfoWire>;

export const FileListingWire = Type.Object({
  path: Type.String(),
  entries: Type.Array(FileInfoWire),
  truncated: Type.Boolean(),
});
export const PutFileResponse = Type.Object({ path: Type.String(), bytes: Type.Integer() });

/** Marker for octet-stream bodies: documented in OpenAPI, not validated (src/api/validation.ts skips it). */
export const BinaryBody = Type.Unsafe<Buffer>({ type: "string", format: "binary" });

// ---------------------------------------------------------------------------------------------------------------
// Streaming exec (NDJSON)

export const ExecStreamEvent = Type.Union(
  [
    Type.Object({ type: Type.Literal("started"), id: Type.String() }),
    Type.Object({
      type: Type.Union([Type.Literal("stdout"), Type.Literal("stderr")]),
      data: Type.String({ description: "A chunk, in the request's encoding." }),
    }),
    Type.Object({
      type: Type.Literal("exit"),
      exit_code: Type.Integer(),
      signal: Nullable(Type.String()),
      timed_out: Type.Boolean(),
      stdout_bytes: Type.Integer(),
      stderr_bytes: Type.Integer(),
      duration_ms: Type.Number(),
    }),
    Type.Object({ type: Type.Literal("error"), error: Type.String(), code: Type.String() }),
  ],
  { description: "One line of the application/x-ndjson response of exec/stream." },
);
