/**
 * The JSON documents of the daemon's REST API (docs/api.md, docs/openapi.json), hand-written here so the SDK
 * imports nothing from the daemon. Field names are the wire's (snake_case), as forkd v0.5 clients expect.
 */

/** starting → running ⇄ paused (through pausing and resuming); stopping while killed; dead when its VM died. */
export type SandboxStatus = "starting" | "running" | "pausing" | "paused" | "resuming" | "stopping" | "dead";

export interface SandboxInfo {
  id: string;
  snapshot_tag: string;
  created_at_unix: number;
  pid: number | null;
  memory_limit_mib: number | null;
  status: SandboxStatus | (string & {});
  /**
   * When the sandbox's lifetime ends unless extended (unix ms), then `on_timeout` happens; null = no lifetime
   * limit, and while paused.
   */
  expires_at_unix_ms?: number | null;
  /** The lifetime it got at spawn or its last resume (restarted by every resume); null = none. */
  timeout_ms?: number | null;
  /** What the end of its lifetime does: kill it, or pause it to disk. */
  on_timeout?: "kill" | "pause" | (string & {});
  /** E2B's autoResume: a request through the E2B API's data plane resumes it while paused. */
  auto_resume?: boolean;
  /** The snapshot layer holding its latest paused state. */
  pause_tag?: string | null;
  /** When it was paused (unix ms), while paused. */
  paused_at_unix_ms?: number | null;
  /** Restore to ready, in ms. */
  ready_ms?: number | null;
  accelerator?: "kvm" | "tcg" | (string & {});
  /** Spawned with live_fork: can be BRANCHed in live mode. */
  live_fork?: boolean;
  /** Its ports are public on the E2B data plane (false: requests there need its traffic access token). */
  public_ports?: boolean;
  /** forkd v0.5 fields: a BRANCH was taken of it, how many, and the latest one's memory file on the host. */
  has_branched?: boolean;
  branch_count?: number;
  last_branch_memory_path?: string | null;
  /** The latest BRANCH's tag (the parent of the sandbox's next diff branch). */
  last_branch_tag?: string | null;
  /** forkd v0.5 field: the sandbox's named network namespace (null without a network of its own). */
  netns?: string | null;
  /** forkd v0.5 field, "10.42.0.2:0": the guest's address (the same in every sandbox; the port is 0). */
  guest_addr?: string | null;
  network?: SandboxNetwork;
  /** The tenant that owns it (a tenant's token only ever sees its own); null: an admin's. */
  owner?: string | null;
  /** What it may use of the host (asked for at spawn, or the daemon's defaults); null = not enforced there. */
  limits?: SandboxLimits;
  [field: string]: unknown;
}

/** A sandbox's limits as on the wire (docs/security.md, Limits). */
export interface SandboxLimits {
  memory_mib: number | null;
  cpu_millicores: number | null;
  pids: number | null;
  disk_mib: number | null;
}

/** An egress policy as on the wire (docs/network.md). */
export interface EgressPolicyWire {
  /** Destinations no entry names. @default the snapshot's template default (`[egress]`), else the daemon's --egress */
  egress?: "allow" | "deny";
  /** IPv4 addresses, CIDRs, domain names, *.domain wildcards; an allow entry wins over a deny entry. */
  allow_out?: string[];
  deny_out?: string[];
}

export interface SandboxNetwork {
  /** netns: a namespace of its own with an uplink; private: a NIC that leads nowhere; none: no NIC. */
  kind: "netns" | "private" | "none" | (string & {});
  /** Its namespace's address on the daemon host's bridge. */
  address: string | null;
  egress: Required<EgressPolicyWire> | null;
}

/** How the daemon networks sandboxes (GET /v1/network). */
export interface NetworkStatus {
  mode: "netns" | "isolated" | (string & {});
  reason: string | null;
  bridge: string | null;
  subnet: string | null;
  dns: string | null;
  dns_upstreams: string[];
  default_egress: "allow" | "deny";
}

export type SnapshotStatus = "writing" | "ready" | "failed";

export interface SnapshotInfo {
  tag: string;
  created_at_unix: number;
  status: SnapshotStatus | (string & {});
  bootable: boolean;
  template?: string | null;
  accelerator?: "kvm" | "tcg" | null | (string & {});
  memory_mib?: number | null;
  parent_tag?: string | null;
  bytes?: number;
  error?: string | null;
  /** Where the snapshot lives on the daemon's host. */
  dir?: string;
  /** The tenant that owns it; null: an admin's (shared with every tenant when built from a template). */
  owner?: string | null;
  /** The template's default egress policy (`[egress]`), which its sandboxes start with; null: the daemon's. */
  egress_default?: Required<EgressPolicyWire> | null;
  [field: string]: unknown;
}

/** POST /v1/sandboxes/:id/branch: the new snapshot plus what the BRANCH cost. */
export interface BranchResult extends SnapshotInfo {
  /** The source sandbox. */
  branched_from: string;
  mode: "full" | "diff" | "live";
  /** How long the source was paused, whole ms. */
  pause_ms: number;
  /** Guest RAM the source had written since its last start, and what the new layer stores of it, bytes. */
  bytes_captured: number;
  bytes_written: number;
  /** forkd v0.5's measurements, with `measureDiff` or mode diff (see docs/api.md). */
  diff_ms?: number;
  diff_physical_bytes?: number;
  diff_logical_bytes?: number;
}

/** POST /v1/snapshots/:from/diff: the new layer, and how the command that made it ran. */
export interface SnapshotDiffResult extends BranchResult {
  exit_code: number;
  stdout: string;
  stderr: string;
}

/** GET /v1/snapshots/:tag/info: a snapshot and its chain. */
export interface SnapshotDetail extends SnapshotInfo {
  chain_depth: number;
  /** sha256 of the parent's manifest, as this snapshot recorded it. */
  parent_content_hash: string | null;
  /** Tags from the chain's root to the parent. */
  ancestors: string[];
  /** Snapshots whose parent is this one. */
  dependents: string[];
  /** Every snapshot depending on this one, directly or not (parents before children). */
  all_dependents: string[];
  /** Root first, this snapshot last. */
  layers: LayerUsage[];
  /** Bytes on disk a child of this snapshot reads from, over the whole chain. */
  chain_bytes: { memory_physical: number; disk_physical: number; vmstate: number };
  memory_logical_bytes: number;
  memory_physical_bytes: number;
  vmstate_bytes: number;
  /** Why the chain cannot be restored (a missing or changed parent), or null. */
  chain_error: string | null;
}

/** One layer of a snapshot chain and what it takes on disk. */
export interface LayerUsage {
  tag: string;
  /** template, branch or compact. */
  origin: string;
  memory: { format: "flat" | "layer"; pages: number; logical_bytes: number; physical_bytes: number };
  disk: { logical_bytes: number; physical_bytes: number; backing: string | null };
  vmstate_bytes: number;
}

/** POST /v1/sandboxes/:id/exec (forkd v0.5 compatible). */
export interface ExecResult {
  stdout: string;
  stderr: string;
  /** The exit status; 128+N when killed by signal N (as shells report it). */
  exit_code: number;
  /** The signal that killed the process, e.g. "SIGKILL", or null. */
  signal?: string | null;
  /** The process group was killed because it ran past its timeout. */
  timed_out?: boolean;
  /** Output is captured up to 1 MiB per stream; use the streamed exec for more. */
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
  duration_ms?: number;
  encoding?: "utf8" | "base64";
  [field: string]: unknown;
}

/** POST /v1/sandboxes/:id/eval (forkd v0.5 compatible: `result`, `error`, `exit_code`). */
export interface EvalResult {
  /** repr() of the code's trailing expression, or null. */
  result: string | null;
  /** "Type: message" of an uncaught exception, or null. */
  error: string | null;
  /** 0 without an error, 1 with one. */
  exit_code: number;
  /** The exception's class, e.g. "ZeroDivisionError". */
  error_type?: string | null;
  traceback?: string | null;
  stdout?: string;
  stderr?: string;
  timed_out?: boolean;
  result_truncated?: boolean;
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
  duration_ms?: number;
  [field: string]: unknown;
}

export interface PingResult {
  pong: true;
  protocol?: number;
  agent_version?: string;
  template?: string;
  interpreter?: string;
  warm?: unknown;
  sandbox_id?: string | null;
  hostname?: string;
  uptime_ms?: number;
  [field: string]: unknown;
}

export type FileType = "file" | "dir" | "symlink" | "other";

export interface FileInfo {
  name: string;
  type: FileType | (string & {});
  size: number;
  mode: number;
  mtime_ms?: number;
  link_target?: string | null;
  [field: string]: unknown;
}

export interface FileListing {
  path?: string;
  entries: FileInfo[];
  /** The directory had more entries than one listing returns. */
  truncated?: boolean;
}

export interface VersionInfo {
  version: string;
  api: string;
  [field: string]: unknown;
}

/** POST /v1/snapshots/unpack: what a pack installed. */
export interface UnpackResult {
  head: string;
  /** Root first, as installed. */
  chain: string[];
  installed: string[];
  /** Layers already present, identical, and kept. */
  reused: string[];
  replaced: string[];
  /** Local snapshots left unbootable by a replacement. */
  orphaned: string[];
  image: "installed" | "present";
  content_bytes: number;
  ms: number;
}

/** POST /v1/sandboxes/:id/pause: the sandbox (status paused) and what the pause took. */
export interface PauseResult {
  sandbox: SandboxInfo;
  /** The snapshot layer its state is in. */
  tag: string;
  /** How long the guest was stopped before its state was out of the VM, ms. */
  pause_ms: number;
  /** From the stop to the layer on disk, ms. */
  write_ms: number;
  /** Pages the VM had written since it last started, bytes. */
  bytes_captured: number;
  /** Guest RAM the layer holds (what differs from its parent), bytes. */
  bytes_stored: number;
  /** Its earlier pause layers were merged into this one. */
  merged: boolean;
  /** The resident memory its QEMU had: what the pause gave back to the host, bytes. */
  freed_bytes: number;
}

/** forkd v0.5's workspace: a named sandbox that is suspended to disk and resumed by name (GET /v1/workspaces/:name). */
export interface WorkspaceInfo {
  /** ws-<sandbox id>. */
  id: string;
  name: string;
  source_snapshot_tag: string;
  /** The layer of its latest suspend. */
  current_state_tag?: string;
  /** stale: its sandbox is gone (a host reboot while it ran); resume starts it again. */
  status: "running" | "suspended" | "stale" | (string & {});
  /** Its sandbox while running: the same id across suspends. */
  live_sandbox_id?: string;
  created_at_unix: number;
  last_active_unix: number;
  /** The memory file of its latest suspend's layer. */
  last_branch_memory_path?: string;
}
