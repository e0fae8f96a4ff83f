/**
 * The daemon's view of sandboxes and snapshots: what the REST API (src/api) and, through it, the CLI and SDKs
 * can do. Implemented by SandboxManager (sandbox-manager.ts) and SnapshotService (snapshot-service.ts).
 * Errors are ForkdErrors whose code maps to an HTTP status (src/common/errors.ts).
 */

import type http from "node:http";
import type net from "node:net";
import type {
  ContextInfo,
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
import type { ChainDetail } from "./chains.js";
import type { PackResult, UnpackResult } from "./packs.js";
import type { NetworkRequest, SandboxNetworkInfo } from "./sandbox-network.js";
import type { ResolvedTemplate, TemplateAlias } from "./template-aliases.js";

export type { EgressPolicy, EgressPolicyInput, NetworkRequest, SandboxNetworkInfo };

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

export type SandboxStatus = "starting" | "running" | "stopping" | "dead";

export interface SandboxInfo {
  id: string;
  snapshot_tag: string;
  created_at_unix: number;
  pid: number | null;
  memory_limit_mib: number | null;
  status: SandboxStatus;
  /** When the sandbox will be killed unless its timeout is extended (unix ms); null = no lifetime limit. */
  expires_at_unix_ms: number | null;
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
  network: SandboxNetworkInfo;
  inbound: InboundSettings;
}

/**
 * How a sandbox's ports are reached through the daemon (E2B's network.allowPublicTraffic, maskRequestHost and
 * httpsPorts; see sandbox-settings.ts for the checks). `hostHeader` and `httpsPorts` hold for every front (the
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
  /** Not measured yet (0): the guest reports no filesystem usage to the host. */
  disk_total_bytes: number;
  disk_used_bytes: number;
}

export interface SpawnRequest {
  snapshotTag: string;
  n: number;
  memoryLimitMiB?: number;
  /** Lifetime in ms; 0 = no limit; absent: the daemon's default (none unless `--default-timeout-ms`). */
  timeoutMs?: number;
  /** Map RAM from a tmpfs copy of the snapshot's image, so the sandbox can be live-BRANCHed. */
  liveFork?: boolean;
  /** String metadata to find the sandboxes by later (see sandbox-settings.ts for the limits). */
  metadata?: Record<string, string>;
  /** Environment variables every process and cell in the sandboxes gets (a call's own env wins). */
  env?: Record<string, string>;
  /** The alias `snapshotTag` was resolved from, recorded for the sandbox's info. */
  templateAlias?: string;
  /** Egress policy, or "none" (a NIC with no uplink); default: the daemon's --egress. */
  network?: NetworkRequest;
  /** How its ports are reached; default: public, the request's own Host, plain HTTP (E2B's defaults). */
  inbound?: Partial<InboundSettings>;
  signal?: AbortSignal;
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
  create(id: string, options?: { id?: string; cwd?: string; signal?: AbortSignal }): Promise<ContextInfo>;
  list(id: string, options?: { signal?: AbortSignal }): Promise<ContextInfo[]>;
  restart(id: string, context: string, options?: { signal?: AbortSignal }): Promise<ContextInfo>;
  remove(id: string, context: string, options?: { signal?: AbortSignal }): Promise<void>;
}

export interface SandboxService {
  spawn(request: SpawnRequest): Promise<SandboxInfo[]>;
  /** BRANCHes admitted and not yet answered, and the host-wide cap on them (metrics). */
  branchLoad(): { inFlight: number; cap: number };
  list(filter?: { snapshotTag?: string }): SandboxInfo[];
  get(id: string): SandboxInfo;
  /** Kills and forgets the sandbox; not_found if unknown. */
  kill(id: string): Promise<void>;
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
  metrics(id: string, options?: { signal?: AbortSignal }): Promise<SandboxMetrics>;
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
  /** BRANCH: snapshot the running sandbox into a new tag; it keeps running (see controller/branch.ts). */
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
  /** A new diff layer on `from` made by running `command` in a fresh sandbox (see SandboxManager.snapshotDiff). */
  snapshotDiff(request: {
    from: string;
    tag: string;
    command: string[];
    timeoutMs?: number;
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
}

/** A snapshot with its chain: ancestors, dependents, bytes per layer (see chains.ts). */
export type SnapshotDetail = SnapshotInfo & Omit<ChainDetail, "tag" | "parent_tag">;

export interface SnapshotCreateRequest {
  tag: string;
  /** Template name; default: the tag. */
  template?: string;
  /** forkd v0.5's form: the kernel and root filesystem of a built image on this host (see imageOfFiles). */
  image?: { kernel: string; rootfs: string };
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
  compact(request: { from: string; to: string; signal?: AbortSignal }): Promise<SnapshotInfo>;
  /** A pack of the chain ending at `tag` (packs.ts), as a file the caller sends and then disposes of. */
  pack(request: PackRequest): Promise<{ file: string; result: PackResult; dispose(): Promise<void> }>;
  /** Receives a pack and installs it, all or nothing. */
  unpack(request: UnpackRequest): Promise<UnpackResult>;
  /**
   * Removes the snapshot's aliases at once, and the snapshot as soon as nothing needs it any more (at once when
   * nothing does). not_found if unknown.
   */
  retire(tag: string): Promise<"deleted" | "deferred">;
  /** Names for snapshot tags (see template-aliases.ts). */
  aliases: {
    list(): TemplateAlias[];
    get(alias: string): TemplateAlias;
    set(alias: string, tag: string): Promise<TemplateAlias>;
    delete(alias: string): void;
  };
  /**
   * A template name to a snapshot tag: an alias, else a tag; with `orDefault`, a name that is neither means
   * the daemon's default snapshot. not_found otherwise.
   */
  resolveTemplate(name: string, options?: { orDefault?: boolean }): Promise<ResolvedTemplate>;
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
