/**
 * Directories only this process's user may use, in places other users can write to (the tmpfs RAM images live in
 * /dev/shm, which every local user can create names in). A directory that already exists is used only once it is
 * proven ours after opening it (no symbolic link followed, a directory, owned by us, no group or other
 * permission bits): a local user who pre-created it would otherwise read or replace the RAM image every child of
 * a snapshot maps.
 */
import { randomBytes } from "node:crypto";
import { constants as fsConstants, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdir, open } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "./errors.js";

/** Creates `dir` (0700; its parent must exist or is created 0700) or proves an existing one is ours. */
export async function ensurePrivateDir(dir: string): Promise<void> {
  await mkdir(path.dirname(dir), { recursive: true, mode: 0o700 });
  await mkdir(dir, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== "EEXIST") throw err;
  });
  const handle = await open(
    dir,
    fsConstants.O_RDONLY | fsConstants.O_DIRECTORY | fsConstants.O_NOFOLLOW,
  ).catch((err: NodeJS.ErrnoException) => {
    throw new ForkdError(
      "conflict",
      `refusing ${dir}: it is not a directory of ours (${err.code ?? err.message})`,
    );
  });
  try {
    const st = await handle.stat();
    const uid = process.getuid?.() ?? 0;
    if (!st.isDirectory() || st.uid !== uid || (st.mode & 0o077) !== 0) {
      throw new ForkdError(
        "conflict",
        `refusing ${dir}: owned by uid ${st.uid} with mode ${(st.mode & 0o777).toString(8)}, ` +
          `not a private directory of uid ${uid} (someone else created it; remove it)`,
      );
    }
  } finally {
    await handle.close();
  }
}

/**
 * A name for a private directory under a shared `parent`, unguessable by other users: chosen at random once and
 * remembered in `recordFile` (which lives in a directory only we can read), so a local user cannot pre-create it.
 */
export function unguessableDirName(parent: string, prefix: string, recordFile: string): string {
  let name: string | undefined;
  try {
    name = readFileSync(recordFile, "utf8").trim();
  } catch {
    // first use
  }
  if (!name || !/^[A-Za-z0-9._-]{1,128}$/.test(name) || !name.startsWith(prefix)) {
    name = `${prefix}${randomBytes(12).toString("hex")}`;
    mkdirSync(path.dirname(recordFile), { recursive: true, mode: 0o700 });
    writeFileSync(recordFile, `${name}\n`, { mode: 0o600 });
  }
  return path.join(parent, name);
}
