/**
 * Live capture of a running VM (BRANCH "live"): the guest is paused only while QEMU saves its device state and
 * write-protects RAM; RAM is then streamed while the guest runs. Built on QEMU's `background-snapshot`
 * migration capability (userfaultfd write-protect: a page the guest writes before it was sent is sent first,
 * with its content at the snapshot instant).
 *
 *   stop                         (our QMP `stop`: the disk freeze below must be in the same instant)
 *   whileStopped()               e.g. freezeDisk() (disk-layers.ts)
 *   migrate unix:<our socket>    QEMU: setup (dirty bitmaps, populate RAM page tables), device state into a
 *                                buffer, write-protect RAM, resume the guest (RESUME event), stream RAM, then
 *                                the buffered device state
 *   parse the stream             migration-stream.ts: pages of the "mem" RAMBlock to `sink`, device sections
 *                                to `deviceStatePath`
 *
 * Requirements, checked by experiment on QEMU 7.2 / Linux 6.18:
 * - Guest RAM must be anonymous, shmem or hugetlbfs for userfaultfd write-protect. A memory file on tmpfs
 *   (/dev/shm) works mapped either share=on or share=off; on ext4 QEMU refuses the capability ("Background-
 *   snapshot is not compatible with guest memory configuration").
 * - QEMU's setup reads one byte of every guest page to populate its page tables. On a sparse tmpfs file that
 *   allocates every hole: the memory file becomes fully allocated (256 MiB file: 132 -> 268 MB) and the first
 *   capture of a VM paid ~200 ms of pause for it; later captures of the same VM ~10 ms. Pre-allocate the memory
 *   file (or accept the first-capture cost).
 *
 * Only the pages a share=off VM has made private differ from its memory file (guest-memory.ts), so by default
 * only those reach `sink`: the pagemap is scanned right after the guest resumes, before any page is consumed
 * (a superset of the pages private at the pause: pages only ever become private, and a page that became
 * private after the pause still arrives with its content at the pause). `pages: "all"` delivers every page
 * (zero pages included), e.g. to write a flat memory image.
 *
 * The device state is saved by QEMU with run state "paused" (we stopped the VM first; QEMU's
 * global_state_store records the state at the moment). A child loading it would stay paused after the load and
 * need `cont`. By default the saved run state is rewritten to "running", so children behave like children of
 * `saveDeviceState` snapshots (that command always saves "running"): they run as soon as the load completes
 * unless started with -S. `childStartsRunning` in the result says which it is.
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import fsp from "node:fs/promises";
import type net from "node:net";
import path from "node:path";
import { abortError, raceAbort, timeoutSignal } from "../common/deadline.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { findGuestRamMapping, PAGE_SIZE, scanPrivatePages, touchPages } from "./guest-memory.js";
import {
  MigrationStreamParser,
  type MigrationStreamResult,
  readGlobalRunState,
  setGlobalRunState,
} from "./migration-stream.js";
import { DEVICE_IDS, MAX_UNIX_SOCKET_PATH_BYTES } from "./qemu-args.js";
import type { QmpClient, QmpEvent } from "./qmp.js";
import { type FileOwner, listenForOneConnection, type OneConnectionListener } from "./unix-listener.js";

/** A whole capture (RAM streamed + device state) of a few GiB guest; only bounds a stuck migration. */
export const LIVE_CAPTURE_TIMEOUT_MS = 10 * 60_000;

/**
 * QEMU rate-limits migration to 128 MiB/s by default; the stream goes to a local socket, and the guest waits
 * on every write to a not-yet-sent page, so the faster the better.
 */
export const CAPTURE_MAX_BANDWIDTH_BYTES_PER_S = 64 * 1024 ** 3;

/** Receives captured pages. `data` is only valid during the call. An index can repeat: the last one wins. */
export interface PageSink {
  page(index: number, data: Buffer): void;
}

export interface LiveCaptureOptions {
  qmp: QmpClient;
  /** The QEMU process (for its pagemap). */
  pid: number;
  /** The VM's memory file (must be on tmpfs); with `pages: "private"` it must be mapped share=off. */
  memoryFile: string;
  memoryBytes: number;
  /** A private (0700) directory for the migration socket. */
  socketDir: string;
  /** Hands the migration socket to an unprivileged QEMU's uid (it connects to it). */
  socketOwner?: FileOwner;
  /** Where the device state is written (atomically: temp name, renamed when complete). */
  deviceStatePath: string;
  sink: PageSink;
  /** Default "private". */
  pages?: "private" | "all";
  /**
   * Populate QEMU's page tables for guest RAM before the pause (`touchPages`), so QEMU's own populate in its
   * setup, which runs inside the pause when `whileStopped` is given, finds them present. Default true.
   */
  touchFirst?: boolean;
  /** Runs while the VM is stopped, before the capture starts: the disk freeze belongs here. */
  whileStopped?: () => Promise<void>;
  /** Run state saved for children; default "running" (see above). "as-saved" keeps QEMU's. */
  childRunState?: "running" | "paused" | "as-saved";
  signal?: AbortSignal;
  timeoutMs?: number;
}

export interface LiveCaptureResult {
  /** Guest paused, from QEMU's STOP to RESUME event timestamps. */
  pauseMs: number;
  /** Our `stop` call to the RESUME event arriving here: the pause as the caller sees it. */
  pauseWallMs: number;
  /** Our `stop` to migration completed and device state written. */
  totalMs: number;
  /** QEMU's own figures: setup (before the device state is saved) and downtime. */
  qemu: { setupMs: number | undefined; downtimeMs: number | undefined };
  /** Pages given to the sink, and the size of the private set they were filtered by (if any). */
  pagesCaptured: number;
  privatePagesAtScan: number | undefined;
  scanMs: number | undefined;
  /** `touchFirst`'s cost, before the pause. */
  touchMs: number | undefined;
  deviceStateBytes: number;
  /** The run state QEMU saved, and whether a child of this device state runs without `cont`. */
  savedRunState: string;
  childStartsRunning: boolean;
  stream: MigrationStreamResult["stats"];
}

/** Runs a live capture; see the module comment. The VM keeps running afterwards (unless it was paused). */
export async function captureLive(options: LiveCaptureOptions): Promise<LiveCaptureResult> {
  const { qmp } = options;
  const deadline = timeoutSignal(options.timeoutMs ?? LIVE_CAPTURE_TIMEOUT_MS, options.signal);
  const { signal } = deadline;
  const plan = planCapture(options);
  let touchMs: number | undefined;
  if (options.touchFirst ?? true) touchMs = touchPages(plan.mapping).ms;
  const status = await qmp.execute<{ status: string }>("query-status", undefined, { signal });
  const run: CaptureRun = {
    wasRunning: status.status === "running",
    stoppedByUs: false,
    migrationStarted: false,
    guestResumed: false,
    events: [],
  };
  const onEvent = (event: QmpEvent) => {
    if (event.event === "STOP" || event.event === "RESUME") run.events.push(event);
  };
  try {
    await setCaptureCapabilities(qmp, true, signal);
    run.listener = await listenForOneConnection(plan.socketPath, "migration socket", {
      owner: options.socketOwner,
    });
    qmp.on("event", onEvent);
    const started = performance.now();
    const connection = await startMigration(options, plan, run, signal);
    const pauseWallMs = performance.now() - started;
    const streamed = await streamCapture(
      options,
      plan.wantPrivate ? privatePageSet(plan.mapping) : undefined,
      {
        connection,
        signal,
      },
    );
    const stopEvent = run.events.find((e) => e.event === "STOP");
    const resumeEvent = run.events.find((e) => e.event === "RESUME");
    const pauseMs = stopEvent && resumeEvent ? eventMs(resumeEvent) - eventMs(stopEvent) : pauseWallMs;
    const { parsed, migration } = streamed;
    const deviceState = parsed.deviceState;
    const finalRunState = setChildRunState(parsed, options.childRunState ?? "running");
    await writeAtomically(plan.partial, options.deviceStatePath, deviceState);
    if (!run.wasRunning) await qmp.execute("stop", undefined, { signal });
    return {
      pauseMs,
      pauseWallMs,
      totalMs: performance.now() - started,
      qemu: { setupMs: migration["setup-time"], downtimeMs: migration.downtime },
      pagesCaptured: streamed.pagesCaptured,
      privatePagesAtScan: streamed.privatePages?.count,
      scanMs: streamed.privatePages?.scanMs,
      touchMs,
      deviceStateBytes: deviceState.length,
      savedRunState: parsed.savedRunState,
      childStartsRunning: finalRunState === "running",
      stream: parsed.stats,
    };
  } catch (err) {
    await recoverFromFailedCapture(qmp, run, plan.partial);
    throw err instanceof ForkdError
      ? err
      : new ForkdError("internal", `live capture failed: ${errorMessage(err)}`);
  } finally {
    qmp.off("event", onEvent);
    run.listener?.close();
    run.connection?.destroy();
    await fsp.rm(plan.socketPath, { force: true });
    await setCaptureCapabilities(qmp, false).catch(() => {});
    deadline.dispose();
  }
}

/** What a capture works with, settled (and checked) before anything is asked of QEMU. */
interface CapturePlan {
  socketPath: string;
  wantPrivate: boolean;
  mapping: ReturnType<typeof findGuestRamMapping>;
  /** The device state's temporary name, renamed to `deviceStatePath` when complete. */
  partial: string;
}

/** Where a capture stands, for the clean-up after a failure. */
interface CaptureRun {
  wasRunning: boolean;
  stoppedByUs: boolean;
  migrationStarted: boolean;
  guestResumed: boolean;
  listener?: OneConnectionListener;
  connection?: net.Socket;
  /** QEMU's STOP and RESUME events during the capture (their timestamps measure the pause). */
  events: QmpEvent[];
}

function planCapture(options: LiveCaptureOptions): CapturePlan {
  const socketPath = path.join(options.socketDir, `migrate-${randomBytes(4).toString("hex")}.sock`);
  if (Buffer.byteLength(socketPath) > MAX_UNIX_SOCKET_PATH_BYTES) {
    throw new ForkdError("invalid_argument", `socket path ${socketPath} is too long for a unix socket`);
  }
  const wantPrivate = (options.pages ?? "private") === "private";
  const mapping = findGuestRamMapping(options.pid, options.memoryFile, {
    expectedBytes: options.memoryBytes,
  });
  if (wantPrivate && !mapping.private) {
    throw new ForkdError(
      "invalid_argument",
      "capturing only private pages needs a share=off VM (a share=on VM writes into its memory file)",
    );
  }
  const partial = path.join(
    path.dirname(options.deviceStatePath),
    `.${path.basename(options.deviceStatePath)}.${randomBytes(4).toString("hex")}.partial`,
  );
  return { socketPath, wantPrivate, mapping, partial };
}

/**
 * Stops the VM if there is work for the pause, runs it, starts the migration and waits until QEMU has resumed
 * the guest on write-protected RAM. Returns QEMU's connection to the migration socket, paused.
 */
async function startMigration(
  options: LiveCaptureOptions,
  plan: CapturePlan,
  run: CaptureRun,
  signal: AbortSignal,
): Promise<net.Socket> {
  const { qmp } = options;
  const listener = run.listener as OneConnectionListener;
  const resumed = qmp.waitEvent("RESUME", { signal });
  resumed.catch(() => {});
  // Without work to do in the pause, QEMU's own stop (after its setup) is the only pause.
  if (run.wasRunning && options.whileStopped) {
    await qmp.execute("stop", undefined, { signal });
    run.stoppedByUs = true;
  }
  if (options.whileStopped) await options.whileStopped();
  await qmp.execute("migrate", { uri: `unix:${plan.socketPath}` }, { signal });
  run.migrationStarted = true;
  const connection = await raceAbort(
    listener.connection,
    signal,
    "waiting for QEMU to connect the migration",
  );
  run.connection = connection;
  // Nothing is read until the private set is known (QEMU buffers; the guest waits only on protected pages).
  connection.pause();

  // QEMU resumes the guest itself once RAM is write-protected (also if it was paused: it always does).
  await raceAbort(resumed, signal, "waiting for QEMU to resume the guest");
  run.stoppedByUs = false;
  run.guestResumed = true;
  return connection;
}

/** The pages private to the VM, scanned right after the guest resumed (see the module comment). */
interface PrivatePages {
  set: Uint8Array;
  count: number;
  scanMs: number;
}

function privatePageSet(mapping: CapturePlan["mapping"]): PrivatePages {
  const scan = scanPrivatePages(mapping);
  const set = new Uint8Array(mapping.length / PAGE_SIZE);
  for (const index of scan.pages) set[index] = 1;
  return { set, count: scan.pages.length, scanMs: scan.ms };
}

/**
 * Reads the migration stream to its end, giving RAM pages (those in `privatePages`, if given) to the sink, and
 * waits for QEMU to finish its side.
 */
async function streamCapture(
  options: LiveCaptureOptions,
  privatePages: PrivatePages | undefined,
  stream: { connection: net.Socket; signal: AbortSignal },
): Promise<{
  parsed: MigrationStreamResult;
  migration: MigrationInfo;
  pagesCaptured: number;
  privatePages: PrivatePages | undefined;
}> {
  let pagesCaptured = 0;
  const parser = new MigrationStreamParser({
    ramBlock: DEVICE_IDS.memoryBackend,
    onRamBlocks: (blocks) => {
      const block = blocks.find((b) => b.idstr === DEVICE_IDS.memoryBackend);
      if (block && block.length !== options.memoryBytes) {
        throw new ForkdError(
          "internal",
          `migration stream: RAM block ${block.idstr} has ${block.length} bytes, expected ${options.memoryBytes}`,
        );
      }
    },
    onPage: (index, data) => {
      if (privatePages && !privatePages.set[index]) return;
      pagesCaptured++;
      options.sink.page(index, data);
    },
  });
  // From here on the guest runs on write-protected RAM: the stream must be read to its end whatever happens
  // (see drainToEnd), and QEMU must finish its side, which removes the protection.
  const failure = await drainToEnd(stream.connection, parser, stream.signal);
  const drain = timeoutSignal(DRAIN_TIMEOUT_MS);
  let migration: MigrationInfo;
  try {
    migration = await waitMigrationDone(options.qmp, drain.signal);
  } finally {
    drain.dispose();
  }
  if (failure) throw failure;
  return { parsed: parser.finish(), migration, pagesCaptured, privatePages };
}

/** Rewrites the saved run state for children unless "as-saved"; returns the run state a child will load. */
function setChildRunState(
  parsed: MigrationStreamResult,
  childRunState: NonNullable<LiveCaptureOptions["childRunState"]>,
): string {
  if (childRunState !== "as-saved" && parsed.savedRunState !== childRunState) {
    setGlobalRunState(parsed.deviceState, childRunState);
  }
  return readGlobalRunState(parsed.deviceState).runState;
}

/** After a failed capture: the source keeps running, no partial device state stays. */
async function recoverFromFailedCapture(qmp: QmpClient, run: CaptureRun, partial: string): Promise<void> {
  run.connection?.destroy();
  // Cancelling once the guest runs on protected RAM would wedge it (see drainToEnd); by then the migration
  // has ended anyway.
  if (run.migrationStarted && !run.guestResumed) await qmp.execute("migrate_cancel").catch(() => {});
  // The source must keep running whatever happened to the capture.
  if (run.stoppedByUs || run.wasRunning) {
    const now = await qmp.execute<{ status: string }>("query-status").catch(() => undefined);
    if (now?.status === "paused") await qmp.execute("cont").catch(() => {});
  }
  await fsp.rm(partial, { force: true });
}

/**
 * Capabilities that change the stream's format, turned off for a capture. Only those this QEMU has are named:
 * "compress" is gone since QEMU 9.1, "mapped-ram" (9.0) writes a file layout, not a stream.
 */
const FORMAT_CHANGING_CAPABILITIES = [
  "xbzrle",
  "compress",
  "x-ignore-shared",
  "postcopy-ram",
  "multifd",
  "mapped-ram",
] as const;

/** Turns background-snapshot on (with the capabilities that change the stream format off) or off again. */
async function setCaptureCapabilities(qmp: QmpClient, on: boolean, signal?: AbortSignal): Promise<void> {
  let capabilities = [{ capability: "background-snapshot", state: false }];
  if (on) {
    const known = new Set(
      (await qmp.execute<{ capability: string }[]>("query-migrate-capabilities", undefined, { signal })).map(
        (c) => c.capability,
      ),
    );
    capabilities = [
      ...FORMAT_CHANGING_CAPABILITIES.filter((c) => known.has(c)).map((capability) => ({
        capability,
        state: false,
      })),
      { capability: "background-snapshot", state: true },
    ];
  }
  try {
    await qmp.execute("migrate-set-capabilities", { capabilities }, { signal });
  } catch (err) {
    if (on) {
      throw new ForkdError(
        "unavailable",
        `QEMU refused background-snapshot (${errorMessage(err)}); live capture needs guest RAM on tmpfs`,
        { cause: err },
      );
    }
    throw err;
  }
  if (on) {
    await qmp.execute(
      "migrate-set-parameters",
      { "max-bandwidth": CAPTURE_MAX_BANDWIDTH_BYTES_PER_S },
      { signal },
    );
  }
}

interface MigrationInfo {
  status?: string;
  "error-desc"?: string;
  "setup-time"?: number;
  downtime?: number;
}

/** Polls query-migrate until completed (or failed/cancelled, which throws). */
async function waitMigrationDone(qmp: QmpClient, signal: AbortSignal): Promise<MigrationInfo> {
  for (;;) {
    const info = await qmp.execute<MigrationInfo>("query-migrate", undefined, { signal });
    if (info.status === "completed") return info;
    if (info.status === "failed" || info.status === "cancelled") {
      throw new ForkdError(
        "internal",
        `QEMU's background snapshot ${info.status}: ${info["error-desc"] ?? "no reason given"}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
    if (signal.aborted) throw abortError(signal, "waiting for the background snapshot to complete");
  }
}

/**
 * How long the stream is still read after a failure or cancellation. Never closing the socket early matters:
 * on QEMU 7.2 a background snapshot that fails while the guest runs leaves RAM write-protected, and the next
 * guest (or device-emulation) write to a protected page blocks forever, main loop included, because the cleanup
 * that removes the protection runs in that main loop. Observed: a capture whose consumer closed the socket
 * midway left the source with QMP unresponsive and the guest frozen. Discarding the rest of the stream lets QEMU
 * complete normally; this bounds only a QEMU that stops sending.
 */
export const DRAIN_TIMEOUT_MS = 120_000;

/**
 * Feeds the socket into the parser until QEMU closes it. A parser or sink error, or an abort, does not stop the
 * reading: the rest is discarded (see DRAIN_TIMEOUT_MS) and the first failure is returned at the end.
 */
function drainToEnd(
  socket: net.Socket,
  parser: MigrationStreamParser,
  signal: AbortSignal,
): Promise<unknown | undefined> {
  return new Promise((resolve) => {
    let failure: unknown;
    let drainTimer: NodeJS.Timeout | undefined;
    const fail = (err: unknown) => {
      if (failure !== undefined) return;
      failure = err;
      drainTimer = setTimeout(() => {
        failure = new ForkdError(
          "internal",
          `${errorMessage(err)}; QEMU did not finish the stream within ${DRAIN_TIMEOUT_MS} ms of it, the source VM ` +
            "may be left stuck on write-protected memory",
        );
        socket.destroy();
      }, DRAIN_TIMEOUT_MS);
    };
    const onData = (chunk: Buffer) => {
      if (failure !== undefined) return;
      try {
        parser.push(chunk);
      } catch (err) {
        fail(err);
      }
    };
    const onAbort = () => fail(abortError(signal, "live capture"));
    const finish = () => {
      clearTimeout(drainTimer);
      signal.removeEventListener("abort", onAbort);
      socket.off("data", onData);
      resolve(failure);
    };
    socket.on("data", onData);
    socket.once("close", finish);
    socket.on("error", (err) => fail(new ForkdError("internal", `migration socket: ${err.message}`)));
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
    socket.resume();
  });
}

function eventMs(event: QmpEvent): number {
  return event.timestamp.seconds * 1000 + event.timestamp.microseconds / 1000;
}

async function writeAtomically(partial: string, target: string, data: Buffer): Promise<void> {
  const handle = await fsp.open(partial, "wx", 0o600);
  try {
    await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
  }
  await fsp.rename(partial, target);
}

/** Collects captured pages in memory, last write wins per page. For tests and small captures. */
export class MemoryPageSink implements PageSink {
  private readonly slots = new Map<number, number>();
  private chunks: Buffer[] = [];
  private current = Buffer.allocUnsafe(0);
  private used = 0;
  private order: number[] = [];

  page(index: number, data: Buffer): void {
    const slot = this.slots.get(index);
    if (slot !== undefined) {
      this.slotView(slot).set(data.subarray(0, PAGE_SIZE));
      return;
    }
    if (this.used + PAGE_SIZE > this.current.length) {
      this.current = Buffer.allocUnsafe(PAGE_SIZE * 1024);
      this.chunks.push(this.current);
      this.used = 0;
    }
    data.copy(this.current, this.used, 0, PAGE_SIZE);
    this.used += PAGE_SIZE;
    this.slots.set(index, this.order.length);
    this.order.push(index);
  }

  get count(): number {
    return this.order.length;
  }

  /** Page indices and their data packed in the same order, ready for `writePages`. */
  take(): { pages: Uint32Array; data: Buffer } {
    const data = Buffer.concat(
      this.chunks.map((c, i) => (i === this.chunks.length - 1 ? c.subarray(0, this.used) : c)),
    );
    return { pages: Uint32Array.from(this.order), data };
  }

  private slotView(slot: number): Buffer {
    const chunk = this.chunks[Math.floor(slot / 1024)] as Buffer;
    const offset = (slot % 1024) * PAGE_SIZE;
    return chunk.subarray(offset, offset + PAGE_SIZE);
  }
}

/**
 * Writes captured pages to a file, packed in arrival order (a repeated page overwrites its slot), in 1 MiB
 * writes. `finish()` returns the page index of every slot: the file plus that index are a diff layer
 * (`writePagesFromFile` restores it).
 */
export class PageFileSink implements PageSink {
  private readonly fd: number;
  private readonly slots = new Map<number, number>();
  private readonly order: number[] = [];
  private readonly buffer = Buffer.allocUnsafe(256 * PAGE_SIZE);
  private buffered = 0;
  /** Slot number of buffer[0]. */
  private bufferSlot = 0;
  private closed = false;

  constructor(readonly file: string) {
    this.fd = fs.openSync(file, "wx", 0o600);
  }

  page(index: number, data: Buffer): void {
    const slot = this.slots.get(index);
    if (slot !== undefined) {
      if (slot >= this.bufferSlot) data.copy(this.buffer, (slot - this.bufferSlot) * PAGE_SIZE, 0, PAGE_SIZE);
      else fs.writeSync(this.fd, data, 0, PAGE_SIZE, slot * PAGE_SIZE);
      return;
    }
    if (this.buffered === this.buffer.length) this.flush();
    data.copy(this.buffer, this.buffered, 0, PAGE_SIZE);
    this.buffered += PAGE_SIZE;
    this.slots.set(index, this.order.length);
    this.order.push(index);
  }

  /** Flushes, fsyncs and closes the file; returns the page index of each slot. */
  finish(): Uint32Array {
    this.flush();
    fs.fsyncSync(this.fd);
    this.close();
    return Uint32Array.from(this.order);
  }

  /** Closes without finishing (after a failed capture; the caller removes the file). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    fs.closeSync(this.fd);
  }

  private flush(): void {
    let done = 0;
    while (done < this.buffered) {
      done += fs.writeSync(
        this.fd,
        this.buffer,
        done,
        this.buffered - done,
        this.bufferSlot * PAGE_SIZE + done,
      );
    }
    this.bufferSlot += this.buffered / PAGE_SIZE;
    this.buffered = 0;
  }
}
