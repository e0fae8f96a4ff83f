/**
 * AgentClient: the controller's end of one guest agent connection (QEMU connects to the host's agent.sock and
 * the controller wraps the accepted socket). Calls are multiplexed by id; every call has a host-side deadline
 * so a silent guest cannot hang the controller; everything the guest sends is validated and bounded.
 */
import type { Duplex } from "node:stream";
import { abortError } from "../../common/deadline.js";
import { errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { assertSandboxId } from "../../common/names.js";
import {
  DisplayData,
  type EventHeader,
  encodeFrame,
  type Frame,
  FrameDecoder,
  type HelloHeader,
  HOSTNAME_PATTERN,
  MAX_ENTROPY_BYTES,
  MAX_FILE_BYTES,
  MAX_ID,
  MAX_QUEUED_OUTPUT_BYTES,
  MAX_QUEUED_WATCH_EVENTS,
  MIN_ENTROPY_BYTES,
  type OpArgs,
  type OpName,
  type OpResult,
  opValidators,
  PROTOCOL_VERSION,
  parseGuestMessage,
  type ResponseHeader,
  STDIN_CHUNK_BYTES,
  STDIN_INLINE_BYTES,
  STDIN_WINDOW_BYTES,
  validator,
  wireErrorCode,
} from "../protocol/index.js";
import { AsyncQueue } from "./async-queue.js";
import type {
  AgentContexts,
  AgentFiles,
  AgentProcesses,
  CallOptions,
  ContextInfo,
  EvalOptions,
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  FileInfo,
  FileWriteOptions,
  FsEvent,
  GuestStats,
  Hello,
  PingInfo,
  ProcAttachOptions,
  ProcEnd,
  ProcHandle,
  ProcInfo,
  ProcOutput,
  ProcSelector,
  ProcStartOptions,
  RestoreInfo,
  RestoreRequest,
  WarmupOutcome,
  WatchEnd,
  WatchHandle,
  WatchOptions,
} from "./types.js";

/**
 * Bytes the host may have written to a guest's channel that the guest has not taken yet (beyond the socket's
 * kernel buffer): one full file.write frame and change, so any single call still fits.
 */
export const MAX_UNSENT_BYTES = 32 * 1024 * 1024;
export * from "./types.js";

/** pino-compatible subset. */
export interface AgentClientLog {
  warn(obj: object, msg?: string): void;
  debug?(obj: object, msg?: string): void;
}

export interface AgentClientOptions {
  log?: AgentClientLog;
  /** Host-side deadline of calls without a guest-side timeout (ping, restore, files). Default 30 s. */
  callTimeoutMs?: number;
  /** How long past a guest-side timeout (exec, eval, warmup) the host still waits for the answer. Default 10 s. */
  graceMs?: number;
  /** Called on every hello, e.g. when the guest saw the channel reconnect. */
  onHello?: (hello: Hello) => void;
  /** Called once when the connection is gone, with the reason every pending call was rejected with. */
  onClose?: (reason: ForkdError) => void;
}

const DEFAULT_CALL_TIMEOUT_MS = 30_000;
const DEFAULT_GRACE_MS = 10_000;
const DEFAULT_GUEST_TIMEOUT_MS = 60_000;
const DEFAULT_CAPTURE_BYTES = 1024 * 1024;
const DEFAULT_READ_BYTES = MAX_FILE_BYTES;
/** Undecodable guest input is logged this often at most (first few, then every Nth). */
const LOG_FIRST_VIOLATIONS = 5;
const LOG_EVERY_VIOLATIONS = 100;

interface Answer {
  result: unknown;
  body: Buffer;
}

interface Pending {
  id: number;
  op: OpName;
  resolve(answer: Answer): void;
  reject(error: Error): void;
  onEvent?: (event: EventHeader, body: Buffer) => void;
  /** Replaces the host-side deadline (null: none) from now on. */
  setDeadline(ms: number | null): void;
}

/** Options of one call's start (see AgentClient.start). */
interface StartExtra {
  /** Host-side deadline; null = none (streaming calls that may run for ever). Default callTimeoutMs. */
  deadlineMs?: number | null;
  onEvent?: Pending["onEvent"];
}

interface HelloWaiter {
  resolve(hello: Hello): void;
  reject(error: Error): void;
}

function toHello(header: HelloHeader): Hello {
  return {
    protocol: header.protocol,
    agentVersion: header.agent_version,
    template: header.template,
    interpreter: header.interpreter,
    warm: header.warm,
    sandboxId: header.sandbox_id,
  };
}

function incompatible(protocol: number): ForkdError {
  return new ForkdError(
    "conflict",
    `the guest agent speaks protocol ${protocol} but this host speaks ${PROTOCOL_VERSION}: rebuild the template image`,
  );
}

function toFileInfo(info: OpResult<"file.stat">): FileInfo {
  const out: FileInfo = {
    name: info.name,
    type: info.type,
    size: info.size,
    mode: info.mode,
    mtimeMs: info.mtime_ms,
  };
  if (info.link_target !== undefined) out.linkTarget = info.link_target;
  if (info.path !== undefined) out.path = info.path;
  if (info.uid !== undefined) out.uid = info.uid;
  if (info.gid !== undefined) out.gid = info.gid;
  if (info.owner !== undefined) out.owner = info.owner;
  if (info.group !== undefined) out.group = info.group;
  return out;
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

/** The wire form of a selector; refuses anything but exactly one of pid and tag before it is sent. */
function selectorArgs(selector: ProcSelector, op: string): { pid?: number; tag?: string } {
  const hasPid = selector.pid !== undefined;
  const hasTag = selector.tag !== undefined;
  if (hasPid === hasTag) throw invalidArgument(`${op}: give exactly one of pid and tag`);
  return hasPid ? { pid: selector.pid } : { tag: selector.tag };
}

const utf8Strict = new TextDecoder("utf-8", { fatal: true });
const displayData = validator(DisplayData);

/** A display event's body, checked like every other guest message; undefined when it is not DisplayData. */
function parseDisplay(text: string): DisplayData | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return displayData.check(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

function toEvalOutcome(r: OpResult<"eval">): EvalOutcome {
  const out: EvalOutcome = {
    result: r.result,
    resultTruncated: r.result_truncated,
    stdout: r.stdout,
    stderr: r.stderr,
    stdoutTruncated: r.stdout_truncated,
    stderrTruncated: r.stderr_truncated,
    error: r.error,
    timedOut: r.timed_out,
    durationMs: r.duration_ms,
  };
  if (r.formats !== undefined) out.formats = r.formats;
  if (r.execution_count !== undefined) out.executionCount = r.execution_count;
  return out;
}

/** Keeps at most `limit` bytes of a stream, remembering whether more came. */
class Capture {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  total = 0;
  truncated = false;

  constructor(private readonly limit: number) {}

  add(chunk: Buffer): void {
    this.total += chunk.length;
    const room = this.limit - this.kept;
    if (chunk.length > room) this.truncated = true;
    if (room <= 0) return;
    const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.chunks.push(part);
    this.kept += part.length;
  }

  bytes(): Buffer {
    return Buffer.concat(this.chunks, this.kept);
  }
}

export class AgentClient {
  readonly files: AgentFiles;
  readonly contexts: AgentContexts;
  readonly procs: AgentProcesses;
  private readonly socket: Duplex;
  private readonly log: AgentClientLog | undefined;
  private readonly callTimeoutMs: number;
  private readonly graceMs: number;
  private readonly onHello: ((hello: Hello) => void) | undefined;
  private readonly onClose: ((reason: ForkdError) => void) | undefined;
  private readonly decoder: FrameDecoder;
  private readonly pending = new Map<number, Pending>();
  private helloWaiters: HelloWaiter[] = [];
  private lastHello: Hello | undefined;
  private nextId: number;
  private closedWith: ForkdError | undefined;
  private socketError: Error | undefined;
  private violations = 0;

  constructor(socket: Duplex, options: AgentClientOptions = {}) {
    this.socket = socket;
    this.log = options.log;
    this.callTimeoutMs = options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    this.graceMs = options.graceMs ?? DEFAULT_GRACE_MS;
    this.onHello = options.onHello;
    this.onClose = options.onClose;
    // A random first id: stale answers a restored guest may still have queued for an earlier host
    // (whose ids started elsewhere) cannot be mistaken for answers to this client's calls.
    this.nextId = 1 + Math.floor(Math.random() * (MAX_ID / 2));
    this.decoder = new FrameDecoder({
      onFrame: (frame) => this.onFrame(frame),
      onError: (err) =>
        this.violation("undecodable bytes from the guest agent", { reason: err.reason, error: err.message }),
    });
    socket.on("data", (chunk: Buffer) => this.decoder.push(chunk));
    socket.on("error", (err) => {
      this.socketError = err;
    });
    socket.on("close", () =>
      this.shutdown(
        new ForkdError(
          "unavailable",
          `agent connection closed${this.socketError ? `: ${this.socketError.message}` : ""}`,
          {
            cause: this.socketError,
          },
        ),
      ),
    );
    this.files = {
      write: (path, data, options = {}) => this.fileWrite(path, data, options),
      read: (path, options = {}) => this.fileRead(path, options),
      list: async (path, options = {}) => {
        const args: OpArgs<"file.list"> = { path };
        if (options.maxEntries !== undefined) args.max_entries = options.maxEntries;
        if (options.depth !== undefined) args.depth = options.depth;
        const { result } = await this.call("file.list", args, undefined, options.signal);
        return { entries: result.entries.map(toFileInfo), truncated: result.truncated };
      },
      stat: async (path, options = {}) =>
        toFileInfo((await this.call("file.stat", { path }, undefined, options.signal)).result),
      remove: async (path, options = {}) => {
        await this.call(
          "file.remove",
          { path, recursive: options.recursive === true },
          undefined,
          options.signal,
        );
      },
      mkdir: async (path, options = {}) => {
        const args: OpArgs<"file.mkdir"> = { path };
        if (options.parents !== undefined) args.parents = options.parents;
        if (options.mode !== undefined) args.mode = options.mode;
        if (options.user !== undefined) args.user = options.user;
        const { result } = await this.call("file.mkdir", args, undefined, options.signal);
        return { created: result.created, entry: toFileInfo(result.entry) };
      },
      move: async (source, destination, options = {}) => {
        const args: OpArgs<"file.move"> = { source, destination };
        if (options.user !== undefined) args.user = options.user;
        return toFileInfo((await this.call("file.move", args, undefined, options.signal)).result);
      },
      watch: (path, options = {}) => this.watch(path, options),
    };
    this.contexts = {
      create: async (options = {}) => {
        const args: OpArgs<"context.create"> = {};
        if (options.id !== undefined) args.id = options.id;
        if (options.cwd !== undefined) args.cwd = options.cwd;
        if (options.language !== undefined) args.language = options.language;
        return (await this.call("context.create", args, undefined, options.signal)).result;
      },
      list: async (options = {}) =>
        (await this.call("context.list", {}, undefined, options.signal)).result.contexts,
      restart: async (id, options = {}): Promise<ContextInfo> =>
        (await this.call("context.restart", { id }, undefined, options.signal)).result,
      remove: async (id, options = {}) => {
        await this.call("context.remove", { id }, undefined, options.signal);
      },
    };
    this.procs = {
      start: (argv, options = {}) => this.procStart(argv, options),
      connect: (selector, options = {}) => this.procAttach("proc.connect", null, selector, options),
      list: async (options = {}) =>
        (await this.call("proc.list", {}, undefined, options.signal)).result.processes.map(toProcInfo),
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
        await this.call("proc.input", args, bytes, options.signal);
      },
      closeStdin: async (selector, options = {}) => {
        await this.call(
          "proc.input",
          { ...selectorArgs(selector, "proc.input"), eof: true },
          undefined,
          options.signal,
        );
      },
      signal: async (selector, signal, options = {}) => {
        await this.call(
          "proc.signal",
          { ...selectorArgs(selector, "proc.signal"), signal },
          undefined,
          options.signal,
        );
      },
      resize: async (selector, size, options = {}) => {
        const args = { ...selectorArgs(selector, "proc.resize"), cols: size.cols, rows: size.rows };
        await this.call("proc.resize", args, undefined, options.signal);
      },
    };
  }

  /** The last hello the agent sent on this connection. */
  get hello(): Hello | undefined {
    return this.lastHello;
  }

  get closed(): boolean {
    return this.closedWith !== undefined;
  }

  /** Resolves with the hello already received on this connection, or the next one. */
  waitHello(options: CallOptions = {}): Promise<Hello> {
    if (this.lastHello !== undefined) {
      const hello = this.lastHello;
      return hello.protocol === PROTOCOL_VERSION
        ? Promise.resolve(hello)
        : Promise.reject(incompatible(hello.protocol));
    }
    if (this.closedWith) return Promise.reject(this.closedWith);
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(abortError(signal, "waiting for the agent's hello"));
    return new Promise<Hello>((resolve, reject) => {
      const onAbort = () => {
        this.helloWaiters = this.helloWaiters.filter((w) => w !== waiter);
        reject(abortError(signal as AbortSignal, "waiting for the agent's hello"));
      };
      const waiter: HelloWaiter = {
        resolve: (hello) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(hello);
        },
        reject: (err) => {
          signal?.removeEventListener("abort", onAbort);
          reject(err);
        },
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.helloWaiters.push(waiter);
    });
  }

  async ping(options: CallOptions = {}): Promise<PingInfo> {
    const { result: r } = await this.call("ping", {}, undefined, options.signal);
    return {
      protocol: r.protocol,
      agentVersion: r.agent_version,
      template: r.template,
      interpreter: r.interpreter,
      warm: r.warm,
      sandboxId: r.sandbox_id,
      hostname: r.hostname,
      uptimeMs: r.uptime_ms,
    };
  }

  /** Memory and disk use as the guest sees them (the filesystem of `path`, default `/`). */
  async stats(options: CallOptions & { path?: string } = {}): Promise<GuestStats> {
    const args: OpArgs<"stats"> = options.path === undefined ? {} : { path: options.path };
    const { result: r } = await this.call("stats", args, undefined, options.signal);
    return {
      memTotalBytes: r.mem_total_bytes,
      memAvailableBytes: r.mem_available_bytes,
      memCacheBytes: r.mem_cache_bytes,
      diskTotalBytes: r.disk_total_bytes,
      diskUsedBytes: r.disk_used_bytes,
    };
  }

  /** The post-restore fix-up: send it to every new child before anything else. Resolves once applied. */
  async restore(request: RestoreRequest, options: CallOptions = {}): Promise<RestoreInfo> {
    if (typeof request.timeNs !== "bigint" || request.timeNs < 0n || request.timeNs >= 2n ** 63n) {
      throw invalidArgument(`restore: timeNs must be a bigint in [0, 2^63), got ${String(request.timeNs)}`);
    }
    if (request.entropy.length < MIN_ENTROPY_BYTES || request.entropy.length > MAX_ENTROPY_BYTES) {
      throw invalidArgument(
        `restore: entropy must be ${MIN_ENTROPY_BYTES}..${MAX_ENTROPY_BYTES} bytes, got ${request.entropy.length}`,
      );
    }
    if (request.hostname.length > 64 || !new RegExp(HOSTNAME_PATTERN).test(request.hostname)) {
      throw invalidArgument(`restore: invalid hostname ${JSON.stringify(request.hostname)}`);
    }
    assertSandboxId(request.sandboxId);
    const args = {
      time_ns: request.timeNs.toString(),
      hostname: request.hostname,
      sandbox_id: request.sandboxId,
    };
    const { result: r } = await this.call("restore", args, request.entropy, options.signal);
    return {
      applied: r.applied,
      entropyBytes: r.entropy_bytes,
      hostname: r.hostname,
      sandboxId: r.sandbox_id,
      durationMs: r.duration_ms,
    };
  }

  /** Runs the template's warm-up code in the warm interpreter; the agent records the resulting warm state. */
  async warmup(code: string, options: EvalOptions = {}): Promise<WarmupOutcome> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
    const { result } = await this.call(
      "warmup",
      { timeout_ms: timeoutMs },
      Buffer.from(code, "utf8"),
      options.signal,
      {
        deadlineMs: timeoutMs + this.graceMs,
      },
    );
    return { ...toEvalOutcome(result), warm: result.warm };
  }

  /** Runs a notebook-style cell in a persistent Python namespace (a context; default `default`). */
  async eval(code: string, options: EvalOptions = {}): Promise<EvalOutcome> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
    const args: OpArgs<"eval"> = { timeout_ms: timeoutMs };
    if (options.context !== undefined) args.context = options.context;
    if (options.cwd !== undefined) args.cwd = options.cwd;
    if (options.env !== undefined) args.env = options.env;
    const streaming =
      options.onStdout !== undefined || options.onStderr !== undefined || options.onDisplay !== undefined;
    if (streaming) args.stream = true;
    let failure: ForkdError | undefined;
    const onEvent = (event: EventHeader, body: Buffer) => {
      if (!streaming || (event.ev !== "stdout" && event.ev !== "stderr" && event.ev !== "display")) {
        this.violation("unexpected event for an eval call", { ev: event.ev });
        return;
      }
      let text: string;
      try {
        text = utf8Strict.decode(body);
      } catch {
        failure ??= new ForkdError("internal", "eval: the guest streamed output that is not valid UTF-8");
        return;
      }
      if (event.ev === "stdout") options.onStdout?.(text);
      else if (event.ev === "stderr") options.onStderr?.(text);
      else {
        const data = parseDisplay(text);
        if (data === undefined) this.violation("eval: a display event that is not DisplayData", {});
        else options.onDisplay?.(data);
      }
    };
    const { result } = await this.call("eval", args, Buffer.from(code, "utf8"), options.signal, {
      deadlineMs: timeoutMs + this.graceMs,
      onEvent,
    });
    if (failure) throw failure;
    return toEvalOutcome(result);
  }

  /** Runs a program (argv, no shell) in the guest; output streams to the callbacks as it is produced. */
  async exec(argv: string[], options: ExecOptions = {}): Promise<ExecOutcome> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
    const captureLimit = options.maxCaptureBytes ?? DEFAULT_CAPTURE_BYTES;
    const stdout = new Capture(captureLimit);
    const stderr = new Capture(captureLimit);
    const input = options.stdin;
    let inline: Buffer | undefined;
    if (typeof input === "string" || Buffer.isBuffer(input)) {
      const bytes = typeof input === "string" ? Buffer.from(input, "utf8") : input;
      if (bytes.length <= STDIN_INLINE_BYTES) inline = bytes;
    }
    const mode = input === undefined ? "none" : inline !== undefined ? "body" : "stream";
    const args: OpArgs<"exec"> = { argv, stdin: mode, timeout_ms: timeoutMs };
    if (options.env !== undefined) args.env = options.env;
    if (options.cwd !== undefined) args.cwd = options.cwd;
    if (options.user !== undefined) args.user = options.user;

    let acked = 0;
    let sent = 0;
    let ackWaiter: (() => void) | undefined;
    let streamFailure: Error | undefined;
    // Set once the call exists: a refused acknowledgement cancels it.
    let callId = 0;
    const onEvent = (event: EventHeader, body: Buffer) => {
      if (event.ev === "stdout") {
        stdout.add(body);
        options.onStdout?.(body);
      } else if (event.ev === "stderr") {
        stderr.add(body);
        options.onStderr?.(body);
      } else if (event.ev === "stdin_ack") {
        const bytes = event.bytes ?? 0;
        // A hostile guest acknowledging bytes it never received would open the window past its bound.
        if (mode !== "stream" || acked + bytes > sent) {
          this.violation("stdin_ack beyond the bytes sent", { acked, bytes, sent });
          streamFailure ??= new ForkdError(
            "internal",
            `exec: the guest acknowledged ${acked + bytes} stdin bytes but only ${sent} were sent`,
          );
          // Fail now: the guest's answer to a call it has lied about means nothing.
          this.pending.get(callId)?.reject(streamFailure);
          this.cancel(callId);
          ackWaiter?.();
          return;
        }
        acked += bytes;
        ackWaiter?.();
      } else {
        this.violation("unexpected event for an exec call", { ev: event.ev });
      }
    };
    const { id, answer: call } = this.start("exec", args, inline, options.signal, {
      deadlineMs: timeoutMs + this.graceMs,
      onEvent,
    });
    callId = id;
    if (mode === "stream" && input !== undefined) {
      let settled = false;
      const settle = () => {
        settled = true;
        ackWaiter?.();
      };
      call.then(settle, settle);
      const stream = {
        settled: () => settled || streamFailure !== undefined,
        acked: () => acked,
        sent: (bytes: number) => {
          sent += bytes;
        },
        onAck: (wake: () => void) => {
          ackWaiter = wake;
        },
      };
      this.streamStdin(id, input, stream).catch((err: unknown) => {
        const message = err instanceof Error ? err.message : String(err);
        streamFailure ??=
          err instanceof ForkdError
            ? err
            : new ForkdError("invalid_argument", `exec: reading stdin failed: ${message}`);
        this.cancel(id);
      });
    }
    let answer: Awaited<typeof call>;
    try {
      answer = await call;
    } catch (err) {
      if (streamFailure) throw streamFailure;
      throw err;
    }
    if (streamFailure) throw streamFailure;
    const r = answer.result;
    return {
      exitCode: r.exit_code,
      signal: r.signal,
      timedOut: r.timed_out,
      stdout: stdout.bytes(),
      stderr: stderr.bytes(),
      stdoutTruncated: stdout.truncated,
      stderrTruncated: stderr.truncated,
      stdoutBytes: r.stdout_bytes,
      stderrBytes: r.stderr_bytes,
      durationMs: r.duration_ms,
    };
  }

  /** Closes the connection; pending calls reject. */
  close(): void {
    this.shutdown(new ForkdError("unavailable", "agent client closed"));
    this.socket.destroy();
  }

  // ---- internals

  private allocateId(): number {
    for (;;) {
      const id = this.nextId;
      this.nextId = id >= MAX_ID ? 1 : id + 1;
      if (!this.pending.has(id)) return id;
    }
  }

  private call<O extends OpName>(
    op: O,
    args: OpArgs<O>,
    body: Buffer | undefined,
    signal: AbortSignal | undefined,
    extra: StartExtra = {},
  ): Promise<{ result: OpResult<O>; body: Buffer }> {
    return this.start(op, args, body, signal, extra).answer;
  }

  /** Sends a request; `id` lets the caller stream input to it or cancel it. */
  private start<O extends OpName>(
    op: O,
    args: OpArgs<O>,
    body: Buffer | undefined,
    signal: AbortSignal | undefined,
    extra: StartExtra,
  ): { id: number; answer: Promise<{ result: OpResult<O>; body: Buffer }> } {
    const id = this.allocateId();
    if (this.closedWith) return { id, answer: Promise.reject(this.closedWith) };
    const what = `agent ${op}`;
    if (signal?.aborted) return { id, answer: Promise.reject(abortError(signal, what)) };
    let frame: Buffer;
    try {
      opValidators[op].args.assert(args, `${op} arguments`);
      frame = encodeFrame({ t: "req", id, op, args }, body);
      this.assertRoomToSend(frame.length, what);
    } catch (err) {
      return { id, answer: Promise.reject(err) };
    }
    const firstDeadlineMs = extra.deadlineMs === undefined ? this.callTimeoutMs : extra.deadlineMs;
    const answer = new Promise<{ result: OpResult<O>; body: Buffer }>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const finish = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        this.pending.delete(id);
      };
      const setDeadline = (ms: number | null) => {
        clearTimeout(timer);
        timer =
          ms === null
            ? undefined
            : setTimeout(() => {
                finish();
                this.cancel(id);
                reject(new ForkdError("timeout", `${what}: the guest agent did not answer within ${ms} ms`));
              }, ms);
      };
      setDeadline(firstDeadlineMs);
      const onAbort = () => {
        finish();
        this.cancel(id);
        reject(abortError(signal as AbortSignal, what));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.pending.set(id, {
        id,
        op,
        onEvent: extra.onEvent,
        setDeadline,
        resolve: (answer) => {
          finish();
          try {
            const result = opValidators[op].result.assert(answer.result, `${op} result from the guest`);
            resolve({ result, body: answer.body });
          } catch (err) {
            reject(new ForkdError("internal", errorMessage(err)));
          }
        },
        reject: (err) => {
          finish();
          reject(err);
        },
      });
      this.socket.write(frame);
    });
    return { id, answer };
  }

  /**
   * A guest that stops reading its port stops QEMU reading the host's end, and what the host writes then queues
   * in this process. New calls are refused (`unavailable`) once MAX_UNSENT_BYTES would be queued, so a guest can
   * stall only itself, never the daemon's memory.
   */
  private assertRoomToSend(bytes: number, what: string): void {
    const queued = this.socket.writableLength;
    if (queued > 0 && queued + bytes > MAX_UNSENT_BYTES) {
      throw new ForkdError(
        "unavailable",
        `${what}: the guest is not reading its channel (${queued} bytes already waiting to be sent); ` +
          "it may be overloaded or hung",
      );
    }
  }

  private cancel(id: number): void {
    if (!this.closedWith) this.socket.write(encodeFrame({ t: "cancel", id }));
  }

  /** Sends stdin in `in` frames, never more than STDIN_WINDOW_BYTES ahead of the guest's acknowledgements. */
  private async streamStdin(
    id: number,
    source: Buffer | string | AsyncIterable<Buffer | Uint8Array | string>,
    stream: {
      settled: () => boolean;
      acked: () => number;
      sent: (bytes: number) => void;
      onAck: (wake: () => void) => void;
    },
  ): Promise<void> {
    const { settled, acked, onAck } = stream;
    // Over once the call was answered, failed before it was sent, or the connection went away.
    const over = () => settled() || !this.pending.has(id) || this.closedWith !== undefined;
    let sent = 0;
    const waitForWindow = (size: number) =>
      new Promise<void>((resolve) => {
        const check = () => {
          if (over() || sent - acked() + size <= STDIN_WINDOW_BYTES) resolve();
          else onAck(check);
        };
        check();
      });
    const chunks: Iterable<Buffer | string> | AsyncIterable<Buffer | Uint8Array | string> =
      typeof source === "string" || Buffer.isBuffer(source) ? [source] : source;
    for await (const item of chunks) {
      if (over()) return;
      const bytes =
        typeof item === "string"
          ? Buffer.from(item, "utf8")
          : Buffer.from(item.buffer, item.byteOffset, item.byteLength);
      for (let at = 0; at < bytes.length; at += STDIN_CHUNK_BYTES) {
        const piece = bytes.subarray(at, at + STDIN_CHUNK_BYTES);
        await waitForWindow(piece.length);
        if (over()) return;
        // The stdin window bounds this call's own input; the check bounds all calls' together.
        const frame = encodeFrame({ t: "in", id }, piece);
        this.assertRoomToSend(frame.length, `agent stdin of call ${id}`);
        // Counted before the write: an acknowledgement can only follow the bytes it acknowledges.
        sent += piece.length;
        stream.sent(piece.length);
        this.socket.write(frame);
      }
    }
    if (!over()) this.socket.write(encodeFrame({ t: "in", id, eof: true }));
  }

  private watch(path: string, options: WatchOptions): WatchHandle {
    const limit = options.maxBufferedEvents ?? MAX_QUEUED_WATCH_EVENTS;
    const queue = new AsyncQueue<FsEvent>();
    let buffered = 0;
    let overflowed = false;
    let callId = 0;
    const onEvent = (event: EventHeader) => {
      if (event.ev !== "fs" || event.fs === undefined) {
        this.violation("unexpected event for a watch call", { ev: event.ev });
        return;
      }
      const fsEvent: FsEvent = { name: event.fs.name, op: event.fs.op };
      options.onEvent?.(fsEvent);
      if (queue.abandoned || overflowed) return;
      if (++buffered > limit) {
        const error = new ForkdError("unavailable", `watch ${path}: more than ${limit} events were not read`);
        if (queue.active) {
          // A reader fell behind: the watch ends rather than buffering without bound.
          queue.fail(error);
          this.cancel(callId);
        } else {
          // Nobody iterates (callbacks only): stop buffering for an iterator that may never come.
          overflowed = true;
          queue.discard(error);
        }
        return;
      }
      queue.push(fsEvent, () => {
        buffered--;
      });
    };
    const args: OpArgs<"watch"> = { path };
    if (options.recursive !== undefined) args.recursive = options.recursive;
    const { id, answer } = this.start("watch", args, undefined, options.signal, {
      deadlineMs: null,
      onEvent,
    });
    callId = id;
    const done: Promise<WatchEnd> = answer.then(
      ({ result }) => {
        queue.end();
        return result;
      },
      (err: unknown) => {
        queue.fail(err instanceof Error ? err : new Error(String(err)));
        throw err;
      },
    );
    done.catch(() => {});
    let stopped = false;
    return {
      events: queue,
      done,
      stop: () => {
        if (!stopped && !this.closedWith && this.pending.has(id)) {
          stopped = true;
          // After the cancel the guest owes the summary promptly.
          this.pending.get(id)?.setDeadline(this.callTimeoutMs);
          this.cancel(id);
        }
        return done;
      },
    };
  }

  private procStart(argv: string[], options: ProcStartOptions): ProcHandle {
    const args: OpArgs<"proc.start"> = { argv };
    if (options.env !== undefined) args.env = options.env;
    if (options.cwd !== undefined) args.cwd = options.cwd;
    if (options.user !== undefined) args.user = options.user;
    if (options.tag !== undefined) args.tag = options.tag;
    if (options.pty !== undefined) args.pty = { cols: options.pty.cols, rows: options.pty.rows };
    if (options.stdin !== undefined) args.stdin = options.stdin;
    if (options.timeoutMs !== undefined) args.timeout_ms = options.timeoutMs;
    return this.procAttach("proc.start", args, null, options);
  }

  /**
   * A proc.start or proc.connect call as a handle. Deadlines: the `started` event must come within the call
   * timeout; after it the call runs as long as the process (or timeout_ms plus the grace period).
   */
  private procAttach(
    op: "proc.start" | "proc.connect",
    startArgs: OpArgs<"proc.start"> | null,
    selector: ProcSelector | null,
    options: ProcAttachOptions,
  ): ProcHandle {
    const limit = options.maxBufferedBytes ?? MAX_QUEUED_OUTPUT_BYTES;
    const queue = new AsyncQueue<ProcOutput>();
    let buffered = 0;
    let overflowed = false;
    let callId = 0;
    let startedPid: number | undefined;
    let resolvePid!: (pid: number) => void;
    let rejectPid!: (err: Error) => void;
    const pid = new Promise<number>((resolve, reject) => {
      resolvePid = resolve;
      rejectPid = reject;
    });
    pid.catch(() => {});
    let detached = false;
    let failure: ForkdError | undefined;
    const fail = (err: ForkdError) => {
      failure ??= err;
      this.pending.get(callId)?.reject(err);
      this.cancel(callId);
    };
    const onEvent = (event: EventHeader, body: Buffer) => {
      if (event.ev === "started") {
        const wanted = selector?.pid;
        if (
          startedPid !== undefined ||
          event.pid === undefined ||
          (wanted !== undefined && event.pid !== wanted)
        ) {
          this.violation(`bad started event for a ${op} call`, { pid: event.pid, startedPid });
          fail(new ForkdError("internal", `${op}: the guest reported an inconsistent pid (${event.pid})`));
          return;
        }
        startedPid = event.pid;
        resolvePid(event.pid);
        const timeoutMs = startArgs?.timeout_ms;
        this.pending.get(callId)?.setDeadline(timeoutMs === undefined ? null : timeoutMs + this.graceMs);
        return;
      }
      if (
        (event.ev !== "stdout" && event.ev !== "stderr" && event.ev !== "pty") ||
        startedPid === undefined
      ) {
        this.violation(`unexpected event for a ${op} call`, {
          ev: event.ev,
          started: startedPid !== undefined,
        });
        return;
      }
      if (event.ev === "stdout") options.onStdout?.(body);
      else if (event.ev === "stderr") options.onStderr?.(body);
      else options.onPty?.(body);
      if (queue.abandoned || detached || overflowed) return;
      buffered += body.length;
      if (buffered > limit) {
        const error = new ForkdError("unavailable", `${op}: more than ${limit} output bytes were not read`);
        if (queue.active) {
          // A reader fell behind: detach (the process keeps running) rather than buffer without bound.
          queue.fail(error);
          detached = true;
          failure ??= error;
          this.pending.get(callId)?.reject(error);
          this.cancel(callId);
        } else {
          overflowed = true;
          queue.discard(error);
        }
        return;
      }
      queue.push({ stream: event.ev, data: body }, () => {
        buffered -= body.length;
      });
    };
    let args: OpArgs<"proc.start"> | OpArgs<"proc.connect">;
    try {
      args = startArgs ?? selectorArgs(selector as ProcSelector, op);
    } catch (err) {
      const error = err as Error;
      rejectPid(error);
      queue.fail(error);
      const done = Promise.reject(error);
      done.catch(() => {});
      return { pid, done, output: queue, detach: () => {} };
    }
    const { id, answer } = this.start(op, args, undefined, options.signal, { onEvent });
    callId = id;
    const done: Promise<ProcEnd> = answer.then(
      ({ result }) => {
        if (failure) throw failure;
        if (startedPid !== undefined && result.pid !== startedPid) {
          throw new ForkdError("internal", `${op}: the guest ended pid ${result.pid}, not ${startedPid}`);
        }
        // proc.connect to a process that already ended answers without a started event.
        if (startedPid === undefined) resolvePid(result.pid);
        queue.end();
        return toProcEnd(result);
      },
      (err: unknown) => {
        const error = failure ?? (err instanceof Error ? err : new Error(String(err)));
        rejectPid(error);
        queue.fail(error);
        throw error;
      },
    );
    done.catch(() => {});
    return {
      pid,
      done,
      output: queue,
      detach: () => {
        if (detached) return;
        detached = true;
        failure ??= new ForkdError("unavailable", `${op}: detached (the process keeps running in the guest)`);
        const pending = this.pending.get(id);
        if (pending) pending.reject(failure);
        this.cancel(id);
      },
    };
  }

  private async fileWrite(
    path: string,
    data: Buffer | string,
    options: FileWriteOptions,
  ): Promise<{ bytes: number }> {
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    if (bytes.length > MAX_FILE_BYTES) {
      throw new ForkdError(
        "payload_too_large",
        `files.write ${path}: ${bytes.length} bytes exceeds the ${MAX_FILE_BYTES}-byte limit of one write`,
      );
    }
    const args: OpArgs<"file.write"> = { path };
    if (options.mode !== undefined) args.mode = options.mode;
    if (options.parents !== undefined) args.parents = options.parents;
    if (options.user !== undefined) args.user = options.user;
    if (options.append !== undefined) args.append = options.append;
    const { result } = await this.call("file.write", args, bytes, options.signal);
    return { bytes: result.bytes };
  }

  private async fileRead(path: string, options: CallOptions & { maxBytes?: number; offset?: number }) {
    const args: OpArgs<"file.read"> = { path, max_bytes: options.maxBytes ?? DEFAULT_READ_BYTES };
    if (options.offset !== undefined) args.offset = options.offset;
    const { result, body } = await this.call("file.read", args, undefined, options.signal);
    if (body.length > args.max_bytes) {
      throw new ForkdError(
        "internal",
        `file.read ${path}: the guest sent ${body.length} bytes, more than asked`,
      );
    }
    return { data: body, size: result.size, truncated: result.truncated };
  }

  private onFrame(frame: Frame): void {
    let message: ReturnType<typeof parseGuestMessage>;
    try {
      message = parseGuestMessage(frame);
    } catch (err) {
      // A malformed answer to a pending call fails that call now instead of leaving it to its deadline.
      const pending = frame.header.t === "res" ? this.pending.get(frame.header.id as number) : undefined;
      if (pending) pending.reject(new ForkdError("internal", `agent ${pending.op}: ${errorMessage(err)}`));
      this.violation("invalid message from the guest agent", {
        t: frame.header.t.slice(0, 16),
        error: errorMessage(err),
      });
      return;
    }
    switch (message.t) {
      case "hello":
        this.receiveHello(toHello(message));
        return;
      case "res":
        this.receiveResponse(message, frame.body);
        return;
      case "evt":
        this.pending.get(message.id)?.onEvent?.(message, frame.body);
        return;
    }
  }

  private receiveHello(hello: Hello): void {
    this.lastHello = hello;
    const waiters = this.helloWaiters;
    this.helloWaiters = [];
    for (const waiter of waiters) {
      if (hello.protocol === PROTOCOL_VERSION) waiter.resolve(hello);
      else waiter.reject(incompatible(hello.protocol));
    }
    this.onHello?.(hello);
  }

  private receiveResponse(message: ResponseHeader, body: Buffer): void {
    const pending = this.pending.get(message.id);
    if (pending === undefined) {
      this.log?.debug?.({ id: message.id }, "agent answered a call that is no longer pending");
      return;
    }
    if (!message.ok) {
      pending.reject(new ForkdError(wireErrorCode(message.error.code), message.error.message));
      return;
    }
    if (message.result_in_body) {
      let result: unknown;
      try {
        result = JSON.parse(body.toString("utf8"));
      } catch (err) {
        pending.reject(
          new ForkdError("internal", `agent ${pending.op}: result body is not JSON: ${errorMessage(err)}`),
        );
        return;
      }
      pending.resolve({ result, body: Buffer.alloc(0) });
      return;
    }
    pending.resolve({ result: message.result ?? {}, body });
  }

  private violation(msg: string, fields: Record<string, unknown>): void {
    this.violations++;
    if (this.violations <= LOG_FIRST_VIOLATIONS || this.violations % LOG_EVERY_VIOLATIONS === 0) {
      this.log?.warn({ ...fields, violations: this.violations }, msg);
    }
  }

  private shutdown(reason: ForkdError): void {
    if (this.closedWith) return;
    this.closedWith = reason;
    for (const pending of [...this.pending.values()]) {
      pending.reject(
        new ForkdError(reason.code, `${reason.message} while waiting for ${pending.op} #${pending.id}`),
      );
    }
    this.pending.clear();
    const waiters = this.helloWaiters;
    this.helloWaiters = [];
    for (const waiter of waiters)
      waiter.reject(new ForkdError(reason.code, `${reason.message} before the agent said hello`));
    this.onClose?.(reason);
  }
}
