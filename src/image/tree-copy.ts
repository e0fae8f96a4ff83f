/**
 * `copy` steps: host files and directories put into an image tree. Every guest path is resolved inside the
 * tree (rootfs.ts resolveInRoot: an absolute or `..` symlink in the image never leads out of it); symlinks in
 * the copied directory are copied as links (their text), never followed on the host; devices, sockets and
 * FIFOs are refused. A file keeps its permission bits unless the step gives a mode; everything is owned by
 * root unless the step names an owner. Owners are host ids: a tree build steps work on is owned by the build
 * range's shifted ids (step-sandbox/identity.ts), so the caller passes those, and `root` (the owner of any
 * directory made on the way) as the image's root is on disk.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { resolveInRoot } from "./rootfs.js";

export interface CopyOptions {
  root: string;
  /** Host file or directory (already checked to be inside the template's directory). */
  src: string;
  dest: string;
  mode: number | undefined;
  owner: { uid: number; gid: number };
  /** Who owns directories made on the way to `dest` (the image's root, as the tree has it on disk). */
  rootOwner?: { uid: number; gid: number };
}

/** Makes the missing directories of `dir` (inside the tree), each owned by `owner`. */
async function mkdirOwned(dir: string, owner: { uid: number; gid: number }): Promise<void> {
  const missing: string[] = [];
  let at = dir;
  while (!(await fs.lstat(at).catch(() => undefined))) {
    missing.unshift(at);
    at = path.dirname(at);
  }
  for (const made of missing) {
    await fs.mkdir(made, { mode: 0o755 });
    await fs.lchown(made, owner.uid, owner.gid);
  }
}

const MAX_COPY_ENTRIES = 100_000;

async function replaceable(target: string, guestPath: string, isDir: boolean): Promise<boolean> {
  const existing = await fs.lstat(target).catch(() => undefined);
  if (!existing) return false;
  if (existing.isDirectory()) {
    if (isDir) return true;
    throw new ForkdError("invalid_argument", `${guestPath} is a directory in the image`);
  }
  await fs.rm(target);
  return false;
}

/** Copies `src` to `dest` in the tree: a file to dest (or into it, if dest is a directory), a directory's contents into dest. */
export async function copyIntoTree(options: CopyOptions): Promise<number> {
  const { root, src, owner } = options;
  const parents = options.rootOwner ?? { uid: 0, gid: 0 };
  const srcStat = await fs.stat(src);
  let count = 0;
  const place = async (hostPath: string, guestPath: string): Promise<void> => {
    if (++count > MAX_COPY_ENTRIES) {
      throw new ForkdError("invalid_argument", `copy ${src}: more than ${MAX_COPY_ENTRIES} entries`);
    }
    const st = await fs.lstat(hostPath);
    const target = await resolveInRoot(root, guestPath);
    if (target === root && !st.isDirectory()) throw new ForkdError("invalid_argument", "cannot replace /");
    await mkdirOwned(path.dirname(target), parents);
    if (st.isDirectory()) {
      const exists = await replaceable(target, guestPath, true);
      if (!exists) await fs.mkdir(target, { mode: st.mode & 0o7777 });
      await fs.lchown(target, owner.uid, owner.gid);
      for (const name of (await fs.readdir(hostPath)).sort()) {
        await place(path.join(hostPath, name), path.posix.join(guestPath, name));
      }
    } else if (st.isSymbolicLink()) {
      await replaceable(target, guestPath, false);
      await fs.symlink(await fs.readlink(hostPath), target);
      await fs.lchown(target, owner.uid, owner.gid);
    } else if (st.isFile()) {
      await replaceable(target, guestPath, false);
      const mode = options.mode ?? st.mode & 0o7777;
      await fs.copyFile(hostPath, target, fs.constants.COPYFILE_EXCL);
      await fs.lchown(target, owner.uid, owner.gid);
      await fs.chmod(target, mode);
    } else {
      throw new ForkdError(
        "invalid_argument",
        `copy: ${hostPath} is not a regular file, directory or symlink`,
      );
    }
  };
  if (srcStat.isDirectory()) {
    const destDir = await resolveInRoot(root, options.dest, true);
    const existing = await fs.lstat(destDir).catch(() => undefined);
    if (existing && !existing.isDirectory()) {
      throw new ForkdError("invalid_argument", `${options.dest} exists in the image and is not a directory`);
    }
    if (!existing) {
      await mkdirOwned(path.dirname(destDir), parents);
      await fs.mkdir(destDir, { mode: 0o755 });
      await fs.lchown(destDir, owner.uid, owner.gid);
    }
    for (const name of (await fs.readdir(src)).sort()) {
      await place(path.join(src, name), path.posix.join(options.dest, name));
    }
    return count;
  }
  const destStat = await fs.stat(await resolveInRoot(root, options.dest, true)).catch(() => undefined);
  const guestPath = destStat?.isDirectory()
    ? path.posix.join(options.dest, path.basename(src))
    : options.dest;
  await place(src, guestPath);
  return count;
}
