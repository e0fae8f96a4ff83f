/**
 * The agent's dispatcher: decodes frames from the transport, validates them, runs each request as a call
 * multiplexed by id, and answers. A malformed or hostile frame gets an error response (when it carries a
 * usable id) or is logged and dropped; nothing the host sends can stop the agent.
 */
import { errorMessage, ForkdError } from "../../common/errors.js";
import {
  boundMessage,
  encodeFrame,
  type Frame,
  FrameDecoder,
  type HelloHeader,
  type InputHeader,
  isOpName,
  MAX_ID,
  MAX_IN_FLIGHT,
  OPS,
  type OpArgs,
  type OpName,
  type OpResult,
  opValidators,
  parseHostMessage,
  RESULT_IN_BODY_THRESHOLD,
  type RequestHeader,
  type WireError,
} from "../protocol/index.js";
import type { CallContext, OpOutcome } from "./call.js";
import type { AgentLog } from "./log.js";
import { TRANSPORT_HIGH_WATER_BYTES, type Transport } from "./transport.js";

export type OpHandlers = {
  [O in OpName]: (args: OpArgs<O>, body: Buffer, ctx: CallContext) => Promise<OpOutcome<OpResult<O>>>;
};

export interface AgentServerOptions {
  transport: Transport;
  handlers: OpHandlers;
  /** The hello to announce, built fresh each time (the warm state and sandbox id change). */
  hello: () => HelloHeader;
  log: AgentLog;
  /** The transport's input ended for good (stdio EOF). */
  onEnd: () => void;
}

interface Call {
  id: number;
  op: OpName;
  controller: AbortController;
  /** Set once answered or orphaned: later output for this call is dropped. */
  closed: boolean;
  /** A priming call the agent runs itself: everything is encoded, nothing is sent. */
  silent: boolean;
  inputHandler?: (chunk: Buffer, eof: boolean) => void;
  pendingInput: { chunk: Buffer; eof: boolean }[];
}

function toWireError(err: unknown): WireError {
  if (err instanceof ForkdError) return { code: err.code, message: boundMessage(err.message) };
  return { code: "internal", message: boundMessage(errorMessage(err)) };
}

export class AgentServer {
  private readonly options: AgentServerOptions;
  private readonly decoder: FrameDecoder;
  private readonly calls = new Map<number, Call>();

  constructor(options: AgentServerOptions) {
    this.options = options;
    this.decoder = new FrameDecoder({
      onFrame: (frame) => this.onFrame(frame),
      onError: (err) =>
        this.options.log.warn("skipping undecodable input", { reason: err.reason, error: err.message }),
    });
  }

  get inFlight(): number {
    return this.calls.size;
  }

  start(): void {
    this.options.transport.start({
      data: (chunk) => this.decoder.push(chunk),
      disconnect: () => this.onDisconnect(),
      end: () => {
        this.abortAll("the host closed the channel");
        this.options.onEnd();
      },
    });
    this.sendHello();
  }

  sendHello(): void {
    this.send(this.options.hello());
  }

  /** Cancels every running call (their processes are killed; their answers will not be sent). */
  abortAll(reason: string): void {
    for (const call of this.calls.values()) {
      call.closed = true;
      call.controller.abort(new ForkdError("unavailable", reason));
    }
    this.calls.clear();
  }

  private onDisconnect(): void {
    this.options.log.info("host disconnected; waiting for the next one", { cancelledCalls: this.calls.size });
    this.decoder.reset();
    // Nobody is left to receive these calls' answers, and a new host may reuse their ids.
    this.abortAll("the host disconnected");
    this.sendHello();
  }

  private onFrame(frame: Frame): void {
    let message: ReturnType<typeof parseHostMessage>;
    try {
      message = parseHostMessage(frame);
    } catch (err) {
      const id = frame.header.id;
      const usableId =
        frame.header.t === "req" && Number.isInteger(id) && (id as number) >= 1 && (id as number) <= MAX_ID;
      if (usableId && !this.calls.has(id as number)) this.sendError(id as number, err);
      else
        this.options.log.warn("dropped an invalid frame", {
          t: frame.header.t.slice(0, 16),
          error: errorMessage(err),
        });
      return;
    }
    switch (message.t) {
      case "req":
        this.startCall(message, frame.body);
        return;
      case "in":
        this.deliverInput(message, frame.body);
        return;
      case "cancel": {
        const call = this.calls.get(message.id);
        call?.controller.abort(new ForkdError("unavailable", `call ${message.id} was cancelled by the host`));
        return;
      }
    }
  }

  /**
   * Runs one request through the whole path (decode, validation, handler, encoding) without sending anything.
   * The agent does this before its parent VM is snapshotted, so that children, which all start from that
   * memory, do not each pay for first-time compilation of these paths (measured under TCG: the first ping
   * took 260 ms, later ones 13 ms).
   */
  prime(op: string, args: unknown, body: Buffer = Buffer.alloc(0)): Promise<void> {
    const frames: Frame[] = [];
    const decoder = new FrameDecoder({ onFrame: (frame) => frames.push(frame), onError: () => {} });
    decoder.push(encodeFrame({ t: "req", id: MAX_ID, op, args }, body));
    const frame = frames[0];
    const message = frame === undefined ? undefined : parseHostMessage(frame);
    if (frame === undefined || message?.t !== "req")
      return Promise.reject(new Error(`priming ${op}: bad frame`));
    return this.runCall(message, frame.body, true);
  }

  private startCall(request: RequestHeader, body: Buffer): void {
    const { id } = request;
    if (this.calls.has(id)) {
      this.options.log.warn("dropped a request reusing the id of a running call", { id, op: request.op });
      return;
    }
    if (this.calls.size >= MAX_IN_FLIGHT) {
      this.sendError(
        id,
        new ForkdError("too_many_requests", `the agent already runs ${MAX_IN_FLIGHT} calls`),
      );
      return;
    }
    void this.runCall(request, body, false);
  }

  /** Validates and runs a call; resolves once it has been answered. */
  private runCall(request: RequestHeader, body: Buffer, silent: boolean): Promise<void> {
    const { id, op } = request;
    if (!isOpName(op)) {
      this.sendError(id, new ForkdError("not_implemented", `unknown op ${JSON.stringify(op)}`), silent);
      return Promise.resolve();
    }
    let args: unknown;
    try {
      args = opValidators[op].args.assert(request.args ?? {}, `${op} arguments`);
      if (OPS[op].requestBody === "none" && body.length > 0) {
        throw new ForkdError("invalid_argument", `${op} takes no request body (got ${body.length} bytes)`);
      }
    } catch (err) {
      this.sendError(id, err, silent);
      return Promise.resolve();
    }
    const call: Call = { id, op, controller: new AbortController(), closed: false, silent, pendingInput: [] };
    // Priming calls stay out of the table: host ids must never collide with them.
    if (!silent) this.calls.set(id, call);
    const handler = this.options.handlers[op] as (
      a: unknown,
      b: Buffer,
      c: CallContext,
    ) => Promise<OpOutcome<unknown>>;
    let outcome: Promise<OpOutcome<unknown>>;
    try {
      outcome = handler(args, body, this.context(call));
    } catch (err) {
      outcome = Promise.reject(err);
    }
    return outcome.then(
      (result) => this.finish(call, () => this.sendResult(call, result)),
      (err) => this.finish(call, () => this.sendError(id, err, silent)),
    );
  }

  private finish(call: Call, answer: () => void): void {
    if (call.closed) return;
    call.closed = true;
    if (!call.silent) this.calls.delete(call.id);
    answer();
  }

  private context(call: Call): CallContext {
    const transport = this.options.transport;
    return {
      id: call.id,
      signal: call.controller.signal,
      emit: (ev, chunk) => {
        if (!call.closed) this.send({ t: "evt", id: call.id, ev }, chunk, call.silent);
      },
      ackInput: (bytes) => {
        if (!call.closed)
          this.send({ t: "evt", id: call.id, ev: "stdin_ack", bytes }, undefined, call.silent);
      },
      onInput: (handler) => {
        call.inputHandler = handler;
        const pending = call.pendingInput;
        call.pendingInput = [];
        for (const input of pending) handler(input.chunk, input.eof);
      },
      congested: () => transport.pendingBytes > TRANSPORT_HIGH_WATER_BYTES,
      whenDrained: (callback) => transport.onDrain(callback),
    };
  }

  private deliverInput(message: InputHeader, body: Buffer): void {
    const call = this.calls.get(message.id);
    if (call === undefined) return; // the call may have just finished; its stdin no longer matters
    if (!OPS[call.op].input) {
      this.options.log.warn("dropped input for a call that takes none", { id: call.id, op: call.op });
      return;
    }
    const eof = message.eof === true;
    if (call.inputHandler) call.inputHandler(body, eof);
    else call.pendingInput.push({ chunk: body, eof });
  }

  private sendResult(call: Call, outcome: OpOutcome<unknown>): void {
    try {
      if (OPS[call.op].responseBody === "bytes") {
        this.send({ t: "res", id: call.id, ok: true, result: outcome.result }, outcome.body, call.silent);
        return;
      }
      const json = JSON.stringify(outcome.result ?? {});
      if (json.length > RESULT_IN_BODY_THRESHOLD) {
        const header = { t: "res", id: call.id, ok: true, result_in_body: true };
        this.send(header, Buffer.from(json, "utf8"), call.silent);
      } else {
        this.send({ t: "res", id: call.id, ok: true, result: outcome.result ?? {} }, undefined, call.silent);
      }
    } catch (err) {
      this.sendError(call.id, err, call.silent);
    }
  }

  private sendError(id: number, err: unknown, silent = false): void {
    this.send({ t: "res", id, ok: false, error: toWireError(err) }, undefined, silent);
  }

  /** Encodes always (priming exercises the encoder too); hands the frame to the transport unless silent. */
  private send(header: object, body?: Buffer, silent = false): void {
    let frame: Buffer;
    try {
      frame = encodeFrame(header, body);
    } catch (err) {
      this.options.log.error("cannot encode a frame", { error: errorMessage(err) });
      const id = (header as { id?: unknown }).id;
      if (!silent && typeof id === "number" && (header as { t?: unknown }).t === "res") {
        this.options.transport.send(encodeFrame({ t: "res", id, ok: false, error: toWireError(err) }));
      }
      return;
    }
    if (!silent) this.options.transport.send(frame);
  }
}
