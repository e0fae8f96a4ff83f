/**
 * One disk layer holding a whole chain: a copy of the chain's top layer rebased (safe mode) straight onto the
 * image's root filesystem, so it depends on no other snapshot (compaction, full BRANCHes, whose snapshots stand
 * alone), or onto a layer further down the chain (a sandbox's own pause layers merged).
 */
import { execFile } from "node:child_process";
import { chmod, symlink } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { errorMessage, ForkdError } from "../../common/errors.js";
import { QEMU_IMG_BINARY } from "../../vmm/qemu-tools.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";

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
  await symlink(options.rootfs, options.snapshotDir.file(SNAPSHOT_FILES.baseDisk));
  await foldDisk({ ...options, backing: SNAPSHOT_FILES.baseDisk, backingFormat: "raw" });
}

/**
 * Writes `disk.qcow2` into the snapshot directory: the chain from `topLayer` down to snapshot `baseTag`'s disk
 * layer folded into one layer backed by that one (a sandbox's own pause layers merged onto the layer they were
 * built on). `baseTag`'s layer must be in the chain below `topLayer`.
 */
export async function writeDiskOnLayer(options: {
  topLayer: string;
  baseTag: string;
  snapshotDir: { file(name: string): string };
  signal?: AbortSignal;
}): Promise<void> {
  await foldDisk({
    ...options,
    backing: path.join("..", "..", "snapshots", options.baseTag, SNAPSHOT_FILES.disk),
    backingFormat: "qcow2",
  });
}

async function foldDisk(options: {
  topLayer: string;
  snapshotDir: { file(name: string): string };
  backing: string;
  backingFormat: "raw" | "qcow2";
  signal?: AbortSignal;
}): Promise<void> {
  const { snapshotDir, signal } = options;
  const disk = snapshotDir.file(SNAPSHOT_FILES.disk);
  await execFileAsync("cp", ["--sparse=always", "--", options.topLayer, disk], { signal });
  await chmod(disk, 0o600);
  // The copy still reads through to the top layer's parent (its relative backing path resolves the same from the
  // staging directory). A safe-mode rebase onto the new backing writes into it every cluster in which the old
  // chain differs from it, whichever layer wrote it; when the new backing is in the old chain, QEMU compares only
  // what the layers above it hold. (`qemu-img convert -B` would copy the top layer's clusters only, silently
  // dropping what the intermediate layers wrote.)
  await execFileAsync(
    QEMU_IMG_BINARY,
    ["rebase", "-q", "-f", "qcow2", "-b", options.backing, "-F", options.backingFormat, disk],
    { signal, timeout: FLATTEN_DISK_TIMEOUT_MS, maxBuffer: 1024 * 1024 },
  ).catch((err: unknown) => {
    throw new ForkdError("internal", `qemu-img rebase failed: ${errorMessage(err).trim().slice(-2000)}`, {
      cause: err,
    });
  });
}
