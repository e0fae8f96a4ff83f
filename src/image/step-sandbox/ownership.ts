/**
 * Who may enter what while a build runs. bwrap, running as the build range's first id, must reach every path
 * it binds, so the directories on the way are root's with that id's group and mode 0710 (`openToBuildRange`:
 * the range may pass through, no local user may even look), and what a sandboxed step or tool writes
 * (buildah's storage, a Dockerfile build's work directory, a step's inputs) belongs to that id while it works
 * (`giveToBuildRange`). Everything it left is given back to root before forkd publishes it
 * (`takeFromBuildRange`: the cache holds nothing the range's ids could still change).
 */
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../../common/errors.js";
import type { BuildIdRange } from "./identity.js";

/** Makes `dir` if missing and lets the range's first id pass through it (root:<that gid>, 0710), nobody else. */
export async function openToBuildRange(dir: string, range: BuildIdRange): Promise<void> {
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  await fs.chown(dir, 0, range.base);
  await fs.chmod(dir, 0o710);
}

/** Makes `dir` (and any missing parents, root's) and gives it to the range's root, mode 0700. */
export async function giveToBuildRange(dir: string, range: BuildIdRange): Promise<void> {
  await fs.mkdir(path.dirname(dir), { recursive: true, mode: 0o700 });
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  await fs.chown(dir, range.base, range.base);
  await fs.chmod(dir, 0o700);
}

/** Gives `dir` and everything under it to the range's root (links are not followed). */
export async function giveAllToBuildRange(dir: string, range: BuildIdRange): Promise<void> {
  await fs.lchown(dir, range.base, range.base);
  if (!(await fs.lstat(dir)).isDirectory()) return;
  for (const name of await fs.readdir(dir)) await giveAllToBuildRange(path.join(dir, name), range);
}

/** Gives `dir` and everything under it to root (links are not followed); setuid and setgid bits are dropped. */
export async function takeFromBuildRange(dir: string): Promise<void> {
  const st = await fs.lstat(dir);
  await fs.lchown(dir, 0, 0);
  if (st.isSymbolicLink()) return;
  if (!st.isDirectory()) {
    await fs.chmod(dir, st.mode & 0o1777);
    return;
  }
  await fs.chmod(dir, st.mode & 0o1777);
  for (const name of await fs.readdir(dir)) await takeFromBuildRange(path.join(dir, name));
}

/** Refuses (with what to change) a directory the range's first id could not reach: an ancestor it cannot search. */
export async function assertReachableByBuildRange(
  dir: string,
  range: BuildIdRange,
  what: string,
): Promise<void> {
  for (let at = path.dirname(path.resolve(dir)); ; at = path.dirname(at)) {
    const st = await fs.stat(at);
    const searchable =
      (st.mode & 0o001) !== 0 ||
      (st.gid === range.base && (st.mode & 0o010) !== 0) ||
      (st.uid === range.base && (st.mode & 0o100) !== 0);
    if (!searchable) {
      throw new ForkdError(
        "unavailable",
        `${what} ${dir} is inside ${at} (mode ${(st.mode & 0o7777).toString(8)}), which build steps cannot pass ` +
          `through: they run as uid ${range.base} (forkd-build), not root. Let others search it (chmod o+x ${at}) ` +
          "or move the image cache (FORKD_IMAGE_CACHE)",
      );
    }
    if (at === "/") return;
  }
}
