/**
 * The process ops of AgentClient (`client.procs`): start, connect to, list, feed, signal and resize processes
 * that outlive the call that started them.
 */
import { ForkdError, invalidArgument } from "../../common/errors.js";
import {
  type EventHeader,
  MAX_FILE_BYTES,
  MAX_QUEUED_OUTPUT_BYTES,
  type OpArgs,
  type OpResult,
} from "../protocol/index.js";
import { AsyncQueue } from "./async-queue.js";
import type { AgentConnection } from "./connection.js";
import type {
  AgentProcesses,
  ProcAttachOptions,
  ProcEnd,
  ProcHandle,
  ProcInfo,
  ProcOutput,
  ProcSelector,
  ProcStartOptions,
} from "./types.js";

type AttachOp = "proc.start" | "proc.connect";

/** `client.procs` over one connection. */
export function agentProcesses(connection: AgentConnection): AgentProcesses {
  const call = connection.call.bind(connection);
  return {
    start: (argv, options = {}) => procStart(connection, argv, options),
    connect: (selector, options = {}) =>
      new ProcAttachment(connection, "proc.connect", null, selector, options).attach(),
    list: async (options = {}) =>
      (await call("proc.list", {}, undefined, options.signal)).result.processes.map(toProcInfo),
    input: async (selector, data, options = {}) => {
      const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
      if (bytes.length > MAX_FILE_BYTES) {
        throw new ForkdError(
          "payload_too_large",
          `proc.input: ${bytes.length} bytes exceeds the ${MAX_FILE_BYTES}-byte limit of one input`,
        );
      }
      const args: OpArgs<"proc.input"> = selectorArgs(selector, "proc.input");
      if (options.eof === true) args.eof = true;
      await call("proc.input", args, bytes, options.signal);
    },
    closeStdin: async (selector, options = {}) => {
      const args = { ...selectorArgs(selector, "proc.input"), eof: true };
      await call("proc.input", args, undefined, options.signal);
    },
    signal: async (selector, signal, options = {}) => {
      const args = { ...selectorArgs(selector, "proc.signal"), signal };
      await call("proc.signal", args, undefined, options.signal);
    },
    resize: async (selector, size, options = {}) => {
      const args = { ...selectorArgs(selector, "proc.resize"), cols: size.cols, rows: size.rows };
      await call("proc.resize", args, undefined, options.signal);
    },
  };
}

function procStart(connection: AgentConnection, argv: string[], options: ProcStartOptions): ProcHandle {
  const args: OpArgs<"proc.start"> = { argv };
  if (options.env !== undefined) args.env = options.env;
  if (options.cwd !== undefined) args.cwd = options.cwd;
  if (options.user !== undefined) args.user = options.user;
  if (options.tag !== undefined) args.tag = options.tag;
  if (options.pty !== undefined) args.pty = { cols: options.pty.cols, rows: options.pty.rows };
  if (options.stdin !== undefined) args.stdin = options.stdin;
  if (options.timeoutMs !== undefined) args.timeout_ms = options.timeoutMs;
  return new ProcAttachment(connection, "proc.start", args, null, options).attach();
}

/**
 * A proc.start or proc.connect call as a handle. Deadlines: the `started` event must come within the call
 * timeout; after it the call runs as long as the process (or timeout_ms plus the grace period).
 */
class ProcAttachment {
  private readonly limit: number;
  private readonly queue = new AsyncQueue<ProcOutput>();
  private readonly pid: Promise<number>;
  private resolvePid!: (pid: number) => void;
  private rejectPid!: (err: Error) => void;
  private buffered = 0;
  private overflowed = false;
  private callId = 0;
  private startedPid: number | undefined;
  private detached = false;
  private failure: ForkdError | undefined;

  constructor(
    private readonly connection: AgentConnection,
    private readonly op: AttachOp,
    private readonly startArgs: OpArgs<"proc.start"> | null,
    private readonly selector: ProcSelector | null,
    private readonly options: ProcAttachOptions,
  ) {
    this.limit = options.maxBufferedBytes ?? MAX_QUEUED_OUTPUT_BYTES;
    this.pid = new Promise<number>((resolve, reject) => {
      this.resolvePid = resolve;
      this.rejectPid = reject;
    });
    this.pid.catch(() => {});
  }

  /** Sends the call; the handle's `done` settles with the process's end (or the call's failure). */
  attach(): ProcHandle {
    const { op, queue, pid } = this;
    let args: OpArgs<"proc.start"> | OpArgs<"proc.connect">;
    try {
      args = this.startArgs ?? selectorArgs(this.selector as ProcSelector, op);
    } catch (err) {
      const error = err as Error;
      this.rejectPid(error);
      queue.fail(error);
      const done = Promise.reject(error);
      done.catch(() => {});
      return { pid, done, output: queue, detach: () => {} };
    }
    const { id, answer } = this.connection.start(op, args, undefined, this.options.signal, {
      onEvent: (event, body) => this.onEvent(event, body),
    });
    this.callId = id;
    const done: Promise<ProcEnd> = answer.then(
      ({ result }) => this.ended(result),
      (err: unknown) => {
        const error = this.failure ?? (err instanceof Error ? err : new Error(String(err)));
        this.rejectPid(error);
        queue.fail(error);
        throw error;
      },
    );
    done.catch(() => {});
    return { pid, done, output: queue, detach: () => this.detach() };
  }

  private onEvent(event: EventHeader, body: Buffer): void {
    if (event.ev === "started") {
      this.onStarted(event);
      return;
    }
    if (
      (event.ev !== "stdout" && event.ev !== "stderr" && event.ev !== "pty") ||
      this.startedPid === undefined
    ) {
      this.connection.violation(`unexpected event for a ${this.op} call`, {
        ev: event.ev,
        started: this.startedPid !== undefined,
      });
      return;
    }
    this.onOutput(event.ev, body);
  }

  private onStarted(event: EventHeader): void {
    const { op, startedPid } = this;
    const wanted = this.selector?.pid;
    if (
      startedPid !== undefined ||
      event.pid === undefined ||
      (wanted !== undefined && event.pid !== wanted)
    ) {
      this.connection.violation(`bad started event for a ${op} call`, { pid: event.pid, startedPid });
      this.fail(new ForkdError("internal", `${op}: the guest reported an inconsistent pid (${event.pid})`));
      return;
    }
    this.startedPid = event.pid;
    this.resolvePid(event.pid);
    const timeoutMs = this.startArgs?.timeout_ms;
    this.connection.setCallDeadline(
      this.callId,
      timeoutMs === undefined ? null : timeoutMs + this.connection.graceMs,
    );
  }

  private onOutput(stream: ProcOutput["stream"], body: Buffer): void {
    const { options, queue } = this;
    if (stream === "stdout") options.onStdout?.(body);
    else if (stream === "stderr") options.onStderr?.(body);
    else options.onPty?.(body);
    if (queue.abandoned || this.detached || this.overflowed) return;
    this.buffered += body.length;
    if (this.buffered > this.limit) {
      const error = new ForkdError(
        "unavailable",
        `${this.op}: more than ${this.limit} output bytes were not read`,
      );
      if (queue.active) {
        // A reader fell behind: detach (the process keeps running) rather than buffer without bound.
        queue.fail(error);
        this.detached = true;
        this.failure ??= error;
        this.connection.failCall(this.callId, error);
        this.connection.cancel(this.callId);
      } else {
        this.overflowed = true;
        queue.discard(error);
      }
      return;
    }
    queue.push({ stream, data: body }, () => {
      this.buffered -= body.length;
    });
  }

  private ended(result: OpResult<"proc.start">): ProcEnd {
    if (this.failure) throw this.failure;
    const { op, startedPid } = this;
    if (startedPid !== undefined && result.pid !== startedPid) {
      throw new ForkdError("internal", `${op}: the guest ended pid ${result.pid}, not ${startedPid}`);
    }
    // proc.connect to a process that already ended answers without a started event.
    if (startedPid === undefined) this.resolvePid(result.pid);
    this.queue.end();
    return toProcEnd(result);
  }

  private fail(err: ForkdError): void {
    this.failure ??= err;
    this.connection.failCall(this.callId, err);
    this.connection.cancel(this.callId);
  }

  private detach(): void {
    if (this.detached) return;
    this.detached = true;
    this.failure ??= new ForkdError(
      "unavailable",
      `${this.op}: detached (the process keeps running in the guest)`,
    );
    this.connection.failCall(this.callId, this.failure);
    this.connection.cancel(this.callId);
  }
}

/** The wire form of a selector; refuses anything but exactly one of pid and tag before it is sent. */
function selectorArgs(selector: ProcSelector, op: string): { pid?: number; tag?: string } {
  const hasPid = selector.pid !== undefined;
  const hasTag = selector.tag !== undefined;
  if (hasPid === hasTag) throw invalidArgument(`${op}: give exactly one of pid and tag`);
  return hasPid ? { pid: selector.pid } : { tag: selector.tag };
}

function toProcEnd(r: OpResult<"proc.start">): ProcEnd {
  return {
    pid: r.pid,
    exitCode: r.exit_code,
    signal: r.signal,
    timedOut: r.timed_out,
    error: r.error,
    durationMs: r.duration_ms,
  };
}

function toProcInfo(p: OpResult<"proc.list">["processes"][number]): ProcInfo {
  return {
    pid: p.pid,
    tag: p.tag,
    argv: p.argv,
    env: p.env,
    cwd: p.cwd,
    user: p.user,
    pty: p.pty,
    running: p.running,
    exitCode: p.exit_code,
  };
}
