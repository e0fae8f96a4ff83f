/**
 * The image cache: one directory per recipe hash, published by renaming a complete staging directory into
 * place, so a reader sees either a whole image or none. Staging directories record their owner process;
 * those of dead owners (a crashed or killed build) are swept before the next build.
 *
 *   <images>/<hash>/{vmlinuz, initrd.img, probe-initrd.img, rootfs.ext4, image.json}
 *   <images>/.staging-<hash prefix>-<pid>-<random>/{owner.json, out/, work/}
 *   <images>/.boot/<kernel+busybox key>/{vmlinuz, initrd.img, probe-initrd.img, boot.json}  (see boot.ts)
 *   <images>/.apt-resolution.json
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { fsyncPath } from "../common/durable-fs.js";
import { ForkdError } from "../common/errors.js";
import type { StepTiming } from "./progress.js";
import { type ImageTemplate, RECIPE_HASH_PATTERN, type Recipe, recipeHash } from "./recipe.js";

export const IMAGE_FILES = {
  kernel: "vmlinuz",
  initrd: "initrd.img",
  probeInitrd: "probe-initrd.img",
  rootfs: "rootfs.ext4",
  manifest: "image.json",
} as const;

export const MANIFEST_FORMAT = 1;

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
  /** Size of every file; sha256 of all but the (large, sparse) root filesystem image. */
  files: Record<string, { size: number; sha256?: string }>;
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
  for (const name of Object.values(IMAGE_FILES)) {
    if (name === IMAGE_FILES.manifest) continue;
    const st = await fs.stat(path.join(dir, name)).catch(() => undefined);
    if (!st?.isFile() || st.size !== manifest.files?.[name]?.size) return undefined;
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

async function processStartTime(pid: number): Promise<string | undefined> {
  try {
    const stat = await fs.readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

interface StagingOwner {
  pid: number;
  startTime: string | undefined;
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
  // Traversable by all: apt downloads into it as the unprivileged _apt user.
  await fs.mkdir(dir, { mode: 0o755 });
  const owner: StagingOwner = { pid: process.pid, startTime: await processStartTime(process.pid) };
  await fs.writeFile(path.join(dir, "owner.json"), JSON.stringify(owner));
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
    let owner: StagingOwner | undefined;
    try {
      owner = JSON.parse(await fs.readFile(path.join(dir, "owner.json"), "utf8")) as StagingOwner;
    } catch {
      // owner.json is written right after mkdir; a very young directory without it may be mid-creation
      const st = await fs.stat(dir).catch(() => undefined);
      if (!st || Date.now() - st.mtimeMs < 60_000) continue;
    }
    if (owner && Number.isInteger(owner.pid) && owner.pid > 0) {
      const startTime = await processStartTime(owner.pid);
      if (startTime !== undefined && startTime === owner.startTime) continue; // still building
    }
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
