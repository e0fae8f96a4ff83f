/**
 * The JSON documents of the daemon's REST API (docs/api.md, docs/openapi.json), hand-written here so the SDK
 * imports nothing from the daemon. Field names are the wire's (snake_case), as forkd v0.5 clients expect.
 */

export type SandboxStatus = "starting" | "running" | "stopping" | "dead";

export interface SandboxInfo {
  id: string;
  snapshot_tag: string;
  created_at_unix: number;
  pid: number | null;
  memory_limit_mib: number | null;
  status: SandboxStatus | (string & {});
  /** When the sandbox will be killed unless its timeout is extended (unix ms); null = no lifetime limit. */
  expires_at_unix_ms?: number | null;
  /** Restore to ready, in ms. */
  ready_ms?: number | null;
  accelerator?: "kvm" | "tcg" | (string & {});
  [field: string]: unknown;
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
  [field: string]: unknown;
}

/** POST /v1/sandboxes/:id/exec (forkd v0.5 compatible). */
export interface ExecResult {
  stdout: string;
  stderr: string;
  /** null when the process was killed by a signal. */
  exit_code: number | null;
  signal?: string | null;
  timed_out?: boolean;
  [field: string]: unknown;
}

/** A Python exception raised by evaluated code. */
export interface PythonErrorInfo {
  type: string;
  message: string;
  traceback: string;
}

/** POST /v1/sandboxes/:id/eval (forkd v0.5 compatible: `result`, `error`, `exit_code`). */
export interface EvalResult {
  /** repr() of the code's trailing expression, or null. */
  result: string | null;
  /** null on success; a message (v0.5) or the exception's details. */
  error: string | PythonErrorInfo | null;
  exit_code: number;
  stdout?: string;
  stderr?: string;
  [field: string]: unknown;
}

export interface PingResult {
  [field: string]: unknown;
}

export type FileType = "file" | "dir" | "symlink" | "other";

export interface FileInfo {
  name: string;
  type: FileType | (string & {});
  size: number;
  mode: number;
  mtime_ms?: number;
  link_target?: string;
  [field: string]: unknown;
}

export interface FileListing {
  entries: FileInfo[];
  truncated?: boolean;
}

export interface VersionInfo {
  version: string;
  api: string;
  [field: string]: unknown;
}
