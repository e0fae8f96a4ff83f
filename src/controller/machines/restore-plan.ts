/**
 * Everything children of one snapshot share, prepared once per spawn: the checked chain, its verified files,
 * the flat RAM image they map, and an empty disk overlay each child copies.
 */

import { createHash, randomBytes } from "node:crypto";
import { access, mkdir, readFile, rm, rmdir } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { unguessableDirName } from "../../common/private-dir.js";
import { selfOwnerToken } from "../../common/processes.js";
import { type BuiltImage, readImageDir } from "../../image/index.js";
import { resolveChain } from "../../store/chain.js";
import { flatImageFor, type MemoryImageOptions, memoryFilesOf } from "../../store/memory-images.js";
import { SnapshotStore, type StoredSnapshot } from "../../store/snapshot-store.js";
import { FileVerifier } from "../../store/verify.js";
import { restoreCompatibilityKey } from "../../vmm/qemu-args.js";
import { createOverlay } from "../../vmm/qemu-tools.js";
import { childSpec, SNAPSHOT_FILES } from "./machine.js";

export interface RestorePlan {
  /** The snapshot children restore (the head of its chain). */
  snapshot: StoredSnapshot;
  /** Root first. */
  chain: StoredSnapshot[];
  /** The flat RAM image children map MAP_PRIVATE. */
  memoryImage: string;
  /** The snapshot whose RAM `memoryImage` is: the head for a spawn, an ancestor for a resume (see below). */
  memoryTag: string;
  /**
   * Memory layers of the chain above `memoryTag`, oldest first: each child gets their pages written into its RAM
   * before its device state loads (a resumed sandbox maps the image it was spawned on and gets its own pages
   * back, instead of an image assembled for it alone). Empty for a spawn.
   */
  pageLayers: string[];
  /** True when the image is on tmpfs: children can then be live-branched. */
  inMemory: boolean;
  /** An empty qcow2 overlay over the head's disk layer, copied for each child. */
  overlayTemplate: string;
  /** Removes the overlay template. */
  dispose(): Promise<void>;
}

export function cacheDirs(paths: ForkdPaths) {
  return {
    cacheDir: path.join(paths.home, "cache", "memory"),
    tmpfsDir: unguessableDirName(
      process.env.FORKD_TMPFS ?? "/dev/shm",
      `forkd-${homeKey(paths.home)}-`,
      path.join(paths.home, "cache", "tmpfs-dir"),
    ),
    verifiedDir: path.join(paths.home, "cache"),
  };
}

/** Where assembled RAM images go, checked against their recorded digests before they are reused. */
export function memoryImageOptions(paths: ForkdPaths, inMemory = false): MemoryImageOptions {
  const dirs = cacheDirs(paths);
  return {
    cacheDir: dirs.cacheDir,
    tmpfsDir: dirs.tmpfsDir,
    inMemory,
    verifier: new FileVerifier(dirs.verifiedDir),
  };
}

/** Where overlay templates are made: two levels under FORKD_HOME, like run/<id>/ and snapshots/<tag>/. */
function templatesDir(paths: ForkdPaths): string {
  return path.join(paths.home, "run", ".templates");
}

export interface PrepareRestoreOptions {
  /** Map the RAM image from tmpfs (live BRANCH needs shmem). */
  inMemory?: boolean;
  /**
   * Map the RAM image of this snapshot of the chain instead of the head's, and write the layers above it into
   * the child (a resume: the sandbox keeps mapping what it was spawned on). A flat layer above it is used instead.
   */
  memoryTag?: string;
}

export async function prepareRestore(
  paths: ForkdPaths,
  tagOrSnapshot: string | StoredSnapshot,
  options: PrepareRestoreOptions = {},
): Promise<RestorePlan> {
  const store = new SnapshotStore(paths.snapshots);
  const tag = typeof tagOrSnapshot === "string" ? tagOrSnapshot : tagOrSnapshot.tag;
  const chain = await resolveChain(store, tag);
  const snapshot = chain[chain.length - 1] as StoredSnapshot;
  const problem = await snapshotIsBootable(snapshot);
  if (problem) throw new ForkdError("conflict", `snapshot ${tag} is not bootable: ${problem}`);
  const instance = { runDir: paths.run, memoryFile: "/m", shared: false, disk: "/d", restoreFrom: "/s" };
  if (
    restoreCompatibilityKey(childSpec(snapshot.manifest, instance)) !== snapshot.manifest.machine.compatKey
  ) {
    throw new ForkdError(
      "conflict",
      `snapshot ${tag} was taken on a different machine configuration (an older forkd?); children cannot load its state. Rebuild it`,
    );
  }
  await verifyChainFiles(paths, chain);
  const memoryBase = memoryBaseIndex(chain, options.memoryTag);
  const memoryImage = await flatImageFor(
    chain.slice(0, memoryBase + 1),
    memoryImageOptions(paths, options.inMemory),
  );
  const pageLayers = chain
    .slice(memoryBase + 1)
    .map((layer) => path.join(layer.dir, SNAPSHOT_FILES.memoryLayer));
  const overlayTemplate = path.join(
    templatesDir(paths),
    `${tag}-${selfOwnerToken()}-${randomBytes(4).toString("hex")}.qcow2`,
  );
  // Plans of this process keep the shared directory: a spawn finishing must not remove it while another is
  // about to write its template there (two E2B creates at once hit that).
  plansInProgress++;
  try {
    await makeOverlayTemplate(paths, snapshot.tag, overlayTemplate);
  } catch (err) {
    plansInProgress--;
    throw err;
  }
  let disposed = false;
  return {
    snapshot,
    chain,
    memoryImage,
    memoryTag: (chain[memoryBase] as StoredSnapshot).tag,
    pageLayers,
    inMemory: options.inMemory ?? false,
    overlayTemplate,
    dispose: async () => {
      if (disposed) return;
      disposed = true;
      plansInProgress--;
      await rm(overlayTemplate, { force: true });
      // The directory goes too once no spawn is using it (rmdir also fails while another process has entries).
      if (plansInProgress === 0) await rmdir(templatesDir(paths)).catch(() => {});
    },
  };
}

/**
 * Which layer of `chain` children map the RAM image of: the head, or `memoryTag` (not_found if it is not in the
 * chain), or the last flat layer above it (layers above a flat one do not need what is below it).
 */
function memoryBaseIndex(chain: StoredSnapshot[], memoryTag: string | undefined): number {
  if (memoryTag === undefined) return chain.length - 1;
  const at = chain.findIndex((s) => s.tag === memoryTag);
  if (at < 0) {
    throw new ForkdError(
      "conflict",
      `snapshot ${memoryTag} is not in the chain of ${chain[chain.length - 1]?.tag}: cannot map its RAM image`,
    );
  }
  let base = at;
  for (let i = at + 1; i < chain.length; i++) {
    if ((chain[i] as StoredSnapshot).manifest.memory.format === "flat") base = i;
  }
  return base;
}

/**
 * The image a snapshot was made on, with every file verified (cheaply, see store/verify.ts) against the sha256
 * its image.json recorded: a kernel, initrd or root filesystem changed behind forkd's back is refused before a VM
 * boots or restores on it. `conflict` if the image is gone, incomplete or another build.
 */
export async function verifyImage(
  paths: ForkdPaths,
  image: { hash: string; buildId: string; rootfs: string },
): Promise<BuiltImage> {
  const dir = path.dirname(image.rootfs);
  const found = await readImageDir(path.dirname(dir), path.basename(dir));
  if (!found || found.hash !== image.hash || found.manifest.buildId !== image.buildId) {
    throw new ForkdError(
      "conflict",
      `image ${image.hash.slice(0, 12)} (build ${image.buildId}) is no longer cached complete; it was removed or rebuilt`,
    );
  }
  const verifier = new FileVerifier(cacheDirs(paths).verifiedDir);
  for (const [name, recorded] of Object.entries(found.manifest.files)) {
    await verifier.verify(path.join(dir, name), recorded.sha256, `image ${image.hash.slice(0, 12)}`);
  }
  return found;
}

/** Records that a just-built image's files have the hashes its build computed (no second hashing pass). */
export async function trustFreshImage(paths: ForkdPaths, image: BuiltImage): Promise<void> {
  const verifier = new FileVerifier(cacheDirs(paths).verifiedDir);
  for (const [name, recorded] of Object.entries(image.manifest.files)) {
    await verifier.remember(path.join(image.dir, name), recorded.sha256);
  }
}

/**
 * Records that a just-published layer's files have the digests its writer computed, so the resume right after a
 * pause does not hash its 100 MiB again (the files are read-only from now on; a change would show in their stat).
 */
export async function trustPauseLayer(paths: ForkdPaths, layer: StoredSnapshot): Promise<void> {
  const verifier = new FileVerifier(cacheDirs(paths).verifiedDir);
  await verifier.rememberAll(
    Object.entries(layer.manifest.files).map(([name, f]) => ({
      file: path.join(layer.dir, name),
      sha256: f.sha256,
    })),
  );
}

/** Restore plans of this process not yet disposed. */
let plansInProgress = 0;

/**
 * The empty overlay every child of `tag` copies. Relative backing: the overlay is copied to run/<id>/disk.qcow2,
 * two levels under FORKD_HOME like this directory, and a branch later hard-links it into snapshots/<tag>/, also
 * two levels down. Tried once more when the directory vanished under it (another process's spawn removed it).
 */
async function makeOverlayTemplate(paths: ForkdPaths, tag: string, overlay: string): Promise<void> {
  const spec = {
    backing: path.join("..", "..", "snapshots", tag, SNAPSHOT_FILES.disk),
    backingFormat: "qcow2",
    overlay,
  } as const;
  for (let attempt = 1; ; attempt++) {
    await mkdir(templatesDir(paths), { recursive: true, mode: 0o700 });
    try {
      await createOverlay(spec);
      return;
    } catch (err) {
      const vanished = await access(templatesDir(paths)).then(
        () => false,
        () => true,
      );
      if (!vanished || attempt >= 2) throw err;
    }
  }
}

/** Verifies (cheaply, see store/verify.ts) every file a child of `chain`'s head reads, its image's too. */
export async function verifyChainFiles(paths: ForkdPaths, chain: StoredSnapshot[]): Promise<void> {
  const verifier = new FileVerifier(cacheDirs(paths).verifiedDir);
  await verifyImage(paths, (chain[chain.length - 1] as StoredSnapshot).manifest.image);
  const head = chain[chain.length - 1] as StoredSnapshot;
  const needed: { snapshot: StoredSnapshot; name: string }[] = [
    ...memoryFilesOf(chain).map(({ snapshot, name }) => ({ snapshot, name })),
    { snapshot: head, name: SNAPSHOT_FILES.deviceState },
    ...chain.map((snapshot) => ({ snapshot, name: SNAPSHOT_FILES.disk })),
  ];
  for (const { snapshot, name } of needed) {
    const expected = snapshot.manifest.files[name];
    if (!expected)
      throw new ForkdError("unprocessable", `snapshot ${snapshot.tag}: manifest lists no ${name}`);
    await verifier.verify(path.join(snapshot.dir, name), expected.sha256, `snapshot ${snapshot.tag}`);
  }
}

/** Why `snapshot` cannot be restored right now (its image is gone or was rebuilt), or null if it can. */
export async function snapshotIsBootable(snapshot: StoredSnapshot): Promise<string | null> {
  for (const file of [
    snapshot.manifest.image.kernel,
    snapshot.manifest.image.initrd,
    snapshot.manifest.image.rootfs,
  ]) {
    const missing = await access(file).then(
      () => false,
      () => true,
    );
    if (missing) return `${file} is missing (image cache cleared? rebuild the image and the snapshot)`;
  }
  const imageJson = path.join(path.dirname(snapshot.manifest.image.rootfs), "image.json");
  const buildId = await readFile(imageJson, "utf8").then(
    (text) => (JSON.parse(text) as { buildId?: unknown }).buildId,
    () => undefined,
  );
  if (buildId !== snapshot.manifest.image.buildId) {
    return `its image ${snapshot.manifest.image.hash.slice(0, 12)} was rebuilt since the snapshot was taken; rebuild the snapshot`;
  }
  return null;
}

/** Distinguishes the tmpfs caches of different FORKD_HOMEs on one host. */
export function homeKey(home: string): string {
  return createHash("sha256").update(home).digest("hex").slice(0, 12);
}
