/** The host-side view of agent results: camelCase, Buffers for bytes, no wire details. */
import type { Interpreter, WarmState } from "../protocol/index.js";

export type { Interpreter, WarmState };

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
  /** Absolute working directory in the guest (default /). */
  cwd?: string;
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

export interface AgentFiles {
  /** Atomically replaces `path` (parents created unless `parents: false`). */
  write(
    path: string,
    data: Buffer | string,
    options?: CallOptions & { mode?: number; parents?: boolean },
  ): Promise<{ bytes: number }>;
  read(path: string, options?: CallOptions & { maxBytes?: number; offset?: number }): Promise<FileContent>;
  list(path: string, options?: CallOptions & { maxEntries?: number }): Promise<FileListing>;
  stat(path: string, options?: CallOptions): Promise<FileInfo>;
  remove(path: string, options?: CallOptions & { recursive?: boolean }): Promise<void>;
}
