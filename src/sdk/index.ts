/**
 * forkd's TypeScript SDK: `Sandbox` (E2B-style ergonomics) and `Controller` (the daemon's REST API, forkd v0.5
 * method set). Node 20+, no dependencies. Importing it defines Symbol.asyncDispose where Node lacks it.
 */
import "./dispose.js";

export { Controller, DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS, type PortEndpoint } from "./controller.js";
export {
  AuthenticationError,
  CommandExitError,
  type CommandResult,
  ConflictError,
  ConnectionError,
  ForkdSdkError,
  InvalidArgumentError,
  NotFoundError,
  NotImplementedError,
  PayloadTooLargeError,
  RateLimitError,
  SandboxNotFoundError,
  ServerError,
  TimeoutError,
  UnavailableError,
} from "./errors.js";
export { parseNdjson, parseSse, type StreamEvent } from "./event-stream.js";
export type { ExecEvent } from "./exec-stream.js";
export type {
  BranchOptions,
  CreateSnapshotOptions,
  EvalCodeOptions,
  ExecCommandOptions,
  ExecStreamOptions,
  NetworkPolicy,
  ReadFileOptions,
  SpawnOptions,
  WriteFileOptions,
} from "./options.js";
export type { PackDownload, PackOptions, UnpackOptions } from "./pack-transfer.js";
export { type CommandOptions, Commands } from "./sandbox/commands.js";
export {
  type EntryInfo,
  type FileData,
  type FileReadOptions,
  Files,
  type FileWriteOptions,
} from "./sandbox/files.js";
export {
  type CodeResult,
  type ExecutionError,
  type RunCodeOptions,
  Sandbox,
  type SandboxConnectOptions,
  type SandboxCreateOptions,
  type SandboxResumeOptions,
} from "./sandbox/sandbox.js";
export {
  type ConnectionOptions,
  type DaemonAddress,
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_DAEMON_URL,
  DEFAULT_REQUEST_TIMEOUT_MS,
  DEFAULT_SANDBOX_TIMEOUT_MS,
  parseDaemonUrl,
  type RequestOptions,
} from "./settings.js";
export { SDK_VERSION } from "./version.js";
export type * from "./wire.js";
