/**
 * A filesystem-only pause (E2B's memory: false): the guest flushes its page cache (`sync`), QEMU stops (which
 * drains and flushes the disk), and the VM's writable disk overlay is kept by a hard link published with a
 * rename, so a crash leaves either no kept disk (the sandbox runs on) or a whole one (the restart completes the
 * pause). Processes and memory are not kept: the resume cold-boots the sandbox on this disk
 * (pause-resume.ts sequences both; machines/sandbox-vm.ts boots it).
 */
import { lchown, link, mkdir, open, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { crashPoint } from "../../common/crash-points.js";
import { errorMessage, ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { RUN_FILES } from "../machines/machine.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";

/** `pending_pause_tag` of a filesystem-only pause in progress (it writes no snapshot layer). */
export const FILESYSTEM_PAUSE_MARK = "filesystem-only";

/** How long the guest's `sync` may take before the pause is refused (the sandbox runs on). */
const GUEST_SYNC_TIMEOUT_MS = 60_000;

/** The reason a cold-booted sandbox cannot be paused with memory, branched, forked or snapshotted. */
export const COLD_BOOTED_REASON =
  "it was resumed by a cold boot from a filesystem-only pause, so its memory is no snapshot's (only a " +
  "filesystem-only pause, memory: false, works on it)";

/** Where a sandbox's kept disk lives while it is paused without memory (outside its run directory). */
export function keptDiskPath(paths: ForkdPaths, id: string): string {
  return path.join(paths.home, "kept-disks", id, RUN_FILES.disk);
}

/** The kept disk before its rename: never read as a kept disk. */
function partialPath(file: string): string {
  return `${file}.partial`;
}

export async function keptDiskExists(file: string): Promise<boolean> {
  return stat(file).then(
    (s) => s.isFile(),
    () => false,
  );
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
  const synced = await handle.agent.exec(["sync"], { timeoutMs: GUEST_SYNC_TIMEOUT_MS, signal });
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
