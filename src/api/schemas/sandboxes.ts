/** Sandboxes: spawn, fork, info, usage, host status, template aliases, pause and resume. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type Static, Type } from "@sinclair/typebox";
import {
  DEFAULT_MEMORY_OVERHEAD_MIB,
  DEFAULT_PIDS_LIMIT,
  ENV_NAME_PATTERN,
  MAX_CPU_LIMIT_MILLICORES,
  MAX_DISK_LIMIT_MIB,
  MAX_ENV_BYTES,
  MAX_ENV_VARS,
  MAX_MEMORY_LIMIT_MIB,
  MAX_METADATA_ENTRIES,
  MAX_METADATA_KEY_CHARS,
  MAX_METADATA_VALUE_CHARS,
  MAX_PIDS_LIMIT,
  MAX_SANDBOX_TIMEOUT_MS,
  MAX_SPAWN_N,
  MIN_CPU_LIMIT_MILLICORES,
  MIN_DISK_LIMIT_MIB,
  MIN_MEMORY_LIMIT_MIB,
  MIN_PIDS_LIMIT,
  TEMPLATE_ALIAS_PATTERN,
} from "../../common/limits.js";
import { ErrorBody, NotBuiltFlag, Nullable, SandboxId, Tag } from "./common.js";
import { EgressPolicyWire, SandboxLimitsWire, SandboxNetworkWire } from "./network.js";

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
    public_ports: Type.Boolean({
      description:
        "Its ports are public on the E2B data plane (false: requests there need its traffic access token).",
    }),
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
    public_ports: Type.Optional(
      Type.Boolean({
        description:
          "Whether the sandboxes' ports are public on the E2B data plane (<port>-<id>.<domain>), as E2B's " +
          "allowPublicTraffic (default true; a daemon started with --e2b-private-traffic makes every sandbox's " +
          "ports private whatever this says). false: a request " +
          "there must carry the sandbox's traffic access token (E2B's connect returns it); the forkd port route " +
          "(/v1/sandboxes/:id/ports/:port, with this API's credentials) is unaffected.",
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
    memory: Type.Optional(
      Type.Boolean({
        description:
          "false: a filesystem-only pause: the guest's disk is synced and kept, its processes and memory are not; " +
          "resume cold-boots it on that disk (same id, tokens, network, limits). Such a sandbox cannot then be " +
          "paused with memory, branched or forked (409).",
      }),
    ),
    durable: Type.Optional(
      Type.Boolean({
        description:
          "Through a cluster's gateway only (docs/kubernetes.md): also push the pause's layers to the cluster's " +
          "registry and record it in the node's ForkdNode, so that another node resumes it under the same id " +
          "once its node is lost and fenced. Answered once both are accepted; 507 when the node lists as many " +
          "durable pauses as it may. Needs a pause with memory. A single daemon answers 400. Absent: durable when " +
          "the gateway runs with --durable-pause and the pause keeps memory; false: a pause on the node only.",
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
