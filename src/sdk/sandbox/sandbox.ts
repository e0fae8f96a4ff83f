/**
 * Sandbox: one forkd sandbox with the ergonomics of the E2B SDK — `Sandbox.create`, `sandbox.commands.run`,
 * `sandbox.runCode`, `sandbox.files`, `sandbox.setTimeout`, `sandbox.pause`/`Sandbox.resume`, `sandbox.kill`, and
 * `await using` disposal.
 */
import "../dispose.js";
import { Controller, DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS } from "../controller.js";
import {
  ConflictError,
  ConnectionError,
  InvalidArgumentError,
  NotFoundError,
  SandboxNotFoundError,
  TimeoutError,
  UnavailableError,
} from "../errors.js";
import type { NetworkPolicy } from "../options.js";
import {
  type ConnectionOptions,
  checkDurationMs,
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_SANDBOX_TIMEOUT_MS,
  type RequestOptions,
} from "../settings.js";
import type {
  BranchResult,
  EvalResult,
  PauseResult,
  SandboxInfo,
  SandboxNetwork,
  SandboxStatus,
  SnapshotInfo,
} from "../wire.js";
import { Commands } from "./commands.js";
import { Files } from "./files.js";

export interface SandboxCreateOptions extends ConnectionOptions {
  /**
   * Spawn from the snapshot tagged with this template's name; if there is none yet, the daemon first builds
   * it from the template (minutes the first time). Give `template` or `snapshotTag`.
   */
  template?: string;
  /** Spawn from this existing snapshot. */
  snapshotTag?: string;
  /** The sandbox's lifetime in ms: it is killed this long after creation unless extended; 0 = no limit. @default 300_000 */
  timeoutMs?: number;
  memoryLimitMib?: number;
  /** Map the sandbox's RAM from tmpfs so it can be BRANCHed in `live` mode. */
  liveFork?: boolean;
  /**
   * Egress policy (E2B's `network`: allowOut/denyOut; `egress: "deny"` is E2B's allowInternetAccess: false), or
   * "none" for a NIC that leads nowhere. @default the snapshot's template default (`[egress]`), else the
   * daemon's --egress
   */
  network?: NetworkPolicy | "none";
  /**
   * What the end of the lifetime does (E2B's lifecycle `onTimeout`): kill the sandbox, or pause it to disk so
   * `Sandbox.resume`/`Sandbox.connect` can wake it where it was. @default "kill"
   */
  onTimeout?: "kill" | "pause";
  /** Longest wait for building a missing template snapshot, in ms; 0 = no limit. @default 1_800_000 */
  snapshotTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface SandboxConnectOptions extends ConnectionOptions {
  signal?: AbortSignal;
}

export interface SandboxResumeOptions extends SandboxConnectOptions {
  /** Its lifetime from now in ms (0 = no limit). @default the lifetime it had */
  timeoutMs?: number;
}

export interface RunCodeOptions extends RequestOptions {
  /** Kill the evaluation after this many ms; 0 = no limit. @default 60_000 */
  timeoutMs?: number;
}

/** A Python exception raised by `runCode` (field names as in E2B's code interpreter). */
export interface ExecutionError {
  /** Exception class, e.g. "ZeroDivisionError". */
  name: string;
  /** Its message. */
  value: string;
  traceback: string;
}

export interface CodeResult {
  /** repr() of the code's trailing expression, or null. */
  result: string | null;
  stdout: string;
  stderr: string;
  /** The exception the code raised, or null. Python errors do not throw; SDK and daemon errors do. */
  error: ExecutionError | null;
}

const SNAPSHOT_POLL_MS = 500;
const DIAGNOSIS_TIMEOUT_MS = 5_000;

export class Sandbox {
  /** The sandbox's id (also `sandboxId`, the E2B name). */
  readonly id: string;
  /** The daemon's record of the sandbox when this object was made (see `getInfo` for a fresh one). */
  readonly info: SandboxInfo;
  readonly commands: Commands;
  readonly files: Files;
  /** The REST client this sandbox talks through. */
  readonly controller: Controller;

  /**
   * Wraps a sandbox the daemon already made, e.g. one of `controller.spawnSandboxes(...)`; calls go through
   * `controller`. Usually `Sandbox.create`, `Sandbox.createMany` or `Sandbox.connect` is what you want.
   */
  constructor(controller: Controller, info: SandboxInfo) {
    this.controller = controller;
    this.info = info;
    this.id = info.id;
    const diagnose = (err: unknown, what: string) => this.diagnose(err, what);
    this.commands = new Commands(controller, this.id, diagnose);
    this.files = new Files(controller, this.id, diagnose);
  }

  get sandboxId(): string {
    return this.id;
  }

  /**
   * Creates a sandbox from a snapshot (`snapshotTag`) or a template (`template`, as `Sandbox.create("pyagent")`
   * too). Connection settings in `options` apply to every later call on the sandbox.
   */
  static async create(options?: SandboxCreateOptions): Promise<Sandbox>;
  static async create(template: string, options?: SandboxCreateOptions): Promise<Sandbox>;
  static async create(
    templateOrOptions?: string | SandboxCreateOptions,
    maybeOptions?: SandboxCreateOptions,
  ): Promise<Sandbox> {
    const options =
      typeof templateOrOptions === "string"
        ? { ...maybeOptions, template: templateOrOptions }
        : { ...templateOrOptions };
    const {
      template,
      snapshotTag,
      timeoutMs,
      memoryLimitMib,
      liveFork,
      network,
      onTimeout,
      snapshotTimeoutMs,
      signal,
      ...connection
    } = options;
    if ((template === undefined) === (snapshotTag === undefined)) {
      throw new InvalidArgumentError(
        "Sandbox.create needs exactly one of `template` (a template name) or `snapshotTag` (an existing snapshot)",
      );
    }
    const lifetimeMs = timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS;
    checkDurationMs(lifetimeMs, "timeoutMs");
    const controller = new Controller(connection);
    const tag = (snapshotTag ?? template) as string;
    const spawn = async () => {
      const [info] = await controller.spawnSandboxes({
        snapshotTag: tag,
        n: 1,
        memoryLimitMib,
        timeoutMs: lifetimeMs,
        ...(liveFork ? { liveFork: true } : {}),
        network,
        onTimeout,
        signal,
      });
      if (info === undefined)
        throw new UnavailableError(`the daemon spawned no sandbox from snapshot ${tag}`);
      return new Sandbox(controller, info);
    };
    if (template === undefined) return spawn();
    try {
      return await spawn();
    } catch (err) {
      if (!(err instanceof NotFoundError || err instanceof ConflictError)) throw err;
    }
    await ensureTemplateSnapshot(
      controller,
      template,
      snapshotTimeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS,
      signal,
    );
    return spawn();
  }

  /**
   * Forks `n` sandboxes from one snapshot in a single request: all of them or none (forkd's fan-out).
   * Options as for `create`, except that `template` must already have its snapshot.
   */
  static async createMany(n: number, options: SandboxCreateOptions): Promise<Sandbox[]> {
    const {
      template,
      snapshotTag,
      timeoutMs,
      memoryLimitMib,
      liveFork,
      network,
      onTimeout,
      snapshotTimeoutMs: _unused,
      signal,
      ...connection
    } = options;
    const tag = snapshotTag ?? template;
    if (tag === undefined)
      throw new InvalidArgumentError("Sandbox.createMany needs `snapshotTag` (or `template`)");
    const lifetimeMs = timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS;
    checkDurationMs(lifetimeMs, "timeoutMs");
    const controller = new Controller(connection);
    const infos = await controller.spawnSandboxes({
      snapshotTag: tag,
      n,
      memoryLimitMib,
      timeoutMs: lifetimeMs,
      ...(liveFork ? { liveFork: true } : {}),
      network,
      onTimeout,
      signal,
    });
    return infos.map((info) => new Sandbox(controller, info));
  }

  /**
   * A Sandbox object for an existing sandbox (e.g. one created elsewhere); a paused one is resumed first (E2B's
   * connect), with the lifetime it had. SandboxNotFoundError if it is gone.
   */
  static async connect(id: string, options: SandboxConnectOptions = {}): Promise<Sandbox> {
    const { signal, ...connection } = options;
    const controller = new Controller(connection);
    try {
      let info = await controller.getSandbox(id, { signal });
      if (info.status === "dead") throw new SandboxNotFoundError(`sandbox ${id} is dead`);
      if (isPausedOrChanging(info.status)) info = await resumeOrJoin(controller, id, { signal });
      return new Sandbox(controller, info);
    } catch (err) {
      if (err instanceof NotFoundError && !(err instanceof SandboxNotFoundError)) {
        throw new SandboxNotFoundError(
          `no sandbox ${id} on the daemon at ${controller.settings().address.display}`,
          {
            status: err.status,
            request: err.request,
            serverMessage: err.serverMessage,
            code: err.code,
            cause: err,
          },
        );
      }
      throw err;
    }
  }

  /**
   * Resumes a paused sandbox by id, where it was (processes, files, interpreter), under the same id; its
   * lifetime starts again. ConflictError if it is not paused; SandboxNotFoundError if it does not exist.
   */
  static async resume(id: string, options: SandboxResumeOptions = {}): Promise<Sandbox> {
    const { signal, timeoutMs, ...connection } = options;
    const controller = new Controller(connection);
    try {
      return new Sandbox(controller, await controller.resumeSandbox(id, { signal, timeoutMs }));
    } catch (err) {
      if (err instanceof NotFoundError && !(err instanceof SandboxNotFoundError)) {
        throw new SandboxNotFoundError(`no sandbox ${id} to resume`, { status: err.status, cause: err });
      }
      throw err;
    }
  }

  /** The daemon's sandboxes (all, of one snapshot, or in one state such as "paused"). */
  static async list(
    options: SandboxConnectOptions & { snapshotTag?: string; status?: SandboxStatus } = {},
  ): Promise<SandboxInfo[]> {
    const { signal, snapshotTag, status, ...connection } = options;
    return new Controller(connection).listSandboxes({ signal, snapshotTag, status });
  }

  /** Kills a sandbox by id; false if it did not exist. */
  static async kill(id: string, options: SandboxConnectOptions = {}): Promise<boolean> {
    const { signal, ...connection } = options;
    try {
      await new Controller(connection).killSandbox(id, { signal });
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** Evaluates Python in the sandbox's warm interpreter (numpy already imported in pyagent snapshots). */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<CodeResult> {
    try {
      const answer = await this.controller.evalCode(this.id, code, {
        ...options,
        timeoutMs: options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS,
      });
      return {
        result: answer.result ?? null,
        stdout: typeof answer.stdout === "string" ? answer.stdout : "",
        stderr: typeof answer.stderr === "string" ? answer.stderr : "",
        error: executionError(answer),
      };
    } catch (err) {
      throw await this.diagnose(err, "running code");
    }
  }

  /** Round trip to the guest agent. */
  async ping(options: RequestOptions = {}): Promise<Record<string, unknown>> {
    try {
      return await this.controller.pingSandbox(this.id, options);
    } catch (err) {
      throw await this.diagnose(err, "ping");
    }
  }

  /** A fresh copy of the daemon's record of this sandbox. */
  async getInfo(options: RequestOptions = {}): Promise<SandboxInfo> {
    try {
      return await this.controller.getSandbox(this.id, options);
    } catch (err) {
      throw await this.diagnose(err, "getting its info");
    }
  }

  /** true while the sandbox exists and runs. */
  async isRunning(options: RequestOptions = {}): Promise<boolean> {
    try {
      return (await this.controller.getSandbox(this.id, options)).status === "running";
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** Sets the sandbox's remaining lifetime to `timeoutMs` from now (0 = no limit); may shorten it too. */
  async setTimeout(timeoutMs: number, options: RequestOptions = {}): Promise<void> {
    try {
      await this.controller.setSandboxTimeout(this.id, timeoutMs, options);
    } catch (err) {
      throw await this.diagnose(err, "setting its timeout");
    }
  }

  /**
   * Replaces this sandbox's egress policy while it runs (E2B's updateNetwork): new connections follow it at
   * once, established ones at their next packet, names resolve under it. Returns the policy now in force.
   */
  async updateNetwork(
    policy: NetworkPolicy,
    options: RequestOptions = {},
  ): Promise<SandboxNetwork | undefined> {
    try {
      return (await this.controller.setNetworkPolicy(this.id, policy, options)).network;
    } catch (err) {
      throw await this.diagnose(err, "updating its network");
    }
  }

  /**
   * Snapshots this sandbox where it is (BRANCH); it keeps running. `Sandbox.create({ snapshotTag: result.tag })`
   * forks children that continue from here. Mode `full` (the default) stands alone; `diff` layers on the base.
   */
  async branch(options: Parameters<Controller["branchSandbox"]>[1] = {}): Promise<BranchResult> {
    try {
      return await this.controller.branchSandbox(this.id, options);
    } catch (err) {
      throw await this.diagnose(err, "branching");
    }
  }

  /**
   * Pauses the sandbox: its memory, processes and files saved to disk, its VM stopped and its RAM given back.
   * It keeps its id, network and policy; `Sandbox.resume(id)` or `Sandbox.connect(id)` wakes it where it was.
   * Calls into it fail with ConflictError while it is paused. ConflictError if it is not running.
   */
  async pause(options: RequestOptions & { merge?: boolean } = {}): Promise<PauseResult> {
    try {
      return await this.controller.pauseSandbox(this.id, options);
    } catch (err) {
      throw await this.diagnose(err, "pausing");
    }
  }

  /** Kills the sandbox and frees its resources. Killing one that is already gone is not an error. */
  async kill(options: RequestOptions = {}): Promise<void> {
    try {
      await this.controller.killSandbox(this.id, options);
    } catch (err) {
      if (err instanceof NotFoundError) return;
      throw err;
    }
  }

  /** `await using sandbox = await Sandbox.create(...)` kills the sandbox when the block exits. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  /**
   * Makes an error say whether the sandbox itself is gone: after a dropped connection (daemon still up),
   * an unavailable answer or a 404, asks the daemon about the sandbox before blaming the network or the path.
   */
  private async diagnose(err: unknown, what: string): Promise<unknown> {
    const worthChecking =
      err instanceof NotFoundError ||
      err instanceof ConflictError ||
      (err instanceof ConnectionError && err.daemonReachable === true) ||
      (err instanceof UnavailableError && !(err instanceof ConnectionError));
    if (!worthChecking || err instanceof SandboxNotFoundError) return err;
    let state = "no longer exists";
    try {
      const info = await this.controller.getSandbox(this.id, { requestTimeoutMs: DIAGNOSIS_TIMEOUT_MS });
      if (info.status === "stopping") state = "is being stopped";
      else if (info.status !== "dead") return err;
    } catch (probe) {
      if (!(probe instanceof NotFoundError)) return err;
    }
    return new SandboxNotFoundError(
      `sandbox ${this.id} ${state} (killed, or its lifetime ran out) while ${what}; to keep a sandbox ` +
        "longer pass a larger `timeoutMs` to Sandbox.create or call sandbox.setTimeout(ms) (0 = no limit)",
      { cause: err },
    );
  }
}

/** Makes sure a snapshot tagged `template` exists and is ready, creating it from the template if needed. */
async function ensureTemplateSnapshot(
  controller: Controller,
  template: string,
  timeoutMs: number,
  signal: AbortSignal | undefined,
): Promise<SnapshotInfo> {
  const deadline = timeoutMs === 0 ? Number.POSITIVE_INFINITY : Date.now() + timeoutMs;
  let snapshot: SnapshotInfo | undefined;
  try {
    snapshot = await controller.getSnapshot(template, { signal });
  } catch (err) {
    if (!(err instanceof NotFoundError)) throw err;
  }
  if (snapshot === undefined) {
    try {
      return await controller.createSnapshot({ tag: template, template, timeoutMs, signal });
    } catch (err) {
      if (err instanceof TimeoutError && err.setting === "timeoutMs") {
        throw new TimeoutError(
          `building snapshot ${template} from its template did not finish within snapshotTimeoutMs=${timeoutMs} ms; ` +
            "pass a larger `snapshotTimeoutMs` (0 disables it)",
          { setting: "snapshotTimeoutMs", cause: err },
        );
      }
      // Someone else is creating it: wait for theirs below.
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  for (;;) {
    snapshot = await controller.getSnapshot(template, { signal });
    if (snapshot.status === "ready" && snapshot.bootable) return snapshot;
    if (snapshot.status === "failed" || (snapshot.status === "ready" && !snapshot.bootable)) {
      throw new ConflictError(
        `snapshot ${template} exists but cannot be spawned from (status ${snapshot.status}${snapshot.error ? `: ${snapshot.error}` : ""}); ` +
          `delete it (forkd snapshot rm ${template}) to rebuild it from the template`,
      );
    }
    if (Date.now() + SNAPSHOT_POLL_MS > deadline) {
      throw new TimeoutError(
        `snapshot ${template} was still ${snapshot.status} after snapshotTimeoutMs=${timeoutMs} ms; pass a larger \`snapshotTimeoutMs\` (0 disables it)`,
        { setting: "snapshotTimeoutMs" },
      );
    }
    await sleep(SNAPSHOT_POLL_MS, signal);
  }
}

/** The wire's "Type: message" + error_type + traceback as E2B's { name, value, traceback }. */
function executionError(answer: EvalResult): ExecutionError | null {
  if (answer.error === null || answer.error === undefined) return null;
  const name = answer.error_type ?? /^([\w.]+):/.exec(answer.error)?.[1] ?? "Error";
  const value = answer.error.startsWith(`${name}: `) ? answer.error.slice(name.length + 2) : answer.error;
  return { name, value, traceback: answer.traceback ?? "" };
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

const isPausedOrChanging = (status: string) => ["pausing", "paused", "resuming"].includes(status);

/** Resumes `id`; a resume another caller finished first counts (it is running, which is all connect needs). */
async function resumeOrJoin(controller: Controller, id: string, call: RequestOptions): Promise<SandboxInfo> {
  try {
    return await controller.resumeSandbox(id, call);
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    const info = await controller.getSandbox(id, call);
    if (info.status !== "running") throw err;
    return info;
  }
}
