/**
 * The daemon's view of sandboxes and snapshots: what the REST API (src/api) and, through it, the CLI and SDKs
 * can do. Implemented by SandboxManager (sandbox-manager.ts) and SnapshotService (snapshot-service.ts).
 * Errors are ForkdErrors whose code maps to an HTTP status (src/common/errors.ts).
 */
import type {
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  FileContent,
  FileInfo,
  FileListing,
  PingInfo,
} from "../agent/host/types.js";
import type { ChainDetail } from "./chains.js";
import type { PackResult, UnpackResult } from "./packs.js";

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
}

export interface SpawnRequest {
  snapshotTag: string;
  n: number;
  memoryLimitMiB?: number;
  /** Lifetime in ms; 0 = no limit; absent: the daemon's default (none unless `--default-timeout-ms`). */
  timeoutMs?: number;
  /** Map RAM from a tmpfs copy of the snapshot's image, so the sandbox can be live-BRANCHed. */
  liveFork?: boolean;
  signal?: AbortSignal;
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
