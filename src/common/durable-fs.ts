/**
 * Durability for write-then-rename publishing (snapshots, images, unpacked packs): what is renamed into place
 * must already be on disk, and so must the rename.
 */
import { constants as fsConstants } from "node:fs";
import { open, rename, writeFile } from "node:fs/promises";

/** fsync of a file or a directory (a directory's fsync makes the renames and creations inside it durable). */
export async function fsyncPath(file: string): Promise<void> {
  const handle = await open(file, fsConstants.O_RDONLY);
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** Creates `file` (it must not exist) read-only, writes `data` and fsyncs it. */
export async function writeDurably(file: string, data: string | Buffer): Promise<void> {
  const handle = await open(file, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, 0o444);
  try {
    await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * Replaces a small state file whole: written beside it (`<file>.tmp`), then renamed over it, so a reader or a
 * crash sees the old content or the new, never part of it. Callers serialize their own writes to one file.
 */
export async function replaceFile(file: string, data: string, mode = 0o600): Promise<void> {
  const tmp = `${file}.tmp`;
  await writeFile(tmp, data, { mode });
  await rename(tmp, file);
}
