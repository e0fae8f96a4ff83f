/**
 * Guest RAM of a running QEMU, seen from the host: which mapping of QEMU's address space is the guest RAM
 * (`/proc/PID/maps`), which of its pages the guest has written (`/proc/PID/pagemap`), and copying pages out of
 * it or into it (`process_vm_readv`/`process_vm_writev` through koffi, `/proc/PID/mem` as the fallback).
 *
 * Why "written" is knowable: a child maps its snapshot's memory file MAP_PRIVATE. A page the guest has written
 * was copied by the kernel into an anonymous page private to this process (pagemap: present or swapped, and not
 * "file-page or shared-anon"); every other page still reads through to the file. Those private pages plus the
 * device state are a diff layer on top of the memory file.
 *
 * Reading or writing another process's memory needs root (or ptrace rights over it), like everything here.
 */
import fs from "node:fs";
import { createRequire } from "node:module";
import { ForkdError } from "../common/errors.js";

export const PAGE_SIZE = 4096;

/** Linux UIO_MAXIOV: the most iovecs one process_vm_readv/writev call takes on either side. */
export const MAX_IOVECS = 1024;

/** pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst), in the entry's high 32-bit word. */
const PM_PRESENT = 0x8000_0000; // bit 63
const PM_SWAP = 0x4000_0000; // bit 62
const PM_FILE = 0x2000_0000; // bit 61: file page or shared anonymous

export interface GuestRamMapping {
  pid: number;
  /** Host virtual address of guest RAM offset 0 in QEMU. */
  start: number;
  /** Bytes mapped (the whole memory file, for our machines). */
  length: number;
  /** Offset into the file at `start` (0 for QEMU's memory-backend-file). */
  fileOffset: number;
  /** MAP_PRIVATE (`share=off`) or MAP_SHARED. */
  private: boolean;
}

/**
 * Finds the mapping of `memoryFile` in QEMU process `pid`. Matched by device and inode, not by name, so a
 * renamed or unlinked file is still found; adjacent VMAs of the file (QEMU's madvise calls can split one
 * mapping) are merged and must be contiguous in both address and file offset.
 */
export function findGuestRamMapping(
  pid: number,
  memoryFile: string,
  options: { expectedBytes?: number } = {},
): GuestRamMapping {
  assertPid(pid);
  let identity: fs.Stats;
  try {
    identity = fs.statSync(memoryFile);
  } catch (err) {
    throw new ForkdError("not_found", `memory file ${memoryFile}: ${(err as NodeJS.ErrnoException).code}`);
  }
  const major = Math.floor(identity.dev / 256) & 0xfff;
  const minor = (identity.dev & 0xff) | (Math.floor(identity.dev / 4096) & 0xfff00);
  let maps: string;
  try {
    maps = fs.readFileSync(`/proc/${pid}/maps`, "utf8");
  } catch (err) {
    throw new ForkdError(
      "not_found",
      `cannot read /proc/${pid}/maps: ${(err as NodeJS.ErrnoException).code}`,
    );
  }
  const vmas: { start: number; end: number; offset: number; perms: string }[] = [];
  for (const line of maps.split("\n")) {
    // start-end perms offset major:minor inode [path]
    const m = /^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) (\d+)/.exec(line);
    if (!m) continue;
    if (Number(m[7]) !== identity.ino) continue;
    if (Number.parseInt(m[5] as string, 16) !== major || Number.parseInt(m[6] as string, 16) !== minor)
      continue;
    vmas.push({
      start: Number.parseInt(m[1] as string, 16),
      end: Number.parseInt(m[2] as string, 16),
      offset: Number.parseInt(m[4] as string, 16),
      perms: m[3] as string,
    });
  }
  if (vmas.length === 0) {
    throw new ForkdError("not_found", `process ${pid} does not map ${memoryFile}`);
  }
  vmas.sort((a, b) => a.start - b.start);
  const first = vmas[0] as (typeof vmas)[number];
  let end = first.end;
  for (const vma of vmas.slice(1)) {
    if (vma.start !== end || vma.offset !== first.offset + (vma.start - first.start)) {
      throw new ForkdError(
        "conflict",
        `process ${pid} maps ${memoryFile} more than once (at 0x${first.start.toString(16)} and ` +
          `0x${vma.start.toString(16)}); cannot tell which is guest RAM`,
      );
    }
    if (vma.perms[3] !== first.perms[3]) {
      throw new ForkdError("conflict", `process ${pid} maps ${memoryFile} both shared and private`);
    }
    end = vma.end;
  }
  const mapping: GuestRamMapping = {
    pid,
    start: first.start,
    length: end - first.start,
    fileOffset: first.offset,
    private: first.perms[3] === "p",
  };
  if (options.expectedBytes !== undefined && mapping.length !== options.expectedBytes) {
    throw new ForkdError(
      "conflict",
      `process ${pid} maps ${mapping.length} bytes of ${memoryFile}, expected ${options.expectedBytes}`,
    );
  }
  return mapping;
}

export interface PrivatePageScan {
  /** Indices (offset / 4096) of the private pages, ascending. */
  pages: Uint32Array;
  /** Wall time of the scan (one pagemap read and one pass over it). */
  ms: number;
}

/**
 * The pages of a MAP_PRIVATE guest RAM mapping that the guest has written: present (or swapped) and not a
 * file page. One read of the mapping's pagemap range (8 bytes per page: 1 MiB for 512 MiB of RAM) and one pass
 * over it. The answer is exact only while the VM is stopped; on a running VM it is a moment's view (pages only
 * ever become private, so a later scan is a superset of an earlier one).
 */
export function scanPrivatePages(mapping: GuestRamMapping): PrivatePageScan {
  if (!mapping.private) {
    throw new ForkdError(
      "invalid_argument",
      "private pages are only meaningful for a MAP_PRIVATE (share=off) mapping",
    );
  }
  const started = performance.now();
  const pageCount = mapping.length / PAGE_SIZE;
  if (!Number.isInteger(pageCount)) throw new ForkdError("internal", "guest RAM mapping is not page-aligned");
  const entries = Buffer.allocUnsafe(pageCount * 8);
  let fd: number;
  try {
    fd = fs.openSync(`/proc/${mapping.pid}/pagemap`, "r");
  } catch (err) {
    throw new ForkdError(
      "not_found",
      `cannot open /proc/${mapping.pid}/pagemap: ${(err as NodeJS.ErrnoException).code}`,
    );
  }
  try {
    const position = (mapping.start / PAGE_SIZE) * 8;
    let done = 0;
    while (done < entries.length) {
      const n = fs.readSync(fd, entries, done, entries.length - done, position + done);
      if (n === 0) throw new ForkdError("internal", `pagemap of process ${mapping.pid} ended early`);
      done += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  // Little-endian host: the high word of entry i is word 2i+1.
  const words = new Uint32Array(entries.buffer, entries.byteOffset, pageCount * 2);
  const found = new Uint32Array(pageCount);
  let count = 0;
  for (let i = 0; i < pageCount; i++) {
    const high = words[2 * i + 1] as number;
    if ((high & (PM_PRESENT | PM_SWAP)) !== 0 && (high & PM_FILE) === 0) found[count++] = i;
  }
  return { pages: found.slice(0, count), ms: performance.now() - started };
}

/**
 * Runs of consecutive page indices in the given order ([firstPage, pageCount] pairs, flattened): pages[k+1] ===
 * pages[k] + 1 extends a run. Any order is allowed (a live capture delivers pages in stream order).
 */
export function pageRuns(pages: Uint32Array): Uint32Array {
  const runs: number[] = [];
  let i = 0;
  while (i < pages.length) {
    const first = pages[i] as number;
    let n = 1;
    while (i + n < pages.length && pages[i + n] === first + n) n++;
    runs.push(first, n);
    i += n;
  }
  return Uint32Array.from(runs);
}

export type PageCopyMethod = "process_vm" | "proc_mem";

export interface PageCopyOptions {
  /** Default: process_vm_readv/writev when koffi loads, else /proc/PID/mem. */
  method?: PageCopyMethod;
}

export interface PageCopyResult {
  bytes: number;
  ms: number;
  method: PageCopyMethod;
  /** System calls made (one per batch of up to MAX_IOVECS runs, or one per run through /proc/PID/mem). */
  calls: number;
}

/**
 * Copies `pages` (indices, in any order) of the guest RAM into `dest`, packed in that order: page pages[k]
 * lands at dest[k*4096]. `dest` must hold pages.length pages; reuse one across calls (a fresh buffer pays a page
 * fault per destination page on first touch, which dominates on a loaded host).
 */
export function readPages(
  mapping: GuestRamMapping,
  pages: Uint32Array,
  dest: Buffer,
  options: PageCopyOptions = {},
): PageCopyResult {
  return copyPages("read", mapping, pages, dest, options);
}

/**
 * Writes `data` (pages packed in the order of `pages`, as `readPages` produces) into the guest RAM at `pages`;
 * where an index repeats, the later page wins. Meant for a child that has not loaded its device state yet (see
 * page-restore.ts: QEMU checks virtio rings in RAM while loading): on a MAP_PRIVATE mapping each written page
 * becomes the child's own copy; the memory file is never touched.
 */
export function writePages(
  mapping: GuestRamMapping,
  pages: Uint32Array,
  data: Buffer,
  options: PageCopyOptions = {},
): PageCopyResult {
  if (!mapping.private) {
    throw new ForkdError(
      "invalid_argument",
      "refusing to write pages into a shared mapping (it would change the file)",
    );
  }
  return copyPages("write", mapping, pages, data, options);
}

/**
 * Reads one byte of every page of the mapping through process_vm_readv, which faults each page into the target
 * process's page tables (a remote GUP installs the PTE). Used before a background snapshot: QEMU's setup then
 * finds its page tables populated instead of faulting 4 KiB at a time while the VM is stopped. On a sparse
 * tmpfs file this allocates the holes (as QEMU's own populate would).
 */
export function touchPages(mapping: GuestRamMapping): { ms: number; calls: number } {
  const pv = loadProcessVm();
  if (!pv) throw new ForkdError("unavailable", "process_vm_readv is unavailable (koffi did not load)");
  const started = performance.now();
  const pages = mapping.length / PAGE_SIZE;
  const sink = Buffer.alloc(MAX_IOVECS);
  const localIov = Buffer.alloc(16);
  const localWords = new Uint32Array(localIov.buffer, localIov.byteOffset, 4);
  setU64(localWords, 0, pv.address(sink));
  const remoteIov = Buffer.alloc(16 * MAX_IOVECS);
  const remoteWords = new Uint32Array(remoteIov.buffer, remoteIov.byteOffset, 4 * MAX_IOVECS);
  let calls = 0;
  for (let first = 0; first < pages; first += MAX_IOVECS) {
    const batch = Math.min(MAX_IOVECS, pages - first);
    for (let k = 0; k < batch; k++) {
      setU64(remoteWords, 4 * k, mapping.start + (first + k) * PAGE_SIZE);
      setU64(remoteWords, 4 * k + 2, 1);
    }
    setU64(localWords, 2, batch);
    const done = pv.readv(mapping.pid, localIov, 1, remoteIov, batch, 0);
    calls++;
    if (done !== batch) {
      throw new ForkdError(
        "internal",
        `process_vm_readv on process ${mapping.pid}: touched ${done} of ${batch} pages`,
      );
    }
  }
  return { ms: performance.now() - started, calls };
}

/** Default batch of `writePagesFromFile`: 16 MiB of pages read, then written, per step. */
export const FILE_BATCH_PAGES = 4096;

/**
 * `writePages` for page data stored in a file (a diff layer): `pages.length` pages packed from `fileOffset` of
 * `fd`, in the order of `pages`. Reads and writes in batches through one reused buffer, so memory stays bounded
 * whatever the layer's size.
 */
export function writePagesFromFile(
  mapping: GuestRamMapping,
  pages: Uint32Array,
  fd: number,
  fileOffset: number,
  options: PageCopyOptions & { batchPages?: number } = {},
): PageCopyResult {
  const batchPages = options.batchPages ?? FILE_BATCH_PAGES;
  const buffer = Buffer.allocUnsafe(Math.min(batchPages, pages.length) * PAGE_SIZE);
  const started = performance.now();
  let calls = 0;
  let method: PageCopyMethod = options.method ?? "process_vm";
  for (let first = 0; first < pages.length; first += batchPages) {
    const batch = pages.subarray(first, Math.min(pages.length, first + batchPages));
    const bytes = batch.length * PAGE_SIZE;
    let done = 0;
    while (done < bytes) {
      const n = fs.readSync(fd, buffer, done, bytes - done, fileOffset + first * PAGE_SIZE + done);
      if (n === 0)
        throw new ForkdError("unprocessable", `page file ends before page ${first + done / PAGE_SIZE}`);
      done += n;
      calls++;
    }
    const result = writePages(mapping, batch, buffer, options);
    method = result.method;
    calls += result.calls;
  }
  return { bytes: pages.length * PAGE_SIZE, ms: performance.now() - started, method, calls };
}

function copyPages(
  direction: "read" | "write",
  mapping: GuestRamMapping,
  pages: Uint32Array,
  local: Buffer,
  options: PageCopyOptions,
): PageCopyResult {
  const bytes = pages.length * PAGE_SIZE;
  if (local.length < bytes) {
    throw new ForkdError(
      "invalid_argument",
      `buffer of ${local.length} bytes cannot hold ${pages.length} pages`,
    );
  }
  const limit = mapping.length / PAGE_SIZE;
  for (let k = 0; k < pages.length; k++) {
    if ((pages[k] as number) >= limit) {
      throw new ForkdError("invalid_argument", `page ${pages[k]} is beyond guest RAM (${limit} pages)`);
    }
  }
  const runs = pageRuns(pages);
  const started = performance.now();
  let method = options.method ?? (loadProcessVm() ? "process_vm" : "proc_mem");
  let calls: number;
  if (method === "process_vm") {
    const pv = loadProcessVm();
    if (!pv)
      throw new ForkdError("unavailable", `process_vm_${direction}v is unavailable (koffi did not load)`);
    try {
      calls = copyWithProcessVm(pv, direction, mapping, runs, local);
    } catch (err) {
      // ENOSYS/EPERM (seccomp, a kernel without it): the same copy through /proc/PID/mem.
      const errno = (err as ForkdError).detail?.errno;
      if (options.method !== undefined || (errno !== ENOSYS && errno !== EPERM)) throw err;
      method = "proc_mem";
      calls = copyWithProcMem(direction, mapping, runs, local);
    }
  } else {
    calls = copyWithProcMem(direction, mapping, runs, local);
  }
  return { bytes, ms: performance.now() - started, method, calls };
}

const EPERM = 1;
const ESRCH = 3;
const EFAULT = 14;
const ENOSYS = 38;

interface ProcessVm {
  readv: (
    pid: number,
    local: Buffer,
    localCount: number,
    remote: Buffer,
    remoteCount: number,
    flags: number,
  ) => number;
  writev: (
    pid: number,
    local: Buffer,
    localCount: number,
    remote: Buffer,
    remoteCount: number,
    flags: number,
  ) => number;
  errno: () => number;
  address: (buffer: Buffer) => number;
}

let processVm: ProcessVm | null | undefined;

/** koffi bindings, loaded once; null when koffi or libc cannot be loaded. */
function loadProcessVm(): ProcessVm | null {
  if (processVm !== undefined) return processVm;
  try {
    // Loaded synchronously (createRequire): the copy paths run while a VM is paused and must not yield.
    const koffi = createRequire(import.meta.url)("koffi") as typeof import("koffi");
    const libc = koffi.load("libc.so.6");
    processVm = {
      readv: libc.func(
        "intptr_t process_vm_readv(int pid, const void *local, unsigned long lc, const void *remote, unsigned long rc, unsigned long flags)",
      ) as ProcessVm["readv"],
      writev: libc.func(
        "intptr_t process_vm_writev(int pid, const void *local, unsigned long lc, const void *remote, unsigned long rc, unsigned long flags)",
      ) as ProcessVm["writev"],
      errno: () => koffi.errno() as number,
      address: (buffer: Buffer) => Number(koffi.address(buffer)),
    };
  } catch {
    processVm = null;
  }
  return processVm;
}

/**
 * One system call per batch of up to MAX_IOVECS remote runs; the local side of each batch is a single iovec
 * (the batch's pages are packed back to back in `local`).
 */
function copyWithProcessVm(
  pv: ProcessVm,
  direction: "read" | "write",
  mapping: GuestRamMapping,
  runs: Uint32Array,
  local: Buffer,
): number {
  const localIov = Buffer.alloc(16);
  const remoteIov = Buffer.alloc(16 * MAX_IOVECS);
  const localWords = new Uint32Array(localIov.buffer, localIov.byteOffset, 4);
  const remoteWords = new Uint32Array(remoteIov.buffer, remoteIov.byteOffset, 4 * MAX_IOVECS);
  const base = pv.address(local);
  const call = direction === "read" ? pv.readv : pv.writev;
  let calls = 0;
  let localOffset = 0;
  for (let r = 0; r < runs.length / 2; r += MAX_IOVECS) {
    const batch = Math.min(MAX_IOVECS, runs.length / 2 - r);
    let batchBytes = 0;
    for (let k = 0; k < batch; k++) {
      const first = runs[2 * (r + k)] as number;
      const count = runs[2 * (r + k) + 1] as number;
      setU64(remoteWords, 4 * k, mapping.start + first * PAGE_SIZE);
      setU64(remoteWords, 4 * k + 2, count * PAGE_SIZE);
      batchBytes += count * PAGE_SIZE;
    }
    setU64(localWords, 0, base + localOffset);
    setU64(localWords, 2, batchBytes);
    const done = call(mapping.pid, localIov, 1, remoteIov, batch, 0);
    calls++;
    if (done !== batchBytes) {
      const errno = done < 0 ? pv.errno() : 0;
      const what =
        done < 0
          ? errno === ESRCH
            ? "the process is gone"
            : errno === EFAULT
              ? "an address is not mapped"
              : `errno ${errno}`
          : `only ${done} of ${batchBytes} bytes`;
      throw new ForkdError(
        errno === ESRCH ? "not_found" : "internal",
        `process_vm_${direction}v on process ${mapping.pid}: ${what}`,
        { detail: { errno } },
      );
    }
    localOffset += batchBytes;
  }
  return calls;
}

function copyWithProcMem(
  direction: "read" | "write",
  mapping: GuestRamMapping,
  runs: Uint32Array,
  local: Buffer,
): number {
  let fd: number;
  try {
    fd = fs.openSync(`/proc/${mapping.pid}/mem`, direction === "read" ? "r" : "r+");
  } catch (err) {
    throw new ForkdError(
      "not_found",
      `cannot open /proc/${mapping.pid}/mem: ${(err as NodeJS.ErrnoException).code}`,
    );
  }
  let calls = 0;
  try {
    let localOffset = 0;
    for (let r = 0; r < runs.length; r += 2) {
      const length = (runs[r + 1] as number) * PAGE_SIZE;
      let position = mapping.start + (runs[r] as number) * PAGE_SIZE;
      let done = 0;
      while (done < length) {
        const n =
          direction === "read"
            ? fs.readSync(fd, local, localOffset + done, length - done, position)
            : fs.writeSync(fd, local, localOffset + done, length - done, position);
        calls++;
        if (n <= 0)
          throw new ForkdError(
            "internal",
            `/proc/${mapping.pid}/mem: short ${direction} at 0x${position.toString(16)}`,
          );
        done += n;
        position += n;
      }
      localOffset += length;
    }
  } finally {
    fs.closeSync(fd);
  }
  return calls;
}

/** Stores a non-negative integer below 2^53 as a little-endian u64 at words[i], words[i+1]. */
function setU64(words: Uint32Array, i: number, value: number): void {
  words[i] = value % 0x1_0000_0000;
  words[i + 1] = Math.floor(value / 0x1_0000_0000);
}

function assertPid(pid: number): void {
  if (!Number.isInteger(pid) || pid <= 0) throw new ForkdError("invalid_argument", `invalid pid ${pid}`);
}
