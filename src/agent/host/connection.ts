/**
 * The connection under AgentClient: one guest agent channel, its calls multiplexed by id. Every call has a
 * host-side deadline so a silent guest cannot hang the controller; everything the guest sends is validated and
 * bounded. The op families (exec.ts, processes.ts, files.ts, interpreter.ts) are built on `call` and `start`.
 */
import type { Duplex } from "node:stream";
import { abortError } from "../../common/deadline.js";
import { errorMessage, ForkdError } from "../../common/errors.js";
import {
  type EventHeader,
  encodeFrame,
  type Frame,
  FrameDecoder,
  type HelloHeader,
  MAX_ID,
  type OpArgs,
  type OpName,
  type OpResult,
  opValidators,
  PROTOCOL_VERSION,
  parseGuestMessage,
  type ResponseHeader,
  wireErrorCode,
} from "../protocol/index.js";
import type { CallOptions, Hello } from "./types.js";

/**
 * Bytes the host may have written to a guest's channel that the guest has not taken yet (beyond the socket's
 * kernel buffer): one full file.write frame and change, so any single call still fits.
 */
export const MAX_UNSENT_BYTES = 32 * 1024 * 1024;

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

/** How long a guest-side timeout (exec, eval, warmup) is when the caller gives none. */
export const DEFAULT_GUEST_TIMEOUT_MS = 60_000;
const DEFAULT_CALL_TIMEOUT_MS = 30_000;
const DEFAULT_GRACE_MS = 10_000;
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

/** Options of one call's start (see AgentConnection.start). */
export interface StartExtra {
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

/** One agent connection: calls, their answers and events, the hello, and the end. */
export class AgentConnection {
  /** Host-side deadline of calls without a guest-side timeout. */
  readonly callTimeoutMs: number;
  /** How long past a guest-side timeout the host still waits for the answer. */
  readonly graceMs: number;
  private readonly socket: Duplex;
  private readonly log: AgentClientLog | undefined;
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

  /** Closes the connection; pending calls reject. */
  close(): void {
    this.shutdown(new ForkdError("unavailable", "agent client closed"));
    this.socket.destroy();
  }

  /** Sends a request and waits for its answer. */
  call<O extends OpName>(
    op: O,
    args: OpArgs<O>,
    body: Buffer | undefined,
    signal: AbortSignal | undefined,
    extra: StartExtra = {},
  ): Promise<{ result: OpResult<O>; body: Buffer }> {
    return this.start(op, args, body, signal, extra).answer;
  }

  /** Sends a request; `id` lets the caller stream input to it or cancel it. */
  start<O extends OpName>(
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
  assertRoomToSend(bytes: number, what: string): void {
    const queued = this.socket.writableLength;
    if (queued > 0 && queued + bytes > MAX_UNSENT_BYTES) {
      throw new ForkdError(
        "unavailable",
        `${what}: the guest is not reading its channel (${queued} bytes already waiting to be sent); ` +
          "it may be overloaded or hung",
      );
    }
  }

  /** Asks the guest to cancel call `id` (nothing once the connection is gone). */
  cancel(id: number): void {
    if (!this.closedWith) this.socket.write(encodeFrame({ t: "cancel", id }));
  }

  /** Whether call `id` still waits for its answer. */
  isPending(id: number): boolean {
    return this.pending.has(id);
  }

  /** Fails call `id` now (if still pending) with `error`; the guest's answer, if any, is then ignored. */
  failCall(id: number, error: Error): void {
    this.pending.get(id)?.reject(error);
  }

  /** Replaces call `id`'s host-side deadline (null: none) from now on. */
  setCallDeadline(id: number, ms: number | null): void {
    this.pending.get(id)?.setDeadline(ms);
  }

  /** Writes an already encoded frame (stdin of a call; checked with assertRoomToSend first). */
  send(frame: Buffer): void {
    this.socket.write(frame);
  }

  /** Counts (and logs, at a bounded rate) a message from the guest that breaks the protocol. */
  violation(msg: string, fields: Record<string, unknown>): void {
    this.violations++;
    if (this.violations <= LOG_FIRST_VIOLATIONS || this.violations % LOG_EVERY_VIOLATIONS === 0) {
      this.log?.warn({ ...fields, violations: this.violations }, msg);
    }
  }

  // ---- internals

  private allocateId(): number {
    for (;;) {
      const id = this.nextId;
      this.nextId = id >= MAX_ID ? 1 : id + 1;
      if (!this.pending.has(id)) return id;
    }
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
