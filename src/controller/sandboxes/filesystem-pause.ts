/**
 * A filesystem-only pause (E2B's memory: false): the guest flushes its page cache (`sync`), QEMU stops (which
 * drains and flushes the disk), and the VM's writable disk overlay is kept by a hard link published with a
 * rename, so a crash leaves either no kept disk (the sandbox runs on) or a whole one (the restart completes the
 * pause). Processes and memory are not kept: the resume cold-boots the sandbox on this disk and runs its
 * template's start command again (pause-resume.ts sequences both; machines/sandbox-vm.ts boots it). At the
 * daemon's start, kept disks no paused sandbox owns are swept, and a paused sandbox whose kept disk is gone is
 * marked dead as lost (reattach.ts).
 */
import { lchown, link, lstat, mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { crashPoint } from "../../common/crash-points.js";
import { errorMessage, ForkdError } from "../../common/errors.js";
import { SANDBOX_ID_PATTERN } from "../../common/limits.js";
import type { ForkdPaths } from "../../common/paths.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import { RUN_FILES } from "../machines/machine.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";

/** `pending_pause_tag` of a filesystem-only pause in progress (it writes no snapshot layer). */
export const FILESYSTEM_PAUSE_MARK = "filesystem-only";

const SANDBOX_ID = new RegExp(SANDBOX_ID_PATTERN);

/** How long the guest's `sync` may take before the pause is refused (the sandbox runs on). */
const GUEST_SYNC_TIMEOUT_MS = 60_000;

/** The reason a cold-booted sandbox cannot be paused with memory, branched, forked or snapshotted. */
export const COLD_BOOTED_REASON =
  "it was resumed by a cold boot from a filesystem-only pause, so its memory is no snapshot's (only a " +
  "filesystem-only pause, memory: false, works on it)";

/** Where a sandbox's kept disk lives while it is paused without memory (outside its run directory). */
export function keptDiskPath(paths: ForkdPaths, id: string): string {
  return path.join(keptDisksRoot(paths), id, RUN_FILES.disk);
}

/** The kept disk before its rename: never read as a kept disk. */
function partialPath(file: string): string {
  return `${file}.partial`;
}

/** The directory of every sandbox's kept disk (one directory per sandbox id). */
export function keptDisksRoot(paths: ForkdPaths): string {
  return path.join(paths.home, "kept-disks");
}

/**
 * Whether `file` is a kept disk: a regular file in a real directory (never a symlink, which a cold boot would
 * follow out of the home).
 */
export async function keptDiskExists(file: string): Promise<boolean> {
  const [dir, disk] = await Promise.all([lstat(path.dirname(file)), lstat(file)]).catch(() => [null, null]);
  return dir !== null && disk !== null && dir.isDirectory() && disk.isFile();
}

/** Why a paused sandbox whose kept disk is gone is dead (its record says so; a resume answers with it). */
export function keptDiskLostReason(when: string): string {
  return `lost: its kept disk (a filesystem-only pause's) was missing ${when}; nothing is left to resume`;
}

/**
 * A paused sandbox whose kept disk is missing is lost: its record is marked dead saying so (by `markDead`, the
 * teardown's), and only its own kept-disk directory is removed (the recorded path is not trusted for that).
 */
export async function markKeptDiskLost(
  paths: ForkdPaths,
  db: Pick<StateDb, "updateSandbox">,
  row: SandboxRow,
  when: string,
  markDead: (row: SandboxRow, why: string) => Promise<void>,
): Promise<string> {
  const why = keptDiskLostReason(when);
  db.updateSandbox(row.id, { kept_disk: null });
  await removeKeptDisk(keptDiskPath(paths, row.id));
  await markDead({ ...row, kept_disk: null }, why);
  return why;
}

/**
 * The daemon's start: every entry of kept-disks/ that is no paused sandbox's (`keep`: their ids) goes, e.g. what
 * a crash between a cold boot's record and its removal of the kept name left. Only entries named like our sandbox
 * ids are ours to remove (others are reported); nothing is followed: a symlinked kept-disks/ or entry is removed
 * as a link (fs.rm never follows one). Returns what it removed and what it left.
 */
export async function sweepKeptDisks(
  paths: ForkdPaths,
  keep: ReadonlySet<string>,
): Promise<{ removed: string[]; foreign: string[] }> {
  const root = keptDisksRoot(paths);
  const info = await lstat(root).catch(() => null);
  if (info === null) return { removed: [], foreign: [] };
  if (!info.isDirectory()) {
    await rm(root, { force: true });
    return { removed: [root], foreign: [] };
  }
  const removed: string[] = [];
  const foreign: string[] = [];
  for (const name of await readdir(root)) {
    if (!SANDBOX_ID.test(name)) {
      foreign.push(name);
      continue;
    }
    if (keep.has(name)) continue;
    await rm(path.join(root, name), { recursive: true, force: true });
    removed.push(name);
  }
  return { removed, foreign };
}

/** Removes a kept disk and its directory, and any partial one (nothing of the pause is left). */
export async function removeKeptDisk(file: string): Promise<void> {
  await rm(path.dirname(file), { recursive: true, force: true });
}

/**
 * Syncs the guest, stops it and publishes its disk overlay as `target`. Returns with the VM stopped (the
 * caller kills it once the database says paused); on failure the VM runs again and no kept disk is left.
 */
export async function keepDisk(
  handle: SandboxHandle,
  target: string,
  signal: AbortSignal | undefined,
): Promise<{ pause_ms: number; bytes: number }> {
  const synced = await handle.agent
    .exec(["sync"], { timeoutMs: GUEST_SYNC_TIMEOUT_MS, signal })
    .catch((err: unknown) => {
      // Not the sandbox's absence (E2B's SDK reads a 404 as "sandbox not found"): its image has no sync.
      if (!(err instanceof ForkdError) || err.code !== "not_found") throw err;
      throw new ForkdError(
        "unprocessable",
        `sandbox ${handle.id}: sync cannot run in the guest (${err.message}): a filesystem-only pause needs a ` +
          "`sync` program in the image (coreutils' or busybox's); not paused",
        { cause: err },
      );
    });
  if (synced.exitCode !== 0) {
    throw new ForkdError(
      "unavailable",
      `sandbox ${handle.id}: sync in the guest failed (exit ${synced.exitCode ?? synced.signal}): not paused`,
    );
  }
  const qmp = await handle.qmp();
  const started = performance.now();
  await qmp.execute("stop", undefined, { signal });
  crashPoint("pause.stopped");
  const partial = partialPath(target);
  try {
    await mkdir(path.dirname(target), { recursive: true, mode: 0o700 });
    await rm(partial, { force: true });
    await link(path.join(handle.runDir, RUN_FILES.disk), partial);
    // From now on it is the daemon's file (not the VM's uid) until a resume hands it to a VM again.
    if (handle.vmOwner) await lchown(partial, 0, 0);
    await fsyncPath(partial);
    crashPoint("pause.captured");
    await rename(partial, target);
    await fsyncPath(path.dirname(target));
    crashPoint("pause.published");
    return { pause_ms: performance.now() - started, bytes: (await stat(target)).blocks * 512 };
  } catch (err) {
    await removeKeptDisk(target).catch(() => {});
    await qmp.execute("cont").catch(() => {});
    throw new ForkdError(
      err instanceof ForkdError ? err.code : "internal",
      `sandbox ${handle.id}: its disk could not be kept (${errorMessage(err)}): not paused`,
      { cause: err },
    );
  }
}

async function fsyncPath(file: string): Promise<void> {
  const handle = await open(file, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}
