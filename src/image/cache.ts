/**
 * The image cache: one directory per recipe hash, published by renaming a complete staging directory into
 * place, so a reader sees either a whole image or none. Staging directories record their owner process;
 * those of dead owners (a crashed or killed build) are swept before the next build.
 *
 *   <images>/<hash>/{vmlinuz, initrd.img, probe-initrd.img, rootfs.ext4, image.json}   built on this host
 *   <images>/.imported/<build key>/<hash>/{...}   installed from a pack: used by the snapshots that came
 *                                                  with it, never by a build (see importedImagesDir)
 *   <images>/.staging-<hash prefix>-<pid>-<random>/{owner.json, out/, work/}
 *   <images>/.boot/<kernel+busybox key>/{vmlinuz, initrd.img, probe-initrd.img, boot.json}  (see boot.ts)
 *   <images>/.apt-resolution.json
 */

import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { fsyncPath } from "../common/durable-fs.js";
import { ForkdError } from "../common/errors.js";
import {
  identityJson,
  isAlive,
  type ProcessIdentity,
  parseIdentity,
  selfIdentity,
} from "../common/processes.js";
import type { StepTiming } from "./progress.js";
import { type ImageTemplate, RECIPE_HASH_PATTERN, type Recipe, recipeHash } from "./recipe.js";

export const IMAGE_FILES = {
  kernel: "vmlinuz",
  initrd: "initrd.img",
  probeInitrd: "probe-initrd.img",
  rootfs: "rootfs.ext4",
  manifest: "image.json",
} as const;

/** 2: every file has a sha256 (the root filesystem too) and `origin` says where the image came from. */
export const MANIFEST_FORMAT = 2;

export interface ImageManifest {
  format: typeof MANIFEST_FORMAT;
  hash: string;
  /** Random per build: tells apart two builds of one recipe (e.g. after a forced rebuild). */
  buildId: string;
  builtAt: string;
  buildSeconds: number;
  recipe: Recipe;
  kernel: { release: string; package: string; version: string; cmdline: string };
  /** Modules the boot initramfs loads, in order. */
  modules: string[];
  rootfs: { uuid: string; usedMib: number; diskMib: number; packages: string[] };
  /** Size and sha256 of every file, checked when the image is imported and before it is used. */
  files: Record<string, { size: number; sha256: string }>;
  /** "built" here from its recipe, or "imported" from a pack (then only that pack's snapshots use it). */
  origin: "built" | "imported";
  /** Format 2: the base and each build step of the build that made this image, cached or how long it took. */
  steps?: StepTiming[];
  /** Format 2: the image's environment, working directory and user after the last step. */
  settings?: { env: Record<string, string>; workdir: string; user: string };
}

export interface BuiltImage {
  dir: string;
  hash: string;
  kernel: string;
  initrd: string;
  probeInitrd: string;
  rootfs: string;
  template: ImageTemplate;
  manifest: ImageManifest;
  /** True when the image came from the cache rather than from this call's build. */
  cached: boolean;
  /** Format 2, built by this call: each base/step, cached or how long it took. */
  steps?: StepTiming[];
}

const MAX_MANIFEST_BYTES = 1024 * 1024;

/** The image in `<cacheDir>/<hash>` if it is complete and consistent, else undefined. */
export async function readImageDir(cacheDir: string, hash: string): Promise<BuiltImage | undefined> {
  if (!RECIPE_HASH_PATTERN.test(hash)) throw new ForkdError("invalid_argument", `invalid image hash ${hash}`);
  const dir = path.join(cacheDir, hash);
  let manifest: ImageManifest;
  try {
    const file = path.join(dir, IMAGE_FILES.manifest);
    const st = await fs.stat(file);
    if (st.size > MAX_MANIFEST_BYTES) return undefined;
    manifest = JSON.parse(await fs.readFile(file, "utf8")) as ImageManifest;
  } catch {
    return undefined;
  }
  if (manifest.format !== MANIFEST_FORMAT || manifest.hash !== hash) return undefined;
  if (typeof manifest.recipe !== "object" || recipeHash(manifest.recipe) !== hash) return undefined;
  if (manifest.origin !== "built" && manifest.origin !== "imported") return undefined;
  for (const name of Object.values(IMAGE_FILES)) {
    if (name === IMAGE_FILES.manifest) continue;
    const recorded = manifest.files?.[name];
    if (typeof recorded?.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(recorded.sha256)) return undefined;
    const st = await fs.stat(path.join(dir, name)).catch(() => undefined);
    if (!st?.isFile() || st.size !== recorded.size) return undefined;
  }
  return {
    dir,
    hash,
    kernel: path.join(dir, IMAGE_FILES.kernel),
    initrd: path.join(dir, IMAGE_FILES.initrd),
    probeInitrd: path.join(dir, IMAGE_FILES.probeInitrd),
    rootfs: path.join(dir, IMAGE_FILES.rootfs),
    template: manifest.recipe.template,
    manifest,
    cached: true,
  };
}

/**
 * Where images imported from packs live, one directory per build. A pack's image.json can claim any recipe hash,
 * a genuine template's included; kept apart from `<images>/<hash>`, an imported image can never be taken for
 * the image a build of that template would make (image cache poisoning), while the snapshots that came with it
 * still find the exact build their disk layers were made on.
 */
export function importedImagesDir(cacheDir: string, buildId: string): string {
  const key = createHash("sha256").update(buildId).digest("hex").slice(0, 32);
  return path.join(cacheDir, ".imported", key);
}

export interface Staging {
  dir: string;
  /** Becomes `<cacheDir>/<hash>`. */
  out: string;
  /** Scratch space: extracted packages, the root filesystem tree, mmdebstrap's temp files. */
  work: string;
}

export async function createStaging(cacheDir: string, hash: string): Promise<Staging> {
  await fs.mkdir(cacheDir, { recursive: true, mode: 0o755 });
  const dir = path.join(
    cacheDir,
    `.staging-${hash.slice(0, 16)}-${process.pid}-${randomBytes(4).toString("hex")}`,
  );
  // Root's only: image trees are built in it (setuid files included), and no local user may reach them.
  await fs.mkdir(dir, { mode: 0o700 });
  await fs.writeFile(path.join(dir, "owner.json"), identityJson(selfIdentity()));
  const staging = { dir, out: path.join(dir, "out"), work: path.join(dir, "work") };
  await fs.mkdir(staging.out, { mode: 0o755 });
  await fs.mkdir(staging.work, { mode: 0o755 });
  return staging;
}

/** Refuses to delete a tree that has anything mounted inside it (it would reach into the mounted filesystem). */
async function assertNothingMountedUnder(dir: string): Promise<void> {
  const mountinfo = await fs.readFile("/proc/self/mountinfo", "utf8").catch(() => "");
  for (const line of mountinfo.split("\n")) {
    const mountPoint = line
      .split(" ")[4]
      ?.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    if (mountPoint && (mountPoint === dir || mountPoint.startsWith(`${dir}/`))) {
      throw new ForkdError("internal", `not removing ${dir}: ${mountPoint} is mounted inside it`);
    }
  }
}

export async function removeStaging(dir: string): Promise<void> {
  await assertNothingMountedUnder(dir);
  await fs.rm(dir, { recursive: true, force: true, maxRetries: 3 });
}

/** Removes staging directories whose owning process is gone. */
export async function sweepStaleStaging(cacheDir: string): Promise<string[]> {
  const entries = await fs.readdir(cacheDir).catch(() => [] as string[]);
  const removed: string[] = [];
  for (const name of entries) {
    if (!name.startsWith(".staging-")) continue;
    const dir = path.join(cacheDir, name);
    let owner: ProcessIdentity | null = null;
    try {
      owner = parseIdentity(JSON.parse(await fs.readFile(path.join(dir, "owner.json"), "utf8")));
    } catch {
      // owner.json is written right after mkdir; a very young directory without it may be mid-creation
      const st = await fs.stat(dir).catch(() => undefined);
      if (!st || Date.now() - st.mtimeMs < 60_000) continue;
    }
    if (owner && (await isAlive(owner))) continue; // still building
    await removeStaging(dir);
    removed.push(dir);
  }
  return removed;
}

/** Flushes every file of `dir` and `dir` itself, so a rename after this never publishes unwritten data. */
async function syncDir(dir: string): Promise<void> {
  for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
    if (entry.isFile()) await fsyncPath(path.join(dir, entry.name));
  }
  await fsyncPath(dir);
}

export type PublishResult = "published" | "lost-race";

/**
 * Renames `staging.out` to `<cacheDir>/<hash>`. If a complete image is already there (another build of the
 * same recipe published first), ours is discarded ("lost-race") unless `force`; a replaced or broken image is
 * moved into our staging directory, to be removed with it.
 */
export async function publish(
  staging: Staging,
  cacheDir: string,
  hash: string,
  force: boolean,
): Promise<PublishResult> {
  const target = path.join(cacheDir, hash);
  await syncDir(staging.out);
  try {
    await fs.rename(staging.out, target);
    await fsyncPath(cacheDir);
    return "published";
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENOTEMPTY" && code !== "EEXIST") throw err;
  }
  if (!force && (await readImageDir(cacheDir, hash))) return "lost-race";
  try {
    await fs.rename(target, path.join(staging.dir, "replaced"));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  try {
    await fs.rename(staging.out, target);
    await fsyncPath(cacheDir);
    return "published";
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOTEMPTY" || code === "EEXIST") return "lost-race";
    throw err;
  }
}

/**
 * The built image whose kernel and root filesystem are `kernel` and `rootfs` (forkd v0.5 clients name a snapshot's
 * guest by these two host paths). Both must resolve, symlinks followed, to the vmlinuz and rootfs.ext4 of one
 * complete image directly under one of `allowedDirs` (image caches: `<dir>/<hash>/...`); anything else is refused
 * with `invalid_argument` naming the rule, so a caller cannot make the daemon (root) boot or read an arbitrary file.
 */
export async function imageOfFiles(
  files: { kernel: string; rootfs: string },
  allowedDirs: readonly string[],
): Promise<BuiltImage> {
  const allowed = await Promise.all(allowedDirs.map((d) => fs.realpath(d).catch(() => path.resolve(d))));
  const shown = allowed.join(", ");
  const rule =
    `kernel and rootfs must be the ${IMAGE_FILES.kernel} and ${IMAGE_FILES.rootfs} of one forkd image under an ` +
    `allowed image directory (${shown}; the daemon's --allow-image-dir adds more). forkd builds guests from ` +
    'templates: send {"tag": ..., "template": ...} (see `forkd image ls`)';
  const located: { dir: string; hash: string }[] = [];
  for (const [what, file, expected] of [
    ["kernel", files.kernel, IMAGE_FILES.kernel],
    ["rootfs", files.rootfs, IMAGE_FILES.rootfs],
  ] as const) {
    if (!path.isAbsolute(file) || file.includes("\0")) {
      throw new ForkdError(
        "invalid_argument",
        `${what} ${JSON.stringify(file)} is not an absolute path; ${rule}`,
      );
    }
    const real = await fs.realpath(file).catch(() => undefined);
    if (real === undefined) {
      throw new ForkdError("invalid_argument", `${what} ${JSON.stringify(file)} does not exist; ${rule}`);
    }
    const match = allowed
      .map((dir) => ({ dir, rel: path.relative(dir, real).split(path.sep) }))
      .find(
        ({ rel }) => rel.length === 2 && RECIPE_HASH_PATTERN.test(rel[0] as string) && rel[1] === expected,
      );
    if (!match)
      throw new ForkdError("invalid_argument", `${what} ${JSON.stringify(file)} is not allowed: ${rule}`);
    located.push({ dir: match.dir, hash: match.rel[0] as string });
  }
  const [kernel, rootfs] = located as [{ dir: string; hash: string }, { dir: string; hash: string }];
  if (kernel.dir !== rootfs.dir || kernel.hash !== rootfs.hash) {
    throw new ForkdError("invalid_argument", `kernel and rootfs belong to different images; ${rule}`);
  }
  const image = await readImageDir(kernel.dir, kernel.hash);
  if (!image) {
    throw new ForkdError(
      "invalid_argument",
      `${path.join(kernel.dir, kernel.hash)} is not a complete forkd image (being built, or damaged); ${rule}`,
    );
  }
  return image;
}
