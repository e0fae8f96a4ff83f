/**
 * A QMP (QEMU Machine Protocol) client over a unix socket. The peer is treated as untrusted: lines are bounded,
 * malformed JSON closes the connection, and every pending command and event wait is rejected with a clear
 * error when the socket closes, so no caller waits forever on a dead QEMU.
 */
import { EventEmitter } from "node:events";
import net from "node:net";
import { abortError, raceAbort, timeoutSignal } from "../common/deadline.js";
import { type ErrorCode, errorMessage, ForkdError } from "../common/errors.js";

/**
 * Longest QMP message accepted. The largest reply we ever ask for (`query-qmp-schema`) is about 200 KB on
 * QEMU 7.2; a peer that sends more without a newline is broken or hostile.
 */
export const MAX_QMP_LINE_BYTES = 4 * 1024 * 1024;

/** Events buffered for a slow `events()` consumer before the iterator fails instead of growing forever. */
export const MAX_QUEUED_EVENTS = 1024;

/** QEMU greets and accepts capabilities within milliseconds; this only bounds a wedged or wrong peer. */
export const QMP_HANDSHAKE_TIMEOUT_MS = 10_000;

/**
 * Default bound for one command. Every command forkd issues (stop, cont, save device state, quit, chardev
 * changes) completes in milliseconds; a caller needing longer passes its own signal and `timeoutMs: 0`.
 */
export const QMP_COMMAND_TIMEOUT_MS = 30_000;

/** How long a closing connection waits for `describeClose` (QEMU's exit is seen a moment after the socket's). */
export const CLOSE_CONTEXT_WAIT_MS = 1000;

export interface QmpGreeting {
  version: { qemu: { major: number; minor: number; micro: number }; package: string };
  capabilities: string[];
}

export interface QmpEvent {
  event: string;
  data: Record<string, unknown>;
  timestamp: { seconds: number; microseconds: number };
}

/** QMP's error classes (qapi/error.json) mapped onto forkd's catalogue. */
const QMP_CLASS_CODES: Record<string, ErrorCode> = {
  CommandNotFound: "not_implemented",
  DeviceNotFound: "not_found",
  DeviceNotActive: "conflict",
  KVMMissingCap: "unavailable",
  GenericError: "internal",
};

/** QEMU answered a command with an error. */
export class QmpError extends ForkdError {
  /** QMP's error class, e.g. "GenericError", "CommandNotFound". */
  readonly qmpClass: string;
  /** QEMU's human-readable description. */
  readonly desc: string;
  readonly command: string;

  constructor(command: string, qmpClass: string, desc: string) {
    super(QMP_CLASS_CODES[qmpClass] ?? "internal", `QMP ${command} failed (${qmpClass}): ${desc}`);
    this.name = "QmpError";
    this.qmpClass = qmpClass;
    this.desc = desc;
    this.command = command;
  }
}

export interface QmpConnectOptions {
  signal?: AbortSignal;
  /**
   * Called when the connection closes (not on `close()`); its answer is appended to every rejection (e.g.
   * "QEMU exited with code 1; its output ends with ..."), so a caller learns why instead of just "closed".
   * May be async: it is awaited for at most CLOSE_CONTEXT_WAIT_MS.
   */
  describeClose?: () => string | Promise<string>;
}

export interface QmpExecuteOptions {
  signal?: AbortSignal;
  /** Overrides QMP_COMMAND_TIMEOUT_MS; 0 disables the default bound (the caller's signal still applies). */
  timeoutMs?: number;
}

export interface WaitEventOptions {
  signal?: AbortSignal;
  predicate?: (event: QmpEvent) => boolean;
}

interface PendingCommand {
  command: string;
  resolve: (value: unknown) => void;
  reject: (err: Error) => void;
  /** Created when the call was made, so a late rejection still points at the caller. */
  callSite: Error;
  dispose: () => void;
}

interface EventWaiter {
  name: string;
  predicate: ((event: QmpEvent) => boolean) | undefined;
  resolve: (event: QmpEvent) => void;
  reject: (err: Error) => void;
  callSite: Error;
  dispose: () => void;
}

const COMMAND_NAME = /^[A-Za-z][A-Za-z0-9_-]{0,127}$/;

/**
 * Emits "event" (QmpEvent) for every asynchronous QMP event and "close" (Error) once when the connection
 * ends. Register event waits (`waitEvent`) before executing the command that causes the event.
 */
export class QmpClient extends EventEmitter {
  readonly greeting: QmpGreeting;
  private readonly socket: net.Socket;
  private readonly describeClose: (() => string | Promise<string>) | undefined;
  private readonly pending = new Map<string, PendingCommand>();
  private readonly waiters = new Set<EventWaiter>();
  private nextId = 1;
  private closeError: Error | undefined;
  private shuttingDown = false;
  private partial: Buffer[] = [];
  private partialBytes = 0;
  private onGreeting: (() => void) | undefined;
  private readonly greeted: Promise<void>;

  /** Connects, reads the greeting and negotiates capabilities. Bounded by QMP_HANDSHAKE_TIMEOUT_MS. */
  static async connect(socketPath: string, options: QmpConnectOptions = {}): Promise<QmpClient> {
    const deadline = timeoutSignal(QMP_HANDSHAKE_TIMEOUT_MS, options.signal);
    const { signal } = deadline;
    try {
      const socket = await connectUnix(socketPath, signal);
      const client = new QmpClient(socket, options.describeClose);
      try {
        await raceAbort(client.greeted, signal, `QMP greeting on ${socketPath}`);
        await client.execute("qmp_capabilities", undefined, { signal });
        return client;
      } catch (err) {
        client.close();
        throw err;
      }
    } finally {
      deadline.dispose();
    }
  }

  private constructor(socket: net.Socket, describeClose: QmpConnectOptions["describeClose"]) {
    super();
    this.socket = socket;
    this.describeClose = describeClose;
    this.greeting = { version: { qemu: { major: 0, minor: 0, micro: 0 }, package: "" }, capabilities: [] };
    this.greeted = new Promise<void>((resolve, reject) => {
      this.onGreeting = resolve;
      this.once("close", reject);
    });
    this.greeted.catch(() => {});
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", (err) =>
      this.shutdown(new ForkdError("unavailable", `QMP socket error: ${err.message}`)),
    );
    socket.on("close", () => this.shutdown(new ForkdError("unavailable", "QMP connection closed")));
  }

  get closed(): boolean {
    return this.shuttingDown;
  }

  /**
   * Runs `command` and resolves with its "return" value; rejects with QmpError if QEMU answers with an error.
   * Aborting stops waiting but cannot undo a command QEMU already received.
   */
  execute<T = unknown>(
    command: string,
    args?: Record<string, unknown>,
    options: QmpExecuteOptions = {},
  ): Promise<T> {
    const callSite = new Error();
    if (!COMMAND_NAME.test(command)) {
      return Promise.reject(
        new ForkdError("invalid_argument", `invalid QMP command name ${JSON.stringify(command)}`),
      );
    }
    if (this.closeError) return Promise.reject(this.closedError(`QMP ${command} not sent`, callSite));
    const timeoutMs = options.timeoutMs ?? QMP_COMMAND_TIMEOUT_MS;
    if (options.signal?.aborted) return Promise.reject(abortError(options.signal, `QMP ${command}`));
    const deadline = timeoutMs > 0 ? timeoutSignal(timeoutMs, options.signal) : undefined;
    const signal = deadline?.signal ?? options.signal;

    const id = `forkd-${this.nextId++}`;
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => {
        this.pending.delete(id);
        deadline?.dispose();
        reject(withCallSite(abortError(signal as AbortSignal, `QMP ${command}`), callSite));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.pending.set(id, {
        command,
        resolve: resolve as (value: unknown) => void,
        reject,
        callSite,
        dispose: () => {
          signal?.removeEventListener("abort", onAbort);
          deadline?.dispose();
        },
      });
      const message =
        args === undefined ? { execute: command, id } : { execute: command, arguments: args, id };
      this.socket.write(`${JSON.stringify(message)}\n`);
    });
  }

  /** Resolves with the next event named `name` (and accepted by `predicate`) that arrives after this call. */
  waitEvent(name: string, options: WaitEventOptions = {}): Promise<QmpEvent> {
    const callSite = new Error();
    if (this.closeError)
      return Promise.reject(this.closedError(`cannot wait for QMP event ${name}`, callSite));
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(abortError(signal, `waiting for QMP event ${name}`));
    return new Promise<QmpEvent>((resolve, reject) => {
      const onAbort = () => {
        this.waiters.delete(waiter);
        reject(withCallSite(abortError(signal as AbortSignal, `waiting for QMP event ${name}`), callSite));
      };
      const waiter: EventWaiter = {
        name,
        predicate: options.predicate,
        resolve,
        reject,
        callSite,
        dispose: () => signal?.removeEventListener("abort", onAbort),
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.add(waiter);
    });
  }

  /** All events from now on, until the connection closes (the iterator then ends) or `signal` aborts. */
  events(options: { signal?: AbortSignal } = {}): AsyncIterableIterator<QmpEvent> {
    const queue: QmpEvent[] = [];
    let wake: (() => void) | undefined;
    let failure: Error | undefined;
    let done = this.closed;
    const onEvent = (event: QmpEvent) => {
      if (queue.length >= MAX_QUEUED_EVENTS) {
        failure = new ForkdError(
          "internal",
          `QMP event consumer fell more than ${MAX_QUEUED_EVENTS} events behind`,
        );
        finish();
        return;
      }
      queue.push(event);
      wake?.();
    };
    const onAbort = () => {
      failure = abortError(options.signal as AbortSignal, "iterating QMP events");
      finish();
    };
    const finish = () => {
      done = true;
      this.off("event", onEvent);
      this.off("close", finish);
      options.signal?.removeEventListener("abort", onAbort);
      wake?.();
    };
    this.on("event", onEvent);
    this.once("close", finish);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) onAbort();

    const iterator: AsyncIterableIterator<QmpEvent> = {
      next: async () => {
        for (;;) {
          const event = queue.shift();
          if (event) return { value: event, done: false };
          if (failure) {
            const err = failure;
            failure = undefined;
            queue.length = 0;
            throw err;
          }
          if (done) return { value: undefined, done: true };
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
          wake = undefined;
        }
      },
      return: async () => {
        finish();
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]: () => iterator,
    };
    return iterator;
  }

  /** Closes the connection; pending commands are rejected. QEMU keeps running. */
  close(): void {
    this.shutdown(new ForkdError("unavailable", "QMP connection closed by forkd"), { describe: false });
    this.socket.destroy();
  }

  private onData(chunk: Buffer): void {
    let start = 0;
    while (!this.closeError) {
      const newline = chunk.indexOf(0x0a, start);
      if (newline < 0) break;
      if (this.partialBytes + (newline - start) > MAX_QMP_LINE_BYTES) {
        this.protocolError("line too long");
        return;
      }
      this.partial.push(chunk.subarray(start, newline));
      const line = Buffer.concat(this.partial).toString("utf8").trim();
      this.partial = [];
      this.partialBytes = 0;
      start = newline + 1;
      if (line.length > 0) this.onLine(line);
    }
    if (this.closeError || start >= chunk.length) return;
    this.partialBytes += chunk.length - start;
    if (this.partialBytes > MAX_QMP_LINE_BYTES) {
      this.protocolError("line too long");
      return;
    }
    this.partial.push(chunk.subarray(start));
  }

  private parse(line: string): Record<string, unknown> | undefined {
    let message: unknown;
    try {
      message = JSON.parse(line);
    } catch {
      this.protocolError(`not JSON: ${JSON.stringify(line.slice(0, 120))}`);
      return undefined;
    }
    if (!isObject(message)) {
      this.protocolError("message is not a JSON object");
      return undefined;
    }
    if ("QMP" in message && !isObject(message.QMP)) {
      this.protocolError("malformed greeting");
      return undefined;
    }
    return message;
  }

  private onLine(line: string): void {
    const record = this.parse(line);
    if (!record) return;
    if ("QMP" in record) {
      Object.assign(this.greeting, record.QMP as unknown as QmpGreeting);
      this.onGreeting?.();
      this.onGreeting = undefined;
      return;
    }
    if (typeof record.event === "string") {
      const event: QmpEvent = {
        event: record.event,
        data: isObject(record.data) ? record.data : {},
        timestamp: isObject(record.timestamp)
          ? (record.timestamp as QmpEvent["timestamp"])
          : { seconds: 0, microseconds: 0 },
      };
      for (const waiter of [...this.waiters]) {
        if (waiter.name !== event.event) continue;
        let accepted: boolean;
        try {
          accepted = waiter.predicate ? waiter.predicate(event) : true;
        } catch (err) {
          this.waiters.delete(waiter);
          waiter.dispose();
          waiter.reject(err instanceof Error ? err : new Error(errorMessage(err)));
          continue;
        }
        if (!accepted) continue;
        this.waiters.delete(waiter);
        waiter.dispose();
        waiter.resolve(event);
      }
      this.emit("event", event);
      return;
    }
    // Replies to commands we stopped waiting for (aborted) have ids no longer in the map: dropped.
    const id = typeof record.id === "string" ? record.id : undefined;
    const call = id === undefined ? undefined : this.pending.get(id);
    if (!call || id === undefined) return;
    this.pending.delete(id);
    call.dispose();
    if ("return" in record) {
      call.resolve(record.return);
      return;
    }
    const error = isObject(record.error) ? record.error : {};
    const qmpClass = typeof error.class === "string" ? error.class : "GenericError";
    const desc = typeof error.desc === "string" ? error.desc : JSON.stringify(record).slice(0, 200);
    call.reject(withCallSite(new QmpError(call.command, qmpClass, desc), call.callSite));
  }

  private protocolError(what: string): void {
    this.shutdown(new ForkdError("internal", `QMP protocol error from QEMU: ${what}`));
    this.socket.destroy();
  }

  private shutdown(reason: ForkdError, options: { describe: boolean } = { describe: true }): void {
    if (this.shuttingDown) return;
    this.shuttingDown = true;
    this.partial = [];
    let context: string | Promise<string> = "";
    try {
      if (options.describe) context = this.describeClose?.() ?? "";
    } catch {
      // A failing description must not keep pending calls from being rejected.
    }
    const finish = (text: string) => {
      this.closeError = new ForkdError(reason.code, text ? `${reason.message} (${text})` : reason.message);
      for (const call of this.pending.values()) {
        call.dispose();
        call.reject(this.closedError(`QMP ${call.command} got no reply`, call.callSite));
      }
      this.pending.clear();
      for (const waiter of this.waiters) {
        waiter.dispose();
        waiter.reject(this.closedError(`QMP event ${waiter.name} never came`, waiter.callSite));
      }
      this.waiters.clear();
      this.emit("close", this.closeError);
    };
    if (typeof context === "string") {
      finish(context);
      return;
    }
    // The socket usually closes a moment before QEMU's exit is noticed; wait (bounded) for the real reason.
    const timeout = new Promise<string>((resolve) =>
      setTimeout(() => resolve(""), CLOSE_CONTEXT_WAIT_MS).unref(),
    );
    void Promise.race([context.catch(() => ""), timeout]).then(finish);
  }

  private closedError(what: string, callSite: Error): ForkdError {
    const base = this.closeError as ForkdError;
    return withCallSite(new ForkdError(base.code, `${what}: ${base.message}`), callSite);
  }
}

function connectUnix(socketPath: string, signal: AbortSignal): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(abortError(signal, `connecting to QMP socket ${socketPath}`));
    const socket = net.createConnection(socketPath);
    const onAbort = () => {
      socket.destroy();
      reject(abortError(signal, `connecting to QMP socket ${socketPath}`));
    };
    signal.addEventListener("abort", onAbort, { once: true });
    socket.once("connect", () => {
      signal.removeEventListener("abort", onAbort);
      socket.removeAllListeners("error");
      resolve(socket);
    });
    socket.once("error", (err: NodeJS.ErrnoException) => {
      signal.removeEventListener("abort", onAbort);
      reject(
        new ForkdError(
          "unavailable",
          `cannot connect to QMP socket ${socketPath}: ${err.code ?? err.message}`,
          {
            cause: err,
          },
        ),
      );
    });
  });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Keeps the message of `err` but the stack of the call that led to it (the socket callback's is useless). */
function withCallSite<E extends Error>(err: E, callSite: Error): E {
  const frames = callSite.stack?.split("\n").slice(1).join("\n");
  if (frames) err.stack = `${err.name}: ${err.message}\n${frames}`;
  return err;
}
