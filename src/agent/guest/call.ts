/** What an op handler sees of its call: cancellation, output events, stdin input and flow control. */
import type { EventKind } from "../protocol/index.js";

export interface CallContext {
  readonly id: number;
  /** Aborted when the host cancels the call, the host disconnects, or the agent shuts down. */
  readonly signal: AbortSignal;
  /** Sends an output event (dropped once the call has been answered). */
  emit(ev: Exclude<EventKind, "stdin_ack">, chunk: Buffer): void;
  /** Tells the host that `bytes` of its stdin were consumed, reopening its send window. */
  ackInput(bytes: number): void;
  /** Receives `in` frames; input that arrived before the handler was set is delivered at once. */
  onInput(handler: (chunk: Buffer, eof: boolean) => void): void;
  /** True while so much output is queued for the host that producers should pause. */
  congested(): boolean;
  /** Calls `callback` once the queued output has been written. */
  whenDrained(callback: () => void): void;
}

/** A handler's answer: the result JSON, plus the binary body for ops whose responses carry one. */
export interface OpOutcome<R> {
  result: R;
  body?: Buffer;
}
