/**
 * The daemon's view of sandboxes and snapshots: what the REST API (src/api) and, through it, the CLI and SDKs
 * can do. Implemented by SandboxManager (sandboxes/manager.ts) and SnapshotService (snapshots/daemon-snapshots.ts).
 * Errors are ForkdErrors whose code maps to an HTTP status (src/common/errors.ts).
 */

import type http from "node:http";
import type net from "node:net";
import type {
  ContextInfo,
  ContextLanguage,
  EvalOptions,
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  FileContent,
  FileInfo,
  FileListing,
  FileWriteOptions,
  PingInfo,
  ProcAttachOptions,
  ProcHandle,
  ProcInfo,
  ProcSelector,
  ProcSignalName,
  ProcStartOptions,
  PtySize,
  WatchHandle,
  WatchOptions,
} from "../agent/host/types.js";
import type { ForkdError } from "../common/errors.js";
import type { EgressPolicy, EgressPolicyInput } from "../net/policy.js";
import type { SnapshotManifest } from "../store/manifest.js";
import type { NetworkRequest, SandboxNetworkInfo } from "./networks/sandbox-networks.js";
import type { PausedSandboxRecord } from "./paused-record.js";
import type { LimitsRequest, SandboxLimits } from "./sandboxes/limits.js";
import type { ResolvedTemplate, TemplateAlias } from "./snapshots/template-aliases.js";

export type { EgressPolicy, EgressPolicyInput, NetworkRequest, PausedSandboxRecord, SandboxNetworkInfo };

/** How the daemon networks sandboxes (GET /v1/network, forkd doctor). */
export interface NetworkStatus {
  mode: "netns" | "isolated";
  /** Why the mode is isolated; null in netns mode. */
  reason: string | null;
  bridge: string | null;
  subnet: string | null;
  /** The DNS forwarder's address:port on the bridge. */
  dns: string | null;
  dns_upstreams: string[];
  /** Egress of a sandbox whose spawn names no policy. */
  default_egress: "allow" | "deny";
}

export interface BranchOutcome {
  tag: string;
  mode: "full" | "diff" | "live";
  /** null for a full branch: it stands alone. */
  parent_tag: string | null;
  status: "writing" | "ready";
  pause_ms: number;
  /** Finding and copying the changed pages (see BranchResult.capture_ms). */
  capture_ms: number;
  ram_bytes: number;
  bytes_captured: number;
  bytes_written: number;
  snapshot: SnapshotInfo;
}

/**
 * starting → running ⇄ paused (through pausing and resuming); stopping while being killed; dead when its VM died
 * under it (kept so callers learn why).
 */
export type SandboxStatus = "starting" | "running" | "pausing" | "paused" | "resuming" | "stopping" | "dead";

/** What the end of a sandbox's lifetime does: kill it (the default) or pause it (E2B's onTimeout). */
export type OnTimeout = "kill" | "pause";

export interface SandboxInfo {
  id: string;
  snapshot_tag: string;
  created_at_unix: number;
  pid: number | null;
  memory_limit_mib: number | null;
  status: SandboxStatus;
  /**
   * When the sandbox's lifetime ends unless extended (unix ms): then it is killed or paused (`on_timeout`); null
   * = no lifetime limit (and while paused).
   */
  expires_at_unix_ms: number | null;
  /** The lifetime it got at spawn (or its last resume), restarted at every resume, in ms; null = none. */
  timeout_ms: number | null;
  on_timeout: OnTimeout;
  /** A data-plane request to it while paused resumes it (E2B's autoResume); the forkd API never does. */
  auto_resume: boolean;
  /**
   * Paused without memory (a filesystem-only pause, E2B's memory: false): only its disk is kept, and a resume
   * cold-boots it. Never auto-resumed.
   */
  paused_without_memory: boolean;
  /** It runs from such a cold boot: its RAM is no snapshot's, so it cannot be paused with memory, forked or branched. */
  cold_booted: boolean;
  /** The snapshot layer holding its paused state (kept while it runs again: its disk builds on it), or null. */
  pause_tag: string | null;
  /** When it was paused (unix ms), while paused; else null. */
  paused_at_unix_ms: number | null;
  /** Restore to ready, in ms. */
  ready_ms: number | null;
  accelerator: "kvm" | "tcg";
  /** Spawned with live_fork (RAM on tmpfs): can be BRANCHed in live mode. */
  live_fork: boolean;
  /** BRANCHes taken of this sandbox (forkd v0.5's branch_count; has_branched is branch_count > 0). */
  branch_count: number;
  /** Tag of the latest branch taken of it (the parent of its next diff branch), or null. */
  last_branch_tag: string | null;
  /** That branch's memory file on the daemon's host (memory.bin of a full branch, else memory.layer), or null. */
  last_branch_memory_path: string | null;
  /** String metadata given at spawn (inherited by forks). */
  metadata: Record<string, string>;
  /** The template alias the sandbox was created by, or null when it was created by its snapshot tag. */
  template_alias: string | null;
  /** What it may use of the host (asked for at spawn, or the defaults); null = not enforced on this host. */
  limits: SandboxLimits;
  network: SandboxNetworkInfo;
  inbound: InboundSettings;
  /** The tenant that owns it (see tenancy/tenant-view.ts); null: an admin's. */
  owner: string | null;
}

/**
 * How a sandbox's ports are reached through the daemon (E2B's network.allowPublicTraffic, maskRequestHost and
 * httpsPorts; see sandboxes/settings.ts for the checks). `hostHeader` and `httpsPorts` hold for every front (the
 * forkd port route too); `requireTrafficToken` is the E2B data plane's rule (the forkd API has its own tokens).
 */
export interface InboundSettings {
  /** E2B data-plane requests to its ports must carry its traffic access token (allowPublicTraffic: false). */
  requireTrafficToken: boolean;
  /** The Host header its servers are sent, with `${PORT}` replaced by the port; null: the request's own. */
  hostHeader: string | null;
  /** Ports whose servers speak HTTPS: the daemon connects to them with TLS (their certificates unchecked). */
  httpsPorts: number[];
}

/** One child of a fork: its sandbox, or why it did not start (the other children are unaffected). */
export type ForkChild =
  | { sandbox: SandboxInfo; error?: undefined }
  | { sandbox?: undefined; error: ForkdError };

export interface ForkOutcome {
  /** The snapshot the children were restored from (deleted once nothing needs it). */
  tag: string;
  mode: "full" | "diff" | "live";
  /** How long the source was paused for the BRANCH. */
  pause_ms: number;
  children: ForkChild[];
}

/** The data-plane secrets of a sandbox (E2B's envd and traffic access tokens). */
export interface AccessTokens {
  /** Opens the sandbox's agent: processes, files, code (E2B's envdAccessToken). */
  envd: string;
  /** Opens the sandbox's other ports, not its agent (E2B's trafficAccessToken). */
  traffic: string;
}

/** A point-in-time sample of what a sandbox uses. */
export interface SandboxMetrics {
  timestamp_unix_ms: number;
  cpu_count: number;
  /** The VM's CPU use (host-measured, all vCPUs) over the last sampling window, 0..100 per vCPU count. */
  cpu_used_pct: number;
  /** From the guest's /proc/meminfo. */
  mem_total_bytes: number;
  mem_used_bytes: number;
  mem_cache_bytes: number;
  /** The root filesystem as the guest's statfs reports it (0 from an agent too old to say). */
  disk_total_bytes: number;
  disk_used_bytes: number;
}

/** What one sandbox's VM costs the host now, measured from the host's side (host/usage.ts). */
export interface SandboxUsage {
  id: string;
  timestamp_unix_ms: number;
  rss_bytes: number;
  /** Proportional set size: shared pages divided among the processes sharing them. */
  pss_bytes: number;
  /** Pages only this VM holds (Private_Clean + Private_Dirty): what killing it frees. */
  private_bytes: number;
  /** Host CPU time the VM used since it started (all vCPUs, QEMU's own threads included). */
  cpu_seconds: number;
  /** CPU seconds per second over `cpu_window_ms`, x100 (100 = one host core busy). */
  cpu_used_pct: number;
  /** The window `cpu_used_pct` is measured over: since the previous usage sample, or the VM's whole life. */
  cpu_window_ms: number;
}

export interface HostStatus {
  timestamp_unix_ms: number;
  cpu_count: number;
  /** Busy share of all host CPUs over `cpu_window_ms`, 0..100. */
  cpu_used_pct: number;
  /** Since the previous host sample, or since the host booted (the first sample). */
  cpu_window_ms: number;
  load_avg: [number, number, number];
  mem_total_bytes: number;
  mem_available_bytes: number;
  /** The daemon process's own resident memory. */
  daemon_rss_bytes: number;
  /** Sandboxes the daemon knows, by status. */
  sandboxes: Record<SandboxStatus, number>;
}

/** How the daemon confines QEMU (GET /v1/status, forkd doctor). */
export interface ConfinementStatus {
  mode: "on" | "off";
  summary: string;
  /** The uid range QEMUs run in (uid = base + pid), or null when QEMU runs as the daemon's own user. */
  uid_base: number | null;
  seccomp: boolean;
  /** Per controller: "v1" / "v2" where sandboxes get it, null where this host cannot enforce it. */
  cgroups: { memory: "v1" | "v2" | null; cpu: "v1" | "v2" | null; pids: "v1" | "v2" | null };
  /** The disk cap of sandboxes whose spawn names none (MiB), null without confinement. */
  default_disk_limit_mib: number | null;
  console_log_bytes: number;
}

export interface SpawnRequest extends LimitsRequest {
  snapshotTag: string;
  n: number;
  /** Lifetime in ms; 0 = no limit; absent: the daemon's default (none unless `--default-timeout-ms`). */
  timeoutMs?: number;
  /** Map RAM from a tmpfs copy of the snapshot's image, so the sandbox can be live-BRANCHed. */
  liveFork?: boolean;
  /** String metadata to find the sandboxes by later (see sandboxes/settings.ts for the limits). */
  metadata?: Record<string, string>;
  /** Environment variables every process and cell in the sandboxes gets (a call's own env wins). */
  env?: Record<string, string>;
  /** The alias `snapshotTag` was resolved from, recorded for the sandbox's info. */
  templateAlias?: string;
  /** Egress policy, or "none" (a NIC with no uplink); default: the daemon's --egress. */
  network?: NetworkRequest;
  /**
   * forkd v0.5's per_child_netns: each child in a network namespace of its own. Every sandbox with a network has
   * one, so true only insists on it: refused (not_implemented) by a daemon that runs isolated sandboxes, and
   * contradicted (invalid_argument) by network "none" (sandboxes/settings.ts, validateOwnNamespace).
   */
  ownNamespace?: boolean;
  /** What the end of the lifetime does (default kill). */
  onTimeout?: OnTimeout;
  /** A data-plane request to it while paused resumes it (E2B's autoResume); needs onTimeout "pause". */
  autoResume?: boolean;
  /** false: the end of its lifetime pauses it without memory (a filesystem-only pause; E2B's autoPauseMemory). */
  autoPauseMemory?: boolean;
  /** How its ports are reached; default: public, the request's own Host, plain HTTP (E2B's defaults). */
  inbound?: Partial<InboundSettings>;
  /** The tenant the sandboxes belong to (tenancy/tenant-view.ts sets it); absent: an admin's. */
  owner?: string | null;
  signal?: AbortSignal;
}

/** A pause, as it went. */
export interface PauseOutcome {
  sandbox: SandboxInfo;
  /** The layer its state is in (for a filesystem-only pause, which keeps only the disk: its kept disk's name). */
  tag: string;
  /** How long the guest was stopped before its state was out of the VM. */
  pause_ms: number;
  /** From the stop to the layer on disk (the call's answer follows once the VM is gone). */
  write_ms: number;
  /** Pages the VM had written since it last started, bytes. */
  bytes_captured: number;
  /** What the layer holds (the pages that differ from its parent), bytes of guest RAM. */
  bytes_stored: number;
  /** The sandbox's earlier pause layers were merged into this one. */
  merged: boolean;
  /** Host memory its QEMU process had (resident set) when it was stopped, bytes: what the pause gave back. */
  freed_bytes: number;
}

export interface PauseRequest {
  /** "always": write one layer holding everything since its base (merging earlier pause layers). */
  merge?: "auto" | "always";
  /**
   * false: a filesystem-only pause (E2B's memory: false): the guest's disk is synced and kept, its processes
   * and memory are not; a resume cold-boots it on that disk.
   */
  memory?: boolean;
  signal?: AbortSignal;
}

export interface ResumeRequest {
  /** The lifetime from now, in ms (0 = none); default: the one it had. */
  timeoutMs?: number;
  /**
   * What the caller expects of its memory (E2B's memory): true refuses a sandbox paused without memory (it can
   * only cold-boot), false one paused with it (forkd does not cold-boot those); checked under its lock.
   */
  memory?: boolean;
  signal?: AbortSignal;
}

/** forkd v0.5's stateful workspaces: a name for a sandbox that is suspended (paused) and resumed by name. */
export interface WorkspaceInfo {
  /** `ws-<sandbox id>` (v0.5 derives it from the first sandbox's id). */
  id: string;
  name: string;
  source_snapshot_tag: string;
  /** The layer of its latest suspend; absent before the first one. */
  current_state_tag?: string;
  /** running; suspended (paused); stale: its sandbox is gone (a host reboot while it ran), resume restarts it. */
  status: "running" | "suspended" | "stale";
  /** Its sandbox while running (the same id across suspends, unlike v0.5). */
  live_sandbox_id?: string;
  created_at_unix: number;
  last_active_unix: number;
  /** The memory file of its latest suspend's layer (v0.5 named memory.bin; forkd's is memory.layer). */
  last_branch_memory_path?: string;
}

export interface WorkspaceService {
  list(): WorkspaceInfo[];
  get(name: string): WorkspaceInfo;
  create(request: {
    name: string;
    snapshotTag: string;
    memoryLimitMiB?: number;
    network?: NetworkRequest;
    /** See SpawnRequest.ownNamespace. */
    ownNamespace?: boolean;
    signal?: AbortSignal;
  }): Promise<WorkspaceInfo>;
  /** `diff` (v0.5's flag): write a layer over the previous suspend's; else one layer over the workspace's base. */
  suspend(name: string, request?: { diff?: boolean; signal?: AbortSignal }): Promise<WorkspaceInfo>;
  resume(name: string, request?: { signal?: AbortSignal }): Promise<WorkspaceInfo>;
  /** Kills its sandbox (if any) and forgets it; its layers go unless a snapshot depends on them. */
  delete(name: string): Promise<void>;
}

/** Processes that outlive the call that started them (the agent's process table), per sandbox. */
export interface SandboxProcesses {
  /** Sandbox env vars are laid under `options.env`. */
  start(id: string, argv: string[], options?: ProcStartOptions): ProcHandle;
  connect(id: string, selector: ProcSelector, options?: ProcAttachOptions): ProcHandle;
  list(id: string, options?: { signal?: AbortSignal }): Promise<ProcInfo[]>;
  input(
    id: string,
    selector: ProcSelector,
    data: Buffer,
    options?: { eof?: boolean; signal?: AbortSignal },
  ): Promise<void>;
  closeStdin(id: string, selector: ProcSelector, options?: { signal?: AbortSignal }): Promise<void>;
  signal(
    id: string,
    selector: ProcSelector,
    signal: ProcSignalName,
    options?: { signal?: AbortSignal },
  ): Promise<void>;
  resize(
    id: string,
    selector: ProcSelector,
    size: PtySize,
    options?: { signal?: AbortSignal },
  ): Promise<void>;
}

/** Namespaces of a sandbox's warm interpreter. */
export interface SandboxContexts {
  create(
    id: string,
    options?: { id?: string; cwd?: string; language?: ContextLanguage; signal?: AbortSignal },
  ): Promise<ContextInfo>;
  list(id: string, options?: { signal?: AbortSignal }): Promise<ContextInfo[]>;
  restart(id: string, context: string, options?: { signal?: AbortSignal }): Promise<ContextInfo>;
  remove(id: string, context: string, options?: { signal?: AbortSignal }): Promise<void>;
}

export interface SandboxService {
  spawn(request: SpawnRequest): Promise<SandboxInfo[]>;
  /** BRANCHes admitted and not yet answered, and the host-wide cap on them (metrics). */
  branchLoad(): { inFlight: number; cap: number };
  list(filter?: { snapshotTag?: string; status?: SandboxStatus }): SandboxInfo[];
  get(id: string): SandboxInfo;
  /**
   * Kills and forgets the sandbox (running or paused: a paused one's layers go too, unless a snapshot depends
   * on them); not_found if unknown.
   */
  kill(id: string): Promise<void>;
  /**
   * Pauses a running sandbox: its state into a snapshot layer, its VM stopped and its RAM given back; its id,
   * settings, tokens and network stay. conflict if it is not running (already paused included).
   */
  pause(id: string, request?: PauseRequest): Promise<PauseOutcome>;
  /**
   * Runs a paused sandbox again under the same id, where it was: processes, files, interpreter, with the host's
   * clock and fresh entropy; its lifetime starts again. conflict if it is not paused.
   */
  resume(id: string, request?: ResumeRequest): Promise<SandboxInfo>;
  /** The record of paused sandbox `id` for a durable pause (admin only; a daemon without it: not a node). */
  pausedRecord?(id: string): PausedSandboxRecord;
  /** Inserts another node's paused sandbox, whose chain was pulled, as paused here (a durable pause's adoption). */
  adoptPaused?(record: PausedSandboxRecord): Promise<void>;
  workspaces: WorkspaceService;
  /** Kills every sandbox (of one snapshot, if given); returns the ids killed. */
  killAll(filter?: { snapshotTag?: string }): Promise<string[]>;
  /** Sets the remaining lifetime to `timeoutMs` from now (0 = no limit). */
  setTimeout(id: string, timeoutMs: number): SandboxInfo;
  /** Lets the sandbox live at least `timeoutMs` from now; never shortens it (an unlimited one stays so). */
  extendTimeout(id: string, timeoutMs: number): SandboxInfo;
  /** The sandbox's data-plane secrets (made at spawn; made now for sandboxes older than them). */
  accessTokens(id: string): AccessTokens;
  /** Whether `token` is the sandbox's secret of that kind (constant time); false for unknown sandboxes. */
  verifyAccessToken(id: string, kind: keyof AccessTokens, token: string | undefined): boolean;
  /** The sandbox-level environment variables given at spawn. */
  envVars(id: string): Record<string, string>;
  /** A sample of what the running sandbox uses now. */
  metrics(id: string, options?: { signal?: AbortSignal }): Promise<SandboxMetrics>;
  /**
   * The running sandbox's samples since it started, in [startMs, endMs] (either open), oldest first: bounded,
   * coarser as it ages (controller/sandboxes/metrics-series.ts). One sample now on a daemon that keeps none.
   */
  metricsHistory(
    id: string,
    range?: { startMs?: number; endMs?: number; signal?: AbortSignal },
  ): Promise<SandboxMetrics[]>;
  /** The end of the sandbox's serial console (at most `maxBytes`; the log itself is bounded per sandbox). */
  console(id: string, maxBytes?: number): Promise<string>;
  /** How this daemon confines its QEMUs and which limits its host can enforce. */
  confinementStatus(): ConfinementStatus;
  /**
   * Host-side use of running sandboxes (all, or those of `ids`; unknown or stopped ones are left out): memory of
   * each VM's QEMU process (RSS, PSS, private) and its CPU. Asks nothing of the guests.
   */
  usage(filter?: { ids?: readonly string[] }): Promise<SandboxUsage[]>;
  /** The host the daemon runs on: CPUs, load, memory, and how many sandboxes are in each state. */
  host(): Promise<HostStatus>;
  networkStatus(): NetworkStatus;
  /** Replaces a running sandbox's egress policy (src/net/policy.ts); conflict without a network of its own. */
  setNetworkPolicy(id: string, policy: EgressPolicyInput): Promise<SandboxInfo>;
  /**
   * Proxies one HTTP request to TCP `port` in sandbox `id` (`req.url` is the path in the guest), under the
   * sandbox's inbound settings (Host header, HTTPS ports). Resolves with null once the response is done, or
   * with why the port could not be reached (nothing written yet: the caller answers in its API's shape).
   * Rejects (before writing anything) for an unknown sandbox or one without a network the daemon can reach.
   */
  proxyHttp(
    id: string,
    port: number,
    req: http.IncomingMessage,
    res: http.ServerResponse,
  ): Promise<string | null>;
  /** Proxies an HTTP upgrade (WebSocket) to TCP `port` in sandbox `id`; throws like proxyHttp. */
  proxyUpgrade(id: string, port: number, req: http.IncomingMessage, socket: net.Socket, head: Buffer): void;
  ping(id: string, options?: { signal?: AbortSignal }): Promise<PingInfo>;
  /** Sandbox env vars are laid under `options.env`. */
  exec(id: string, argv: string[], options?: ExecOptions): Promise<ExecOutcome>;
  /** A cell in the warm interpreter; sandbox env vars are laid under `options.env`. */
  eval(id: string, code: string, options?: EvalOptions): Promise<EvalOutcome>;
  /**
   * Fork: BRANCH the running sandbox once (live when it was spawned with live_fork, else diff; it keeps
   * running) and restore `count` children from that snapshot, each succeeding or failing on its own. Children
   * inherit the source's metadata and env vars and get their own secrets.
   */
  fork(
    id: string,
    request: { count: number; timeoutMs?: number; signal?: AbortSignal },
  ): Promise<ForkOutcome>;
  procs: SandboxProcesses;
  contexts: SandboxContexts;
  /** BRANCH: snapshot the running sandbox into a new tag; it keeps running (see controller/snapshots/branch.ts). */
  branch(
    id: string,
    request: {
      tag?: string;
      mode?: "full" | "diff" | "live";
      wait?: boolean;
      /** v0.5 clients name the parent they expect; a mismatch is a conflict, not a silent re-parenting. */
      parentTag?: string;
      /**
       * Also point this template alias at the new snapshot (a named snapshot); the snapshot it named before is
       * deleted once nothing uses it.
       */
      alias?: string;
      signal?: AbortSignal;
    },
  ): Promise<BranchOutcome>;
  /** A new diff layer on `from` made by running `command` in a fresh sandbox (see sandboxes/snapshot-diff.ts). */
  snapshotDiff(request: {
    from: string;
    tag: string;
    command: string[];
    timeoutMs?: number;
    /** The tenant the new snapshot belongs to; absent: an admin's. */
    owner?: string | null;
    signal?: AbortSignal;
  }): Promise<BranchOutcome & { exit_code: number; stdout: string; stderr: string }>;
  files: {
    write(id: string, path: string, data: Buffer, options?: FileWriteOptions): Promise<{ bytes: number }>;
    read(
      id: string,
      path: string,
      options?: { maxBytes?: number; offset?: number; signal?: AbortSignal },
    ): Promise<FileContent>;
    list(
      id: string,
      path: string,
      options?: { depth?: number; maxEntries?: number; signal?: AbortSignal },
    ): Promise<FileListing>;
    stat(id: string, path: string, options?: { signal?: AbortSignal }): Promise<FileInfo>;
    remove(id: string, path: string, options?: { recursive?: boolean; signal?: AbortSignal }): Promise<void>;
    mkdir(
      id: string,
      path: string,
      options?: { parents?: boolean; mode?: number; user?: string; signal?: AbortSignal },
    ): Promise<{ created: boolean; entry: FileInfo }>;
    move(
      id: string,
      source: string,
      destination: string,
      options?: { user?: string; signal?: AbortSignal },
    ): Promise<FileInfo>;
    /** Changes under a directory until stopped; ends (rejecting `done`) when the sandbox goes away. */
    watch(id: string, path: string, options?: WatchOptions): WatchHandle;
  };
}

export type SnapshotStatus = "writing" | "ready" | "failed";

export interface SnapshotInfo {
  tag: string;
  created_at_unix: number;
  status: SnapshotStatus;
  bootable: boolean;
  template: string | null;
  accelerator: "kvm" | "tcg" | null;
  memory_mib: number | null;
  parent_tag: string | null;
  bytes: number;
  error: string | null;
  /** vCPUs of the machine children of it run on (null while it is being written). */
  vcpus: number | null;
  /** The sandbox it was BRANCHed from, or null. */
  source_sandbox: string | null;
  /** Template aliases naming it. */
  aliases: string[];
  /** Made by the daemon for its own use (a fork point); deleted once nothing needs it. */
  ephemeral: boolean;
  /** The tenant that owns it (see tenancy/tenant-view.ts); null: an admin's. */
  owner: string | null;
  /**
   * How it came to be: booted from a template, BRANCHed from a sandbox, compacted from a chain, a sandbox's paused
   * state (null: not on disk).
   */
  origin: "template" | "branch" | "compact" | "pause" | null;
  /** A branch's mode (full: stands alone; diff/live: a layer on its parent); null for other origins. */
  branch_mode: "full" | "diff" | "live" | null;
  /** Bytes its own files occupy on disk (allocated blocks; sparse RAM images count only what is stored). */
  disk_bytes: number;
  /**
   * The egress policy its sandboxes get when a spawn names none: its template's `[egress]`; null: the daemon's
   * default (`--egress`).
   */
  egress_default: EgressPolicy | null;
}

/** One layer of a chain and what it costs on disk (snapshots/chains.ts, snapshot-info). */
export interface LayerUsage {
  tag: string;
  origin: SnapshotManifest["origin"]["kind"];
  memory: {
    format: "flat" | "layer";
    /** Pages stored in this layer's memory file. */
    pages: number;
    /** Guest RAM size. */
    logical_bytes: number;
    /** Bytes the memory file occupies on disk (st_blocks * 512: holes and shared extents as the fs counts). */
    physical_bytes: number;
  };
  disk: {
    /** The qcow2 layer's virtual size (the guest's disk size). */
    logical_bytes: number;
    physical_bytes: number;
    /** Where the layer reads through to, as recorded in it (relative). */
    backing: string | null;
  };
  vmstate_bytes: number;
}

export interface ChainDetail {
  tag: string;
  /** 0 for a snapshot without a parent. */
  chain_depth: number;
  parent_tag: string | null;
  /** sha256 of the parent's manifest, as recorded in this snapshot (forkd v0.5's parent_content_hash). */
  parent_content_hash: string | null;
  /** Root first, up to the parent (as far as the chain can be followed). */
  ancestors: string[];
  /** Direct dependents. */
  dependents: string[];
  /** Everything that depends on this snapshot, parents before their children. */
  all_dependents: string[];
  /** Root first, this snapshot last. */
  layers: LayerUsage[];
  /** Totals of `layers`: what a child of this snapshot reads from. */
  chain_bytes: { memory_physical: number; disk_physical: number; vmstate: number };
  /** forkd v0.5's fields, for this snapshot alone. */
  memory_logical_bytes: number;
  memory_physical_bytes: number;
  vmstate_bytes: number;
  /** Why the chain cannot be restored (missing or changed parent, too deep), or null. */
  chain_error: string | null;
}

/** A snapshot with its chain: ancestors, dependents, bytes per layer (see snapshots/chains.ts). */
export type SnapshotDetail = SnapshotInfo & Omit<ChainDetail, "tag" | "parent_tag">;

export interface SnapshotCreateRequest {
  tag: string;
  /** Template name; default: the tag. */
  template?: string;
  /** forkd v0.5's form: the kernel and root filesystem of a built image on this host (see imageOfFiles). */
  image?: { kernel: string; rootfs: string };
  /** The tenant the snapshot belongs to; absent: an admin's. */
  owner?: string | null;
  signal?: AbortSignal;
}

export interface SnapshotDeleteOptions {
  /** Delete every snapshot that depends on it too (leaves first). */
  cascade?: boolean;
  /** Delete it and leave its dependents orphaned (unbootable, and they say so). */
  force?: boolean;
}

export interface SnapshotService {
  list(): Promise<SnapshotInfo[]>;
  get(tag: string): Promise<SnapshotInfo>;
  /** `get` plus the chain; not_found if unknown. */
  detail(tag: string): Promise<SnapshotDetail>;
  /**
   * Builds the template's image if needed (or takes the built image `image` names), boots, warms and snapshots.
   * conflict if the tag exists; invalid_argument if `image` names files outside the allowed image directories.
   */
  create(request: SnapshotCreateRequest): Promise<SnapshotInfo>;
  /**
   * not_found if unknown; conflict if a running sandbox maps it (directly or through a dependent), or if others
   * depend on it and neither cascade nor force is set. Returns the tags deleted, in order.
   */
  delete(tag: string, options?: SnapshotDeleteOptions): Promise<string[]>;
  /** Folds the chain ending at `from` into a new flat snapshot `to`; conflict if `to` exists. */
  compact(request: {
    from: string;
    to: string;
    owner?: string | null;
    signal?: AbortSignal;
  }): Promise<SnapshotInfo>;
  /** A pack of the chain ending at `tag` (snapshots/pack.ts), as a file the caller sends and then disposes of. */
  pack(request: PackRequest): Promise<{ file: string; result: PackResult; dispose(): Promise<void> }>;
  /** Receives a pack and installs it, all or nothing. */
  unpack(request: UnpackRequest): Promise<UnpackResult>;
  /** Pulls a chain from an OCI registry and installs it, with every check unpack makes (snapshots/registry.ts). */
  pull(request: RegistryPullRequest): Promise<RegistryPullResult>;
  /** Pushes the chain ending at `tag` to an OCI registry; blobs the registry has are not sent again. */
  push(request: RegistryPushRequest): Promise<RegistryPushResult>;
  /**
   * Removes the snapshot's aliases at once, and the snapshot as soon as nothing needs it any more (at once when
   * nothing does). not_found if unknown.
   */
  retire(tag: string): Promise<"deleted" | "deferred">;
  /** Names for snapshot tags (see snapshots/template-aliases.ts). */
  aliases: {
    list(): Promise<TemplateAlias[]>;
    get(alias: string): Promise<TemplateAlias>;
    /** An existing alias keeps its owner unless `owner` is given. */
    set(alias: string, tag: string, owner?: string | null): Promise<TemplateAlias>;
    delete(alias: string): void | Promise<void>;
  };
  /**
   * A template name to a snapshot tag: an alias, else a tag; with `orDefault`, a name that is neither means
   * the daemon's default snapshot. not_found otherwise.
   */
  resolveTemplate(name: string, options?: { orDefault?: boolean }): Promise<ResolvedTemplate>;
  /** The tag `orDefault` resolves to (`--default-snapshot`, else pyagent), when that snapshot exists. */
  defaultTemplate(): Promise<string | null>;
}

export interface PackRequest {
  tag: string;
  /** zstd level 1..19. */
  level?: number;
  /** Leave the guest image out (it unpacks only where that image build exists). */
  withoutImage?: boolean;
  signal?: AbortSignal;
}

export interface UnpackRequest {
  /** The pack's bytes as they arrive. */
  body: AsyncIterable<Buffer>;
  /** Refuse a pack larger than this. */
  maxBytes: number;
  /** Install the head under this tag. */
  tag?: string;
  /** Replace existing snapshots of the same tags that differ. */
  force?: boolean;
  signal?: AbortSignal;
}

export interface RegistryPullRequest {
  /** host[:port]/name[:tag][@sha256:...] */
  reference: string;
  /** Refuse the pull unless the registry's manifest has this digest. */
  digest?: string;
  /** Install the head under this tag. */
  tag?: string;
  /** Plain HTTP or unverified TLS to a registry that is not on a loopback address. */
  insecure?: boolean;
  /** The tenant what it installs belongs to; absent: an admin's. */
  owner?: string | null;
  signal?: AbortSignal;
}

export interface RegistryPullResult extends UnpackResult {
  reference: string;
  /** The pulled manifest's digest. */
  digest: string;
}

export interface RegistryPushRequest {
  tag: string;
  reference: string;
  insecure?: boolean;
  withoutImage?: boolean;
  signal?: AbortSignal;
}

export interface RegistryPushResult {
  reference: string;
  digest: string;
  /** Root first. */
  chain: string[];
  uploaded_bytes: number;
  ms: number;
}

/** What a pack of a chain holds (snapshots/pack.ts). */
export interface PackResult {
  out: string;
  /** Root first. */
  chain: string[];
  files: number;
  /** Bytes of the packed files (uncompressed) and of the pack. */
  content_bytes: number;
  pack_bytes: number;
  image_included: boolean;
  ms: number;
}

/** What an unpack (or a registry pull) installed (snapshots/unpack.ts). */
export interface UnpackResult {
  head: string;
  /** Root first, as installed. */
  chain: string[];
  /** Layers written by this unpack. */
  installed: string[];
  /** Layers already present, identical, and kept. */
  reused: string[];
  /** Existing snapshots replaced (`force`). */
  replaced: string[];
  /** Local snapshots that depended on a replaced one and are now unbootable. */
  orphaned: string[];
  image: "installed" | "present";
  /** Bytes read out of the pack. */
  content_bytes: number;
  ms: number;
}
