/**
 * The warm Python interpreter: one persistent worker.py process, started before anything else so that the
 * parent VM is snapshotted with it warm. Cells run one at a time in arrival order; a cell's timeout counts from
 * when the agent received it. A timed-out or cancelled cell gets SIGINT, and if it does not stop within a
 * grace period the worker is killed and restarted (its namespace is lost; the template warm-up runs again).
 */
import { type ChildProcess, spawn } from "node:child_process";
import type { Socket } from "node:net";
import { performance } from "node:perf_hooks";
import { ForkdError } from "../../common/errors.js";
import {
  type EvalResult,
  MAX_EVAL_OUTPUT_CHARS,
  MAX_TRACEBACK_CHARS,
  type WarmState,
  type WarmupResult,
} from "../protocol/index.js";
import type { AgentLog } from "./log.js";

/** How long an interrupted cell may take to unwind before the worker is killed. */
const INTERRUPT_GRACE_MS = 2000;
/** More crashes than this within CRASH_WINDOW_MS and the worker is not restarted again. */
const MAX_CRASHES = 5;
const CRASH_WINDOW_MS = 60_000;
const RESTART_DELAY_MS = 100;
const MAX_WORKER_MESSAGE_BYTES = 64 * 1024 * 1024;

export interface PythonWorkerOptions {
  workerPath: string;
  python: string;
  env: NodeJS.ProcessEnv;
  cwd: string;
  log: AgentLog;
}

export interface CellOptions {
  timeoutMs: number;
  signal: AbortSignal;
}

interface Job {
  id: number;
  code: string;
  reseed: boolean;
  resolve(result: EvalResult): void;
  reject(error: unknown): void;
  settled: boolean;
  timedOut: boolean;
  startedAt: number;
  receivedAt: number;
  deadline: NodeJS.Timeout;
  grace?: NodeJS.Timeout;
  onAbort?: () => void;
  signal: AbortSignal;
}

interface WorkerReply {
  id?: unknown;
  ready?: unknown;
  result?: unknown;
  result_truncated?: unknown;
  stdout?: unknown;
  stderr?: unknown;
  stdout_truncated?: unknown;
  stderr_truncated?: unknown;
  error?: unknown;
}

function emptyResult(error: EvalResult["error"], timedOut: boolean, durationMs: number): EvalResult {
  return {
    result: null,
    result_truncated: false,
    stdout: "",
    stderr: "",
    stdout_truncated: false,
    stderr_truncated: false,
    error,
    timed_out: timedOut,
    duration_ms: durationMs,
  };
}

export class PythonWorker {
  private readonly options: PythonWorkerOptions;
  private child: ChildProcess | null = null;
  private channel: Socket | null = null;
  private ready = false;
  private stopping = false;
  private state: WarmState = "cold";
  private queue: Job[] = [];
  private running: Job | null = null;
  private nextId = 1;
  private crashes: number[] = [];
  private warmupCode: string | null = null;
  private reseedPending = false;
  private inbox: Buffer = Buffer.alloc(0);
  private failure: string | null = null;

  constructor(options: PythonWorkerOptions) {
    this.options = options;
  }

  get warm(): WarmState {
    return this.state;
  }

  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  start(): void {
    this.spawnWorker();
  }

  /** The next cell first reseeds the PRNGs of modules the interpreter already imported (after a restore). */
  markRestored(): void {
    this.reseedPending = true;
  }

  runCell(code: string, options: CellOptions): Promise<EvalResult> {
    if (this.failure !== null) return Promise.reject(new ForkdError("unavailable", this.failure));
    return new Promise<EvalResult>((resolve, reject) => {
      const receivedAt = performance.now();
      const job: Job = {
        id: this.nextId++,
        code,
        reseed: false,
        resolve,
        reject,
        settled: false,
        timedOut: false,
        startedAt: 0,
        receivedAt,
        signal: options.signal,
        deadline: setTimeout(() => this.onDeadline(job, options.timeoutMs), options.timeoutMs),
      };
      if (options.signal.aborted) {
        clearTimeout(job.deadline);
        reject(options.signal.reason);
        return;
      }
      job.onAbort = () => this.onCancel(job);
      options.signal.addEventListener("abort", job.onAbort, { once: true });
      this.queue.push(job);
      this.pump();
    });
  }

  /** Runs the template's warm-up code and records the warm state; a worker restart runs it again. */
  async warmup(code: string, options: CellOptions): Promise<WarmupResult> {
    this.warmupCode = code;
    this.state = "warming";
    try {
      const result = await this.runCell(code, options);
      this.state = result.error === null ? "warm" : "failed";
      return { ...result, warm: this.state };
    } catch (err) {
      this.state = "failed";
      throw err;
    }
  }

  stop(): void {
    this.stopping = true;
    this.child?.kill("SIGKILL");
    for (const job of [...this.queue, ...(this.running ? [this.running] : [])]) {
      this.settle(job, () => job.reject(new ForkdError("unavailable", "the agent is shutting down")));
    }
    this.queue = [];
  }

  private spawnWorker(): void {
    const { python, workerPath, env, cwd, log } = this.options;
    this.ready = false;
    this.inbox = Buffer.alloc(0);
    // fd 1 and 2 of the worker (output of processes the cells spawn, C-level writes) go to the agent's stderr:
    // the guest console. Cell output written through sys.stdout/sys.stderr is captured by the worker itself.
    const child = spawn(python, ["-u", workerPath], { stdio: ["ignore", 2, 2, "pipe"], env, cwd });
    this.child = child;
    const channel = child.stdio[3] as Socket;
    this.channel = channel;
    channel.on("data", (chunk: Buffer) => this.onChannelData(child, chunk));
    channel.on("error", () => {});
    child.on("error", (err) => {
      log.error("python worker failed to start", { error: err.message, python });
      this.onExit(child, null, null);
    });
    child.on("exit", (code, signal) => this.onExit(child, code, signal));
  }

  private onChannelData(child: ChildProcess, chunk: Buffer): void {
    if (child !== this.child) return;
    this.inbox = this.inbox.length === 0 ? chunk : Buffer.concat([this.inbox, chunk]);
    while (this.inbox.length >= 4) {
      const size = this.inbox.readUInt32BE(0);
      if (size > MAX_WORKER_MESSAGE_BYTES) {
        this.options.log.error("python worker sent an oversize message; restarting it", { size });
        child.kill("SIGKILL");
        return;
      }
      if (this.inbox.length < 4 + size) return;
      const text = this.inbox.toString("utf8", 4, 4 + size);
      this.inbox = this.inbox.subarray(4 + size);
      let reply: WorkerReply;
      try {
        reply = JSON.parse(text) as WorkerReply;
      } catch {
        this.options.log.error("python worker sent invalid JSON; restarting it");
        child.kill("SIGKILL");
        return;
      }
      this.onReply(reply);
    }
  }

  private onReply(reply: WorkerReply): void {
    if (reply.ready === true) {
      this.ready = true;
      this.options.log.info("python worker ready", { pid: this.child?.pid });
      this.pump();
      return;
    }
    const job = this.running;
    if (job === null || reply.id !== job.id) {
      this.options.log.warn("python worker reply for no running cell", { id: String(reply.id) });
      return;
    }
    this.running = null;
    if (job.grace !== undefined) clearTimeout(job.grace);
    const str = (v: unknown) => (typeof v === "string" ? v : "");
    const result: EvalResult = {
      result: typeof reply.result === "string" ? reply.result : null,
      result_truncated: reply.result_truncated === true,
      stdout: str(reply.stdout),
      stderr: str(reply.stderr),
      stdout_truncated: reply.stdout_truncated === true,
      stderr_truncated: reply.stderr_truncated === true,
      error: normaliseError(reply.error),
      timed_out: job.timedOut,
      duration_ms: performance.now() - job.startedAt,
    };
    this.settle(job, () => job.resolve(result));
    this.pump();
  }

  private pump(): void {
    if (!this.ready || this.running !== null || this.channel === null) return;
    const job = this.queue.shift();
    if (job === undefined) return;
    job.startedAt = performance.now();
    job.reseed = this.reseedPending;
    this.reseedPending = false;
    this.running = job;
    const message = Buffer.from(
      JSON.stringify({
        id: job.id,
        code: job.code,
        max_chars: MAX_EVAL_OUTPUT_CHARS,
        max_traceback: MAX_TRACEBACK_CHARS,
        reseed: job.reseed,
      }),
    );
    const prefix = Buffer.alloc(4);
    prefix.writeUInt32BE(message.length);
    this.channel.write(Buffer.concat([prefix, message]));
  }

  private onDeadline(job: Job, timeoutMs: number): void {
    if (job.settled) return;
    job.timedOut = true;
    if (this.running === job) {
      this.interrupt(job);
      return;
    }
    this.queue = this.queue.filter((j) => j !== job);
    const error = {
      type: "TimeoutError",
      message: `the cell did not start within ${timeoutMs} ms: the interpreter was busy with earlier cells`,
      traceback: "",
    };
    this.settle(job, () => job.resolve(emptyResult(error, true, 0)));
  }

  private onCancel(job: Job): void {
    if (job.settled) return;
    if (this.running === job) this.interrupt(job);
    else this.queue = this.queue.filter((j) => j !== job);
    // The caller is answered at once; a running cell keeps the interpreter busy until it has unwound.
    this.settle(job, () => job.reject(job.signal.reason));
  }

  /** SIGINT now (KeyboardInterrupt in the cell), SIGKILL if the cell has not unwound after the grace period. */
  private interrupt(job: Job): void {
    const child = this.child;
    if (child === null) return;
    child.kill("SIGINT");
    job.grace ??= setTimeout(() => {
      if (this.running === job && this.child === child) {
        this.options.log.warn("cell ignored SIGINT; killing the python worker", { id: job.id });
        child.kill("SIGKILL");
      }
    }, INTERRUPT_GRACE_MS);
  }

  private settle(job: Job, finish: () => void): void {
    if (job.settled) return;
    job.settled = true;
    clearTimeout(job.deadline);
    if (job.grace !== undefined && this.running !== job) clearTimeout(job.grace);
    if (job.onAbort) job.signal.removeEventListener("abort", job.onAbort);
    finish();
  }

  private onExit(child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (child !== this.child) return;
    this.child = null;
    this.channel = null;
    this.ready = false;
    const job = this.running;
    this.running = null;
    if (job !== null) {
      if (job.grace !== undefined) clearTimeout(job.grace);
      const how = signal !== null ? `was killed by ${signal}` : `exited with code ${code}`;
      const error = job.timedOut
        ? {
            type: "TimeoutError",
            message:
              "the cell ignored the interrupt after its timeout; the interpreter was restarted and its state lost",
            traceback: "",
          }
        : {
            type: "InterpreterDied",
            message: `the Python interpreter ${how} while running the cell; it was restarted and its state lost`,
            traceback: "",
          };
      this.settle(job, () =>
        job.resolve(emptyResult(error, job.timedOut, performance.now() - job.startedAt)),
      );
    }
    if (this.stopping) return;
    const now = Date.now();
    this.crashes = [...this.crashes.filter((t) => now - t < CRASH_WINDOW_MS), now];
    this.options.log.warn("python worker exited", { code, signal, recentExits: this.crashes.length });
    if (this.crashes.length > MAX_CRASHES) {
      this.failure = `the Python worker exited ${this.crashes.length} times within ${CRASH_WINDOW_MS / 1000} s; not restarting it`;
      this.state = "failed";
      for (const queued of this.queue)
        this.settle(queued, () => queued.reject(new ForkdError("unavailable", this.failure ?? "")));
      this.queue = [];
      return;
    }
    this.state = "cold";
    setTimeout(() => {
      if (this.stopping) return;
      this.spawnWorker();
      this.rewarm();
    }, RESTART_DELAY_MS);
  }

  /** After a restart, runs the last warm-up code ahead of queued cells so the interpreter is warm again. */
  private rewarm(): void {
    const code = this.warmupCode;
    if (code === null) return;
    this.state = "warming";
    const job: Job = {
      id: this.nextId++,
      code,
      reseed: false,
      settled: false,
      timedOut: false,
      startedAt: 0,
      receivedAt: performance.now(),
      signal: new AbortController().signal,
      deadline: setTimeout(() => this.onDeadline(job, 600_000), 600_000),
      resolve: (result) => {
        this.state = result.error === null ? "warm" : "failed";
      },
      reject: () => {
        this.state = "failed";
      },
    };
    this.queue.unshift(job);
    this.pump();
  }
}

function normaliseError(value: unknown): EvalResult["error"] {
  if (value === null || typeof value !== "object") return null;
  const error = value as { type?: unknown; message?: unknown; traceback?: unknown };
  return {
    type: typeof error.type === "string" ? error.type : "Exception",
    message: typeof error.message === "string" ? error.message : "",
    traceback: typeof error.traceback === "string" ? error.traceback : "",
  };
}
