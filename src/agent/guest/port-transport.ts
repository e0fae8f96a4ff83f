/**
 * The virtio-serial port as a transport. Node cannot poll a character device (libuv treats it as a file), so
 * reads and writes are blocking fs calls on the threadpool: one read is always outstanding, one write at most.
 *
 * What the port does (Linux virtio_console): read() blocks while the host is connected and idle, and returns 0
 * while no host is connected; write() blocks until a host is connected and takes at most 32 KiB per call.
 * So a hello queued after a disconnect goes out exactly when the next host connects, even if it sends nothing.
 */
import fs from "node:fs";
import path from "node:path";
import { errorMessage } from "../../common/errors.js";
import type { AgentLog } from "./log.js";
import type { Transport, TransportEvents } from "./transport.js";

export const AGENT_PORT_NAME = "org.forkd.agent";
const VIRTIO_PORTS_DIR = "/sys/class/virtio-ports";

const READ_BUFFER_BYTES = 64 * 1024;
/** Polling while no host is connected: fast at first (a restored child reconnects within ms), then cheap. */
const IDLE_BACKOFF_MIN_MS = 5;
const IDLE_BACKOFF_MAX_MS = 200;
const ERROR_BACKOFF_MS = 200;

/** Finds /dev/<vportNpM> whose sysfs name is `name`, or null. */
export function findPortDevice(name: string, sysDir = VIRTIO_PORTS_DIR): string | null {
  let entries: string[];
  try {
    entries = fs.readdirSync(sysDir);
  } catch {
    return null;
  }
  for (const entry of entries) {
    try {
      if (fs.readFileSync(path.join(sysDir, entry, "name"), "utf8").trim() === name) return `/dev/${entry}`;
    } catch {
      // A port without a name attribute is not ours.
    }
  }
  return null;
}

export class PortTransport implements Transport {
  private readonly fd: number;
  private readonly log: AgentLog;
  private events: TransportEvents | undefined;
  private readonly readBuffer = Buffer.allocUnsafe(READ_BUFFER_BYTES);
  private idleBackoffMs = IDLE_BACKOFF_MIN_MS;
  /** Whether a host has been seen (data read or a write accepted) since the last disconnect. */
  private hostSeen = false;
  private queue: Buffer[] = [];
  private queuedBytes = 0;
  private writing = false;
  /** Bumped on disconnect so a write completing afterwards does not touch the new queue. */
  private generation = 0;
  private drainWaiters: (() => void)[] = [];

  /** Opens the device (libuv opens with O_CLOEXEC, so exec'd processes never inherit it). */
  constructor(device: string, log: AgentLog) {
    this.fd = fs.openSync(device, "r+");
    this.log = log;
  }

  get pendingBytes(): number {
    return this.queuedBytes;
  }

  start(events: TransportEvents): void {
    this.events = events;
    this.readLoop();
  }

  send(frame: Buffer): void {
    this.queue.push(frame);
    this.queuedBytes += frame.length;
    if (!this.writing) this.pump();
  }

  onDrain(callback: () => void): void {
    if (this.queuedBytes === 0) {
      callback();
      return;
    }
    this.drainWaiters.push(callback);
  }

  private readLoop(): void {
    fs.read(this.fd, this.readBuffer, 0, READ_BUFFER_BYTES, null, (err, n) => {
      if (err) {
        this.log.warn("agent port read failed", { error: errorMessage(err) });
        setTimeout(() => this.readLoop(), ERROR_BACKOFF_MS);
        return;
      }
      if (n === 0) {
        if (this.hostSeen) this.hostGone();
        setTimeout(() => this.readLoop(), this.idleBackoffMs);
        this.idleBackoffMs = Math.min(this.idleBackoffMs * 2, IDLE_BACKOFF_MAX_MS);
        return;
      }
      this.hostSeen = true;
      this.idleBackoffMs = IDLE_BACKOFF_MIN_MS;
      this.events?.data(Buffer.from(this.readBuffer.subarray(0, n)));
      this.readLoop();
    });
  }

  private hostGone(): void {
    this.hostSeen = false;
    this.generation++;
    // Output meant for the old host is dropped; a write already inside the kernel may still reach the next
    // host as a cut frame, which its decoder skips by resynchronising on the magic.
    // A blocked write stays in flight (`writing`); the next frames wait behind it so they cannot interleave.
    this.queue = [];
    this.queuedBytes = 0;
    this.flushDrainWaiters();
    this.events?.disconnect();
  }

  private pump(): void {
    const head = this.queue[0];
    if (head === undefined) {
      this.writing = false;
      this.flushDrainWaiters();
      return;
    }
    this.writing = true;
    const generation = this.generation;
    fs.write(this.fd, head, 0, head.length, null, (err, written) => {
      if (generation !== this.generation) {
        // The host changed while this write was blocked: carry on with the new host's queue.
        this.pump();
        return;
      }
      if (err) {
        this.log.warn("agent port write failed", { error: errorMessage(err) });
        setTimeout(() => this.pump(), ERROR_BACKOFF_MS);
        return;
      }
      this.hostSeen = true;
      this.queuedBytes -= written;
      if (written >= head.length) this.queue.shift();
      else this.queue[0] = head.subarray(written);
      this.pump();
    });
  }

  private flushDrainWaiters(): void {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const waiter of waiters) waiter();
  }
}
