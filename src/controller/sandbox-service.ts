/**
 * The daemon's view of sandboxes and snapshots: what the REST API (src/api) and, through it, the CLI and SDKs
 * can do. Implemented by SandboxManager (sandbox-manager.ts) and SnapshotService (snapshot-service.ts).
 * Errors are ForkdErrors whose code maps to an HTTP status (src/common/errors.ts).
 */

import type http from "node:http";
import type net from "node:net";
import type {
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  FileContent,
  FileInfo,
  FileListing,
  PingInfo,
} from "../agent/host/types.js";
import type { EgressPolicy, EgressPolicyInput } from "../net/policy.js";
import type { ChainDetail } from "./chains.js";
import type { NetworkRequest, SandboxNetworkInfo } from "./sandbox-network.js";

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
  parent_tag: string;
  status: "writing" | "ready";
  pause_ms: number;
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
  network: SandboxNetworkInfo;
}

export interface SpawnRequest {
  snapshotTag: string;
  n: number;
  memoryLimitMiB?: number;
  /** Lifetime; default DEFAULT_SANDBOX_TIMEOUT_MS; 0 = no limit. */
  timeoutMs?: number;
  /** Map RAM from a tmpfs copy of the snapshot's image, so the sandbox can be live-BRANCHed. */
  liveFork?: boolean;
  /** Egress policy, or "none" (a NIC with no uplink); default: the daemon's --egress. */
  network?: NetworkRequest;
  signal?: AbortSignal;
}

export interface SandboxService {
  spawn(request: SpawnRequest): Promise<SandboxInfo[]>;
  list(filter?: { snapshotTag?: string }): SandboxInfo[];
  get(id: string): SandboxInfo;
  /** Kills and forgets the sandbox; not_found if unknown. */
  kill(id: string): Promise<void>;
  /** Kills every sandbox (of one snapshot, if given); returns the ids killed. */
  killAll(filter?: { snapshotTag?: string }): Promise<string[]>;
  /** Sets the remaining lifetime to `timeoutMs` from now (0 = no limit). */
  setTimeout(id: string, timeoutMs: number): SandboxInfo;
  networkStatus(): NetworkStatus;
  /** Replaces a running sandbox's egress policy (src/net/policy.ts); conflict without a network of its own. */
  setNetworkPolicy(id: string, policy: EgressPolicyInput): Promise<SandboxInfo>;
  /**
   * Proxies one HTTP request to TCP `port` in sandbox `id` (`req.url` is the path in the guest); a port nothing
   * listens on answers 502. Rejects (before writing anything) for an unknown or unreachable sandbox.
   */
  proxyHttp(id: string, port: number, req: http.IncomingMessage, res: http.ServerResponse): Promise<void>;
  /** Proxies an HTTP upgrade (WebSocket) to TCP `port` in sandbox `id`; throws like proxyHttp. */
  proxyUpgrade(id: string, port: number, req: http.IncomingMessage, socket: net.Socket, head: Buffer): void;
  ping(id: string, options?: { signal?: AbortSignal }): Promise<PingInfo>;
  exec(id: string, argv: string[], options?: ExecOptions): Promise<ExecOutcome>;
  eval(
    id: string,
    code: string,
    options?: { timeoutMs?: number; signal?: AbortSignal },
  ): Promise<EvalOutcome>;
  /** BRANCH: snapshot the running sandbox into a new tag; it keeps running (see controller/branch.ts). */
  branch(
    id: string,
    request: {
      tag?: string;
      mode?: "full" | "diff" | "live";
      wait?: boolean;
      /** v0.5 clients name the parent they expect; a mismatch is a conflict, not a silent re-parenting. */
      parentTag?: string;
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
    write(
      id: string,
      path: string,
      data: Buffer,
      options?: { mode?: number; signal?: AbortSignal },
    ): Promise<{ bytes: number }>;
    read(
      id: string,
      path: string,
      options?: { maxBytes?: number; signal?: AbortSignal },
    ): Promise<FileContent>;
    list(id: string, path: string, options?: { signal?: AbortSignal }): Promise<FileListing>;
    stat(id: string, path: string, options?: { signal?: AbortSignal }): Promise<FileInfo>;
    remove(id: string, path: string, options?: { recursive?: boolean; signal?: AbortSignal }): Promise<void>;
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
}

/** A snapshot with its chain: ancestors, dependents, bytes per layer (see chains.ts). */
export type SnapshotDetail = SnapshotInfo & Omit<ChainDetail, "tag" | "parent_tag">;

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
  /** Builds the template's image if needed, boots, warms and snapshots. conflict if the tag exists. */
  create(request: { tag: string; template: string; signal?: AbortSignal }): Promise<SnapshotInfo>;
  /**
   * not_found if unknown; conflict if a running sandbox maps it (directly or through a dependent), or if others
   * depend on it and neither cascade nor force is set. Returns the tags deleted, in order.
   */
  delete(tag: string, options?: SnapshotDeleteOptions): Promise<string[]>;
  /** Folds the chain ending at `from` into a new flat snapshot `to`; conflict if `to` exists. */
  compact(request: { from: string; to: string; signal?: AbortSignal }): Promise<SnapshotInfo>;
}
