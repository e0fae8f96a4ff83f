/**
 * Stop-and-copy capture of a running share=off VM (BRANCH "diff" where live capture is unavailable, e.g. a
 * memory file on ext4): stop, [freeze the disk], save the device state, scan the pagemap, copy the private
 * pages out with process_vm_readv, resume. The pause grows with the pages the VM has written (~3 GB/s into a
 * reused destination on our loaded host, a third of that into a fresh one); live-capture.ts does not.
 *
 * The device state comes from `xen-save-devices-state`, which saves run state "running": a child runs as soon as
 * its load completes. A child needs the pages in RAM BEFORE it loads that state (page-restore.ts).
 */
import { ForkdError } from "../common/errors.js";
import { findGuestRamMapping, PAGE_SIZE, readPages, scanPrivatePages } from "./guest-memory.js";
import type { QmpClient } from "./qmp.js";
import { type QemuFileDrop, qemuWrittenFile } from "./snapshot.js";

export interface StoppedCaptureOptions {
  qmp: QmpClient;
  pid: number;
  memoryFile: string;
  memoryBytes: number;
  /** Written atomically (temp name in the same directory, renamed once complete). */
  deviceStatePath: string;
  /** Where a QEMU that cannot reach `deviceStatePath`'s directory writes it first (see snapshot.ts). */
  deviceStateDrop?: QemuFileDrop;
  /** Runs while the VM is stopped, before the device state is saved: the disk freeze belongs here. */
  whileStopped?: () => Promise<void>;
  /**
   * Destination for the pages, reused across captures (touched memory avoids a page fault per destination
   * page inside the pause). Replaced by a larger fresh buffer when too small.
   */
  buffer?: Buffer;
  /**
   * Leave the VM stopped after a successful capture (a pause: the caller kills it once the state is safe). After
   * a failure it runs again either way.
   */
  leaveStopped?: boolean;
  signal?: AbortSignal;
}

export interface StoppedCapture {
  /** Private page indices, ascending, and their data packed in that order (a view of the buffer used). */
  pages: Uint32Array;
  data: Buffer;
  /** The buffer the data lives in: pass it back as `buffer` next time. */
  buffer: Buffer;
  /** Our `stop` to our `cont` returning (to the end of the copy with `leaveStopped`). */
  pauseMs: number;
  stateMs: number;
  scanMs: number;
  copyMs: number;
  deviceStateBytes: number;
}

export async function captureStopped(options: StoppedCaptureOptions): Promise<StoppedCapture> {
  const { qmp, signal } = options;
  const mapping = findGuestRamMapping(options.pid, options.memoryFile, {
    expectedBytes: options.memoryBytes,
  });
  if (!mapping.private) {
    throw new ForkdError("invalid_argument", "a stop-and-copy diff needs a share=off VM");
  }
  const out = await qemuWrittenFile(options.deviceStatePath, options.deviceStateDrop);
  const wasRunning =
    (await qmp.execute<{ status: string }>("query-status", undefined, { signal })).status === "running";
  const started = performance.now();
  let resumed = !wasRunning;
  try {
    if (wasRunning) await qmp.execute("stop", undefined, { signal });
    if (options.whileStopped) await options.whileStopped();
    const stateStarted = performance.now();
    // live:false is about Xen's log-dirty mode; with the VM stopped the state is one instant.
    await qmp.execute("xen-save-devices-state", { filename: out.path, live: false }, { signal });
    const stateMs = performance.now() - stateStarted;
    const scan = scanPrivatePages(mapping);
    const bytes = scan.pages.length * PAGE_SIZE;
    const buffer =
      options.buffer && options.buffer.length >= bytes ? options.buffer : Buffer.allocUnsafe(bytes);
    const copy = readPages(mapping, scan.pages, buffer);
    if (wasRunning && !options.leaveStopped) await qmp.execute("cont", undefined, { signal });
    resumed = true;
    const pauseMs = performance.now() - started;
    const size = await out.finish();
    return {
      pages: scan.pages,
      data: buffer.subarray(0, bytes),
      buffer,
      pauseMs,
      stateMs,
      scanMs: scan.ms,
      copyMs: copy.ms,
      deviceStateBytes: size,
    };
  } catch (err) {
    await out.discard();
    throw err;
  } finally {
    // The source must keep running whatever happened to the capture (unless it was paused to begin with).
    if (!resumed) await qmp.execute("cont").catch(() => {});
  }
}
