/** The host-side view of agent results: camelCase, Buffers for bytes, no wire details. */
import type {
  ContextLanguage,
  DisplayData,
  FsOp,
  Interpreter,
  ProcSignalName,
  PtySize,
  RichFormats,
  WarmState,
} from "../protocol/index.js";

export type {
  ContextLanguage,
  DisplayData,
  FsOp,
  Interpreter,
  ProcSignalName,
  PtySize,
  RichFormats,
  WarmState,
};

export interface Hello {
  protocol: number;
  agentVersion: string;
  template: string;
  interpreter: Interpreter;
  warm: WarmState;
  sandboxId: string | null;
}

export interface PingInfo extends Hello {
  hostname: string;
  uptimeMs: number;
}

/** What the guest uses now, as it sees it (the agent's `stats`). */
export interface GuestStats {
  memTotalBytes: number;
  /** MemAvailable. */
  memAvailableBytes: number;
  /** Page cache (Cached + Buffers). */
  memCacheBytes: number;
  diskTotalBytes: number;
  /** Blocks in use, as df counts them. */
  diskUsedBytes: number;
}

export interface RestoreRequest {
  /** CLOCK_REALTIME to set in the guest, ns since the epoch. */
  timeNs: bigint;
  /** Fresh host entropy (32..4096 bytes) mixed into the guest kernel RNG, which is then forced to reseed. */
  entropy: Buffer;
  hostname: string;
  sandboxId: string;
}

export interface RestoreInfo {
  /** "dry-run" when the agent was started with fix-ups that do not touch the system (tests). */
  applied: "system" | "dry-run";
  entropyBytes: number;
  hostname: string;
  sandboxId: string;
  durationMs: number;
}

export interface CallOptions {
  signal?: AbortSignal;
}

export interface ExecOptions extends CallOptions {
  env?: Record<string, string>;
  /** Absolute working directory in the guest (default: the user's home with `user`, else /). */
  cwd?: string;
  /** A user of the guest's /etc/passwd to run as (default root); not_found if the image has none. */
  user?: string;
  stdin?: Buffer | string | AsyncIterable<Buffer | Uint8Array | string>;
  /** Guest-side limit; the process group is killed when it passes (default 60 s). */
  timeoutMs?: number;
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
  /** Bytes of stdout and of stderr kept in the result (default 1 MiB each); the callbacks see everything. */
  maxCaptureBytes?: number;
}

export interface ExecOutcome {
  /** null when the process was killed by a signal. */
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  stdout: Buffer;
  stderr: Buffer;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** Total bytes the process wrote, captured or not. */
  stdoutBytes: number;
  stderrBytes: number;
  durationMs: number;
}

export interface EvalOptions extends CallOptions {
  /** Guest-side limit, counted from when the agent received the cell (default 60 s). */
  timeoutMs?: number;
  /** Interpreter context to run in (default `default`, the template's warm namespace). */
  context?: string;
  /** Working directory for the cell (the context keeps it). */
  cwd?: string;
  /** Extra environment laid over os.environ while the cell runs. */
  env?: Record<string, string>;
  /**
   * Streamed output: with either callback the cell's prints arrive while it runs (and the outcome's stdout and
   * stderr are empty).
   */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  /**
   * Display outputs (`display(value)`, matplotlib figures open at the end of the cell) as they happen; with it
   * the cell streams (its prints too, one line per callback). Without streaming `display` prints the repr.
   */
  onDisplay?: (data: DisplayData) => void;
}

export interface PythonError {
  type: string;
  message: string;
  traceback: string;
}

export interface EvalOutcome {
  /** repr() of the cell's trailing expression, or null. */
  result: string | null;
  resultTruncated: boolean;
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  error: PythonError | null;
  timedOut: boolean;
  durationMs: number;
  /** Richer representations of the result value (IPython display protocol), when it offers them. */
  formats?: RichFormats;
  /** Cells the context has run, this one included. */
  executionCount?: number;
}

export interface WarmupOutcome extends EvalOutcome {
  warm: WarmState;
}

export type FileType = "file" | "dir" | "symlink" | "other";

export interface FileInfo {
  name: string;
  type: FileType;
  size: number;
  /** Permission bits. */
  mode: number;
  mtimeMs: number;
  linkTarget?: string;
  /** Absolute path of the entry. */
  path?: string;
  uid?: number;
  gid?: number;
  /** Owner and group names from the guest's /etc/passwd and /etc/group (the number when unknown). */
  owner?: string;
  group?: string;
}

export interface FileContent {
  data: Buffer;
  /** Size of the file as stat reports it (0 for most /proc files). */
  size: number;
  /** More bytes followed the ones returned. */
  truncated: boolean;
}

export interface FileListing {
  entries: FileInfo[];
  truncated: boolean;
}

export interface FileWriteOptions extends CallOptions {
  mode?: number;
  parents?: boolean;
  /** Owner of the file and of the directories created for it (default root). */
  user?: string;
  /** Append instead of replacing atomically. */
  append?: boolean;
}

export interface AgentFiles {
  /** Atomically replaces `path` (parents created unless `parents: false`), or appends with `append`. */
  write(path: string, data: Buffer | string, options?: FileWriteOptions): Promise<{ bytes: number }>;
  read(path: string, options?: CallOptions & { maxBytes?: number; offset?: number }): Promise<FileContent>;
  /** `depth` > 1 descends into subdirectories (entries then carry `path`). */
  list(path: string, options?: CallOptions & { maxEntries?: number; depth?: number }): Promise<FileListing>;
  stat(path: string, options?: CallOptions): Promise<FileInfo>;
  remove(path: string, options?: CallOptions & { recursive?: boolean }): Promise<void>;
  /** Creates a directory (and its parents unless `parents: false`); `created: false` if it existed. */
  mkdir(
    path: string,
    options?: CallOptions & { parents?: boolean; mode?: number; user?: string },
  ): Promise<{ created: boolean; entry: FileInfo }>;
  /** rename(2), creating the destination's parents. */
  move(source: string, destination: string, options?: CallOptions & { user?: string }): Promise<FileInfo>;
  /** Streams changes under a directory until stopped (or until the directory is removed). */
  watch(path: string, options?: WatchOptions): WatchHandle;
}

// ---- watch

export interface FsEvent {
  /** Relative to the watched path. */
  name: string;
  op: FsOp;
}

export interface WatchOptions extends CallOptions {
  recursive?: boolean;
  onEvent?: (event: FsEvent) => void;
  /** Events buffered for the `events` iterator before the watch fails as too slow (default 4096). */
  maxBufferedEvents?: number;
}

export interface WatchEnd {
  events: number;
  /** Events the guest dropped because the host fell behind. */
  dropped: number;
  reason: "cancelled" | "removed";
}

export interface WatchHandle {
  /** Every event, in order (buffered up to `maxBufferedEvents` for a slow reader). Ends with the watch. */
  events: AsyncIterable<FsEvent>;
  /** Resolves when the watch ended: after stop(), or when the watched directory was removed. */
  done: Promise<WatchEnd>;
  /** Ends the watch; resolves with the guest's summary. */
  stop(): Promise<WatchEnd>;
}

// ---- interpreter contexts

export interface ContextInfo {
  id: string;
  cwd: string;
  language: ContextLanguage;
}

export interface AgentContexts {
  /**
   * A fresh namespace starting from the template's warm-up names; for bash or javascript a process of that
   * language (not_implemented where the image lacks it).
   */
  create(
    options?: CallOptions & { id?: string; cwd?: string; language?: ContextLanguage },
  ): Promise<ContextInfo>;
  list(options?: CallOptions): Promise<ContextInfo[]>;
  /** The namespace starts again from the warm-up's names. */
  restart(id: string, options?: CallOptions): Promise<ContextInfo>;
  remove(id: string, options?: CallOptions): Promise<void>;
}

// ---- processes that outlive their call

/** Exactly one of pid or tag. */
export type ProcSelector = { pid: number; tag?: undefined } | { tag: string; pid?: undefined };

export type ProcStream = "stdout" | "stderr" | "pty";

export interface ProcOutput {
  stream: ProcStream;
  data: Buffer;
}

export interface ProcEnd {
  pid: number;
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  /** Set when the process could not be started or was lost. */
  error: string | null;
  durationMs: number;
}

export interface ProcAttachOptions extends CallOptions {
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
  onPty?: (chunk: Buffer) => void;
  /**
   * Bytes of output buffered for the `output` iterator while nobody reads it; beyond that the handle detaches
   * (the process keeps running) and the iterator throws. Default 4 MiB.
   */
  maxBufferedBytes?: number;
}

export interface ProcStartOptions extends ProcAttachOptions {
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  tag?: string;
  /** Run on a pseudo-terminal of this size. */
  pty?: PtySize;
  /** Keep stdin open for input() (a pty always takes input). */
  stdin?: boolean;
  /** SIGKILL the process group after this long (default: no limit). */
  timeoutMs?: number;
}

export interface ProcHandle {
  /** The guest pid, once the agent reported the process started. */
  pid: Promise<number>;
  /** How the process ended. Rejects when the call failed, or with `unavailable` after detach(). */
  done: Promise<ProcEnd>;
  /** Output in order; ends when the process ended (or throws when the call failed or was detached). */
  output: AsyncIterable<ProcOutput>;
  /** Stops following the process; it keeps running in the guest (proc.connect finds it again). */
  detach(): void;
}

export interface ProcInfo {
  pid: number;
  tag: string | null;
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  user: string;
  pty: boolean;
  running: boolean;
  exitCode: number | null;
}

export interface AgentProcesses {
  start(argv: string[], options?: ProcStartOptions): ProcHandle;
  connect(selector: ProcSelector, options?: ProcAttachOptions): ProcHandle;
  list(options?: CallOptions): Promise<ProcInfo[]>;
  /** Writes to the process's stdin (or terminal); `eof` closes it afterwards. */
  input(
    selector: ProcSelector,
    data: Buffer | string,
    options?: CallOptions & { eof?: boolean },
  ): Promise<void>;
  closeStdin(selector: ProcSelector, options?: CallOptions): Promise<void>;
  /** Signals the process's whole process group. */
  signal(selector: ProcSelector, signal: ProcSignalName, options?: CallOptions): Promise<void>;
  resize(selector: ProcSelector, size: PtySize, options?: CallOptions): Promise<void>;
}
