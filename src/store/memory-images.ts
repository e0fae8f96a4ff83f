/**
 * The flat RAM image children of a snapshot map MAP_PRIVATE. A flat snapshot is its own image. A chain ending in
 * diff layers is assembled once — the nearest flat ancestor copied, then every layer above it applied in order —
 * and cached by the head's manifest digest, so every later child maps the same file and shares its pages.
 * Images on tmpfs (`inMemory`) are what live BRANCH needs: userfaultfd write-protection works on MAP_PRIVATE shmem.
 */

import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmod, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { ForkdError } from "../common/errors.js";
import { ensurePrivateDir } from "../common/private-dir.js";
import { manifestDigest } from "./chain.js";
import { digestFile } from "./hash.js";
import { applyMemoryLayer } from "./memory-layer.js";
import type { StoredSnapshot } from "./snapshot-store.js";
import type { FileVerifier } from "./verify.js";

export const FLAT_MEMORY_FILE = "memory.bin";
export const LAYER_MEMORY_FILE = "memory.layer";

export interface MemoryImageOptions {
  /** Directory for assembled images on disk. */
  cacheDir: string;
  /** Directory for images on tmpfs (used when `inMemory`). */
  tmpfsDir: string;
  /** Put the image on tmpfs even for a flat snapshot (a copy), so children can be live-branched. */
  inMemory?: boolean;
  /**
   * Checks an assembled image against the sha256 recorded when it was made before it is reused (cheap when
   * unchanged, see verify.ts); without one an existing image of the right size is trusted.
   */
  verifier?: FileVerifier;
}

/** Beside each assembled image: its sha256, written when it was made. */
const DIGEST_SUFFIX = ".sha256";

/** Memory files of `chain` a child's RAM depends on: from the nearest flat snapshot up to the head. */
export function memoryFilesOf(
  chain: StoredSnapshot[],
): { snapshot: StoredSnapshot; file: string; name: string }[] {
  const root = lastFlatIndex(chain);
  return chain.slice(root).map((snapshot) => {
    const name = snapshot.manifest.memory.format === "flat" ? FLAT_MEMORY_FILE : LAYER_MEMORY_FILE;
    return { snapshot, file: path.join(snapshot.dir, name), name };
  });
}

const execFileAsync = promisify(execFile);

const building = new Map<string, Promise<string>>();

/** Path of the flat image for the head of `chain` (root first), assembling and caching it if needed. */
export async function flatImageFor(chain: StoredSnapshot[], options: MemoryImageOptions): Promise<string> {
  const head = chain[chain.length - 1];
  if (!head) throw new ForkdError("internal", "empty snapshot chain");
  if (head.manifest.memory.format === "flat" && !options.inMemory)
    return path.join(head.dir, FLAT_MEMORY_FILE);
  const dir = options.inMemory ? options.tmpfsDir : options.cacheDir;
  // Proven ours before anything in it is trusted (see common/private-dir.ts).
  await ensurePrivateDir(dir);
  const target = assembledImagePath(dir, head.tag, await manifestDigest(head));
  const ready = await stat(target).then(
    (st) => st.size === head.manifest.memory.ramBytes,
    () => false,
  );
  if (ready && (await isIntact(target, options.verifier))) return target;
  let pending = building.get(target);
  if (!pending) {
    pending = assemble(chain, target, options.inMemory === true, options.verifier).finally(() =>
      building.delete(target),
    );
    building.set(target, pending);
  }
  return pending;
}

async function assemble(
  chain: StoredSnapshot[],
  target: string,
  inMemory: boolean,
  verifier: FileVerifier | undefined,
): Promise<string> {
  const files = memoryFilesOf(chain);
  const base = files[0];
  if (base?.snapshot.manifest.memory.format !== "flat") {
    throw new ForkdError("unprocessable", `snapshot chain has no flat memory image at its root`);
  }
  await ensurePrivateDir(path.dirname(target));
  const staging = `${target}.${process.pid}-${randomBytes(4).toString("hex")}.partial`;
  try {
    // On disk the image stays sparse (RAM the guest never touched stays a hole) and is reflinked where the
    // filesystem can. On tmpfs it is allocated in full: a live BRANCH's background snapshot reads every page,
    // and allocating holes then would happen inside the source's pause.
    const sparse = inMemory ? "--sparse=never" : "--sparse=always";
    await execFileAsync("cp", [sparse, "--reflink=auto", "--", base.file, staging]);
    for (const layer of files.slice(1)) {
      if (layer.snapshot.manifest.memory.format === "flat") {
        throw new ForkdError("internal", "a flat snapshot above the chosen base");
      }
      await applyMemoryLayer(layer.file, staging);
    }
    await chmod(staging, 0o444);
    const { sha256 } = await digestFile(staging);
    await writeFile(`${target}${DIGEST_SUFFIX}`, `${sha256}\n`, { mode: 0o600 });
    await rename(staging, target);
    await verifier?.remember(target, sha256);
    return target;
  } finally {
    await rm(staging, { force: true });
  }
}

/**
 * Whether a cached image still has the content it was made with. An image without a recorded digest (made by an
 * older forkd) or with another content is removed, so the caller assembles it again.
 */
async function isIntact(target: string, verifier: FileVerifier | undefined): Promise<boolean> {
  if (!verifier) return true;
  const recorded = await readFile(`${target}${DIGEST_SUFFIX}`, "utf8").then(
    (text) => text.trim(),
    () => "",
  );
  if (/^[0-9a-f]{64}$/.test(recorded)) {
    try {
      await verifier.verify(target, recorded, `assembled RAM image ${path.basename(target)}`);
      return true;
    } catch {
      // Changed behind our back: made again below.
    }
  }
  await rm(target, { force: true });
  await rm(`${target}${DIGEST_SUFFIX}`, { force: true });
  return false;
}

function lastFlatIndex(chain: StoredSnapshot[]): number {
  for (let i = chain.length - 1; i >= 0; i--) {
    if (chain[i]?.manifest.memory.format === "flat") return i;
  }
  throw new ForkdError(
    "unprocessable",
    `snapshot ${chain[chain.length - 1]?.tag}: no flat memory image in its chain`,
  );
}

/** Where the assembled image of the snapshot `tag` whose manifest digest is `digest` lives in `dir`. */
export function assembledImagePath(dir: string, tag: string, digest: string): string {
  return path.join(dir, `${tag}-${digest.slice(0, 32)}.bin`);
}

/** Removes an assembled image and its recorded digest (no error if there is none). */
export async function removeAssembledImage(dir: string, tag: string, digest: string): Promise<void> {
  const image = assembledImagePath(dir, tag, digest);
  await rm(image, { force: true });
  await rm(`${image}${DIGEST_SUFFIX}`, { force: true });
}
