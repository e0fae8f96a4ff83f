/**
 * One disk layer holding a whole chain: a copy of the chain's top layer rebased (safe mode) straight onto the
 * image's root filesystem, so it depends on no other snapshot. Used by compaction and by full BRANCHes, whose
 * snapshots stand alone.
 */
import { execFile } from "node:child_process";
import { chmod, symlink } from "node:fs/promises";
import { promisify } from "node:util";
import { errorMessage, ForkdError } from "../common/errors.js";
import { QEMU_IMG_BINARY } from "../vmm/qemu-tools.js";
import { SNAPSHOT_FILES } from "./machine.js";

const execFileAsync = promisify(execFile);

/** The longest a `qemu-img rebase` of a chain may take (it reads the whole virtual disk twice). */
export const FLATTEN_DISK_TIMEOUT_MS = 30 * 60_000;

export interface FlattenDiskOptions {
  /** The chain's top layer; its backing path (relative) must resolve the same from `snapshotDir`. */
  topLayer: string;
  /** The image's root filesystem (the target of the new `base.ext4` link). */
  rootfs: string;
  /** A snapshot directory being written (two levels under FORKD_HOME, like every layer's home). */
  snapshotDir: { file(name: string): string };
  signal?: AbortSignal;
}

/** Writes `disk.qcow2` and `base.ext4` into the snapshot directory: every block the chain changed, one layer. */
export async function writeFlatDisk(options: FlattenDiskOptions): Promise<void> {
  const { snapshotDir, signal } = options;
  await symlink(options.rootfs, snapshotDir.file(SNAPSHOT_FILES.baseDisk));
  const disk = snapshotDir.file(SNAPSHOT_FILES.disk);
  await execFileAsync("cp", ["--sparse=always", "--", options.topLayer, disk], { signal });
  await chmod(disk, 0o600);
  // The copy still reads through to the top layer's parent (its relative backing path resolves the same from the
  // staging directory). A safe-mode rebase onto the base image writes into it every cluster in which the old
  // chain differs from the base, whichever layer wrote it. (`qemu-img convert -B` would copy the top layer's
  // clusters only, silently dropping what the intermediate layers wrote.)
  await execFileAsync(
    QEMU_IMG_BINARY,
    ["rebase", "-q", "-f", "qcow2", "-b", SNAPSHOT_FILES.baseDisk, "-F", "raw", disk],
    { signal, timeout: FLATTEN_DISK_TIMEOUT_MS, maxBuffer: 1024 * 1024 },
  ).catch((err: unknown) => {
    throw new ForkdError("internal", `qemu-img rebase failed: ${errorMessage(err).trim().slice(-2000)}`, {
      cause: err,
    });
  });
}
