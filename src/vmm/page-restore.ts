/**
 * Restoring a child from a memory file plus a set of pages (a diff layer, or pages captured from a running VM)
 * without materialising a new flat memory file: the pages are written into the child's MAP_PRIVATE RAM, then
 * the device state is loaded.
 *
 * The order is forced by QEMU: loading virtio devices reads their rings from guest RAM and checks them against
 * the saved indices ("VQ 0 size 0x400 Guest index 0x3 inconsistent with Host index 0x7", after which the device
 * is marked broken and the guest hangs on I/O). So RAM must be complete BEFORE the device state is read; writing
 * pages into a child started with -S after the load (the obvious way) is not enough.
 *
 * How, with the child's ordinary `-incoming fd:3` command line: the device-state "file" is a FIFO. QEMU opens
 * it at startup and its incoming-migration coroutine waits for data, after machine creation and reset (so
 * nothing QEMU does at startup overwrites the pages written next). Once QMP answers, the host writes the pages
 * through `writePages` and then feeds the device state into the FIFO.
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { abortError, sleep, throwIfAborted, timeoutSignal } from "../common/deadline.js";
import { ForkdError } from "../common/errors.js";
import { findGuestRamMapping, type GuestRamMapping } from "./guest-memory.js";
import type { VmHandle } from "./launch.js";

/** Poll interval while waiting for QEMU to drain the FIFO or finish the load. */
const POLL_MS = 2;

/** QEMU reads a device state of tens of KB in milliseconds; this bounds a QEMU that never reads. */
export const FEED_TIMEOUT_MS = 30_000;

export interface DeferredDeviceState {
  /** A FIFO: pass it as `MachineSpec.restore.deviceStatePath`. */
  readonly path: string;
  /** Writes `state` into the FIFO (waiting while the pipe is full) and closes our end. */
  feed(state: Buffer, options?: { signal?: AbortSignal }): Promise<void>;
  /** Closes our end (QEMU then reads EOF and fails its load if it had not got the state) and removes the FIFO. */
  dispose(): void;
}

type Mkfifo = (file: string, mode: number) => number;
let mkfifo: Mkfifo | undefined;
let libcErrno: (() => number) | undefined;

function bindMkfifo(): Mkfifo {
  if (!mkfifo) {
    const koffi = createRequire(import.meta.url)("koffi") as typeof import("koffi");
    mkfifo = koffi.load("libc.so.6").func("int mkfifo(const char *path, uint32_t mode)") as unknown as Mkfifo;
    libcErrno = () => koffi.errno() as number;
  }
  return mkfifo;
}

/**
 * Creates a FIFO (mode 0600) in `dir` and holds it open read-write and non-blocking, so QEMU's open for
 * reading never blocks and our writes never block either.
 */
export function deferredDeviceState(dir: string): DeferredDeviceState {
  if (!path.isAbsolute(dir)) throw new ForkdError("invalid_argument", `directory must be absolute: ${dir}`);
  const fifo = path.join(dir, `.device-state-${randomBytes(4).toString("hex")}.fifo`);
  if (bindMkfifo()(fifo, 0o600) !== 0) {
    throw new ForkdError("unavailable", `mkfifo ${fifo} failed (errno ${libcErrno?.()})`);
  }
  let fd: number | undefined;
  try {
    fd = fs.openSync(fifo, fs.constants.O_RDWR | fs.constants.O_NONBLOCK);
  } catch (err) {
    fs.rmSync(fifo, { force: true });
    throw err;
  }
  const dispose = () => {
    if (fd !== undefined) fs.closeSync(fd);
    fd = undefined;
    fs.rmSync(fifo, { force: true });
  };
  return {
    path: fifo,
    dispose,
    async feed(state, options = {}) {
      if (fd === undefined) throw new ForkdError("conflict", "device state already fed or disposed");
      const deadline = timeoutSignal(FEED_TIMEOUT_MS, options.signal);
      try {
        let written = 0;
        while (written < state.length) {
          throwIfAborted(deadline.signal, "feeding the device state to QEMU");
          try {
            written += fs.writeSync(fd, state, written, state.length - written);
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code !== "EAGAIN") throw err;
            await sleep(POLL_MS, deadline.signal);
          }
        }
        // Closing our end leaves the unread rest in the pipe for QEMU, which holds the other read end; it then
        // reads EOF after the state, as from a file.
      } finally {
        deadline.dispose();
        dispose();
      }
    },
  };
}

export interface PagesThenStateOptions {
  signal?: AbortSignal;
  /** Guest RAM size the mapping must have (bytes). */
  expectedBytes?: number;
}

/**
 * For a child launched with `restore.deviceStatePath = deferred.path`: waits for QMP (machine created, incoming
 * migration waiting), calls `writeMemory` with the child's guest RAM mapping (write pages there), feeds the
 * device state and waits until the load is over. Returns the run state after the load ("running", or "paused"
 * with -S or a state saved as paused).
 */
export async function loadPagesThenState(
  vm: VmHandle,
  deferred: DeferredDeviceState,
  state: Buffer,
  writeMemory: (mapping: GuestRamMapping) => void | Promise<void>,
  options: PagesThenStateOptions = {},
): Promise<{ status: string; writeMs: number; loadMs: number }> {
  const memoryFile = vm.spec.memoryFile;
  if (!memoryFile || memoryFile.shared) {
    throw new ForkdError(
      "invalid_argument",
      "pages can only be written into a child with a share=off memory file",
    );
  }
  const qmp = await vm.qmp({ signal: options.signal });
  const before = await qmp.execute<{ status: string }>("query-status", undefined, { signal: options.signal });
  if (before.status !== "inmigrate") {
    throw new ForkdError("conflict", `child is ${before.status}, not waiting for its device state`);
  }
  const mapping = findGuestRamMapping(vm.pid, memoryFile.path, { expectedBytes: options.expectedBytes });
  const writeStarted = performance.now();
  await writeMemory(mapping);
  const loadStarted = performance.now();
  await deferred.feed(state, { signal: options.signal });
  const deadline = timeoutSignal(FEED_TIMEOUT_MS, options.signal);
  try {
    for (;;) {
      const { status } = await qmp.execute<{ status: string }>("query-status", undefined, {
        signal: deadline.signal,
      });
      if (status !== "inmigrate") {
        return { status, writeMs: loadStarted - writeStarted, loadMs: performance.now() - loadStarted };
      }
      await sleep(POLL_MS, deadline.signal).catch(() => {
        throw abortError(deadline.signal, "waiting for the child to load its device state");
      });
    }
  } finally {
    deadline.dispose();
  }
}
