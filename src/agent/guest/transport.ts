/**
 * The byte stream the agent speaks the protocol on. In a guest it is the virtio-serial port
 * (port-transport.ts); with --stdio it is the process's stdin/stdout, so host tests can run the agent as a
 * plain child process.
 */
export interface TransportEvents {
  data(chunk: Buffer): void;
  /** The host went away: partial input is meaningless and unsent output was dropped. It may come back. */
  disconnect(): void;
  /** Input ended for good (stdin EOF): the agent should shut down. */
  end(): void;
}

export interface Transport {
  start(events: TransportEvents): void;
  /** Queues one whole frame for writing. */
  send(frame: Buffer): void;
  /** Bytes queued and not yet written: producers pause above a high-water mark. */
  readonly pendingBytes: number;
  /** Calls `callback` once, when pendingBytes falls to zero (at once if it already is). */
  onDrain(callback: () => void): void;
}

/** Output producers (exec) pause while more than this is queued for the host. */
export const TRANSPORT_HIGH_WATER_BYTES = 4 * 1024 * 1024;

export class StdioTransport implements Transport {
  private drainWaiters: (() => void)[] = [];

  get pendingBytes(): number {
    return process.stdout.writableLength;
  }

  start(events: TransportEvents): void {
    process.stdin.on("data", (chunk: Buffer) => events.data(chunk));
    process.stdin.on("end", () => events.end());
    process.stdin.on("error", () => events.end());
    process.stdout.on("error", () => events.end());
    process.stdout.on("drain", () => this.flushWaiters());
  }

  send(frame: Buffer): void {
    process.stdout.write(frame);
  }

  onDrain(callback: () => void): void {
    if (this.pendingBytes === 0) {
      callback();
      return;
    }
    this.drainWaiters.push(callback);
  }

  private flushWaiters(): void {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const waiter of waiters) waiter();
  }
}
