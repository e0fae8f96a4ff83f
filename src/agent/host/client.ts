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
  type EventHeader,
  encodeFrame,
  type Frame,
  FrameDecoder,
  type HelloHeader,
  HOSTNAME_PATTERN,
  MAX_ENTROPY_BYTES,
  MAX_FILE_BYTES,
  MAX_ID,
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
  wireErrorCode,
} from "../protocol/index.js";
import type {
  AgentFiles,
  CallOptions,
  EvalOptions,
  EvalOutcome,
  ExecOptions,
  ExecOutcome,
  FileInfo,
  Hello,
  PingInfo,
  RestoreInfo,
  RestoreRequest,
  WarmupOutcome,
} from "./types.js";

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
  return out;
}

function toEvalOutcome(r: OpResult<"eval">): EvalOutcome {
  return {
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

  /** Runs a notebook-style cell in the sandbox's persistent Python namespace. */
  async eval(code: string, options: EvalOptions = {}): Promise<EvalOutcome> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_GUEST_TIMEOUT_MS;
    const { result } = await this.call(
      "eval",
      { timeout_ms: timeoutMs },
      Buffer.from(code, "utf8"),
      options.signal,
      {
        deadlineMs: timeoutMs + this.graceMs,
      },
    );
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

    let acked = 0;
    let ackWaiter: (() => void) | undefined;
    const onEvent = (event: EventHeader, body: Buffer) => {
      if (event.ev === "stdout") {
        stdout.add(body);
        options.onStdout?.(body);
      } else if (event.ev === "stderr") {
        stderr.add(body);
        options.onStderr?.(body);
      } else if (event.ev === "stdin_ack") {
        acked += event.bytes ?? 0;
        ackWaiter?.();
      }
    };
    let streamFailure: Error | undefined;
    const { id, answer: call } = this.start("exec", args, inline, options.signal, {
      deadlineMs: timeoutMs + this.graceMs,
      onEvent,
    });
    if (mode === "stream" && input !== undefined) {
      let settled = false;
      const settle = () => {
        settled = true;
        ackWaiter?.();
      };
      call.then(settle, settle);
      const stream = {
        settled: () => settled,
        acked: () => acked,
        onAck: (wake: () => void) => {
          ackWaiter = wake;
        },
      };
      this.streamStdin(id, input, stream).catch((err: unknown) => {
        streamFailure = err instanceof Error ? err : new Error(String(err));
        this.cancel(id);
      });
    }
    let answer: Awaited<typeof call>;
    try {
      answer = await call;
    } catch (err) {
      if (streamFailure)
        throw new ForkdError("invalid_argument", `exec: reading stdin failed: ${streamFailure.message}`);
      throw err;
    }
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
    extra: { deadlineMs?: number; onEvent?: Pending["onEvent"] } = {},
  ): Promise<{ result: OpResult<O>; body: Buffer }> {
    return this.start(op, args, body, signal, extra).answer;
  }

  /** Sends a request; `id` lets the caller stream input to it or cancel it. */
  private start<O extends OpName>(
    op: O,
    args: OpArgs<O>,
    body: Buffer | undefined,
    signal: AbortSignal | undefined,
    extra: { deadlineMs?: number; onEvent?: Pending["onEvent"] },
  ): { id: number; answer: Promise<{ result: OpResult<O>; body: Buffer }> } {
    const id = this.allocateId();
    if (this.closedWith) return { id, answer: Promise.reject(this.closedWith) };
    const what = `agent ${op}`;
    if (signal?.aborted) return { id, answer: Promise.reject(abortError(signal, what)) };
    let frame: Buffer;
    try {
      opValidators[op].args.assert(args, `${op} arguments`);
      frame = encodeFrame({ t: "req", id, op, args }, body);
    } catch (err) {
      return { id, answer: Promise.reject(err) };
    }
    const deadlineMs = extra.deadlineMs ?? this.callTimeoutMs;
    const answer = new Promise<{ result: OpResult<O>; body: Buffer }>((resolve, reject) => {
      const finish = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        this.pending.delete(id);
      };
      const timer = setTimeout(() => {
        finish();
        this.cancel(id);
        reject(new ForkdError("timeout", `${what}: the guest agent did not answer within ${deadlineMs} ms`));
      }, deadlineMs);
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

  private cancel(id: number): void {
    if (!this.closedWith) this.socket.write(encodeFrame({ t: "cancel", id }));
  }

  /** Sends stdin in `in` frames, never more than STDIN_WINDOW_BYTES ahead of the guest's acknowledgements. */
  private async streamStdin(
    id: number,
    source: Buffer | string | AsyncIterable<Buffer | Uint8Array | string>,
    stream: { settled: () => boolean; acked: () => number; onAck: (wake: () => void) => void },
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
        this.socket.write(encodeFrame({ t: "in", id }, piece));
        sent += piece.length;
      }
    }
    if (!over()) this.socket.write(encodeFrame({ t: "in", id, eof: true }));
  }

  private async fileWrite(
    path: string,
    data: Buffer | string,
    options: CallOptions & { mode?: number; parents?: boolean },
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
