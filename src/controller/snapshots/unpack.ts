/**
 * Unpack: a pack (pack.ts) installed on this host or home, from one archive file or a registry artifact's
 * blobs (registry.ts). A pack is hostile input to the daemon that runs as root: every entry is checked against
 * the pack manifest as it streams past (unpack-checks.ts), every hash is verified, disk layers are held to
 * forkd's own shape, and nothing becomes visible until all of it checked out; then the layers are published
 * root first, all or none.
 */

import { chmod, mkdir, readFile, rename, rm, stat, symlink } from "node:fs/promises";
import path from "node:path";
import { isDeepStrictEqual } from "node:util";
import { crashPoint } from "../../common/crash-points.js";
import { fsyncPath, writeDurably } from "../../common/durable-fs.js";
import { conflict, ForkdError, invalidArgument, notFound } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { createStaging, publish, removeStaging, type Staging } from "../../image/cache.js";
import {
  type BuiltImage,
  IMAGE_FILES,
  type ImageManifest,
  importedImagesDir,
  readImage,
  readImageDir,
} from "../../image/index.js";
import { MANIFEST_FILE, type SnapshotManifest } from "../../store/manifest.js";
import { readLayerIndex } from "../../store/memory-layer.js";
import {
  type ArchiveEntry,
  type ReadArchiveOptions,
  readArchive,
  SparseHashWriter,
} from "../../store/pack-archive.js";
import {
  classifyPackPath,
  imagePackPath,
  MAX_PACK_MANIFEST_BYTES,
  PACK_MANIFEST_PATH,
  type PackFile,
  type PackManifest,
  parsePackManifest,
} from "../../store/pack-format.js";
import { assertLayerShape, readQcow2Header } from "../../store/qcow2-header.js";
import { type DiskReservation, SnapshotStore } from "../../store/snapshot-store.js";
import { FileVerifier } from "../../store/verify.js";
import { qemuVersion } from "../../vmm/qemu-tools.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import { cacheDirs } from "../machines/restore-plan.js";
import type { UnpackResult } from "../sandbox-service.js";
import { descendantsOf, loadGraph, qemusUsing, removeAssembledImages } from "./chains.js";
import { IMAGE_PACK_FILES } from "./pack.js";
import {
  checkedLayerManifest,
  checkHash,
  checkLayersComplete,
  checkPackedFileList,
  checkPackedFiles,
  checkPackedImageManifest,
  digestOf,
  MAX_LAYER_MANIFEST_BYTES,
  readAll,
  refused,
  restoreKey,
} from "./unpack-checks.js";

/**
 * Where a pack's entries come from: one archive file (`unpack`), or a registry artifact whose blobs are each
 * an archive of some of them (`pull`). Either way the pack manifest comes first and the entries follow in
 * pack order, so the same session checks them.
 */
export interface PackSource {
  /** How errors and progress name it. */
  name: string;
  read(
    onEntry: (entry: ArchiveEntry) => Promise<"continue" | "stop">,
    options: ReadArchiveOptions,
  ): Promise<void>;
}

export function archiveFileSource(file: string): PackSource {
  return { name: file, read: (onEntry, options) => readArchive(file, onEntry, options) };
}

export interface UnpackOptions {
  /** A pack file, or `source`. */
  file?: string;
  source?: PackSource;
  /** Install the head under this tag (its ancestors keep theirs). */
  tag?: string;
  /** Replace existing snapshots of the same tags that differ from the packed ones. */
  force?: boolean;
  /** Sandboxes the daemon knows to depend on a tag (as for rmi); running QEMUs are found regardless. */
  sandboxesOf?: (tag: string) => string[];
  signal?: AbortSignal;
  onProgress?: (message: string) => void;
}

type LayerFate = "install" | "reuse" | "replace";

interface Layer {
  packedTag: string;
  tag: string;
  packedManifest: Buffer;
  manifest: SnapshotManifest;
  /** The manifest as installed here (image paths of this host, tag, parent digest) and its digest. */
  installedManifest: Buffer;
  installedDigest: string;
  fate: LayerFate;
}

export async function unpackSnapshot(paths: ForkdPaths, options: UnpackOptions): Promise<UnpackResult> {
  const started = performance.now();
  const newHeadTag = options.tag === undefined ? undefined : assertTag(options.tag);
  const progress = options.onProgress ?? (() => {});
  let source = options.source;
  if (!source) {
    if (options.file === undefined) throw invalidArgument("unpack needs a pack file");
    const file = path.resolve(options.file);
    const fileStat = await stat(file).catch(() => null);
    if (!fileStat?.isFile()) throw notFound(`pack ${file} not found (or not a file)`);
    source = archiveFileSource(file);
  }

  const store = new SnapshotStore(paths.snapshots);
  await store.sweepStale();
  const staging = await store.makeStagingDir("unpack");
  const session = new UnpackSession(paths, store, staging, newHeadTag, options, progress);
  try {
    await session.read(source);
    crashPoint("unpack.read");
    await session.install();
  } finally {
    await session.cleanup();
  }
  const head = session.layers[session.layers.length - 1] as Layer;
  return {
    head: head.tag,
    chain: session.layers.map((l) => l.tag),
    installed: session.layers.filter((l) => l.fate !== "reuse").map((l) => l.tag),
    reused: session.layers.filter((l) => l.fate === "reuse").map((l) => l.tag),
    replaced: session.layers.filter((l) => l.fate === "replace").map((l) => l.tag),
    orphaned: session.orphaned,
    image: session.imageStaging ? "installed" : "present",
    content_bytes: session.contentBytes,
    ms: Math.round(performance.now() - started),
  };
}

class UnpackSession {
  pack: PackManifest | undefined;
  layers: Layer[] = [];
  orphaned: string[] = [];
  contentBytes = 0;
  imageStaging: Staging | undefined;
  private disk: DiskReservation | undefined;
  private localImage: BuiltImage | undefined;
  private next = 0;
  private readonly seen = new Set<string>();
  private readonly manifestBytes = new Map<string, Buffer>();
  private readonly verifiedFiles: { tag: string; name: string; sha256: string }[] = [];
  private published: { tag: string; displaced: string | null }[] = [];

  constructor(
    private readonly paths: ForkdPaths,
    private readonly store: SnapshotStore,
    private readonly staging: string,
    private readonly newHeadTag: string | undefined,
    private readonly options: UnpackOptions,
    private readonly progress: (message: string) => void,
  ) {}

  // ---- reading ----

  async read(source: PackSource): Promise<void> {
    this.progress(`reading ${source.name}`);
    await source.read((entry) => this.onEntry(entry), {
      signal: this.options.signal,
      maxBytes: () =>
        this.pack
          ? this.pack.files.reduce((n, f) => n + f.size + 8192, 0) + MAX_PACK_MANIFEST_BYTES + 1024 * 1024
          : MAX_PACK_MANIFEST_BYTES + 64 * 1024,
    });
    if (!this.pack) throw new ForkdError("unprocessable", "pack is empty (no forkd-pack.json)");
    if (this.next < this.pack.files.length) {
      throw new ForkdError(
        "unprocessable",
        `pack is incomplete: ${(this.pack.files[this.next] as PackFile).path} and later entries are missing`,
      );
    }
    if (this.layers.length === 0) await this.planLayers();
    await this.checkLayerFiles();
  }

  private async onEntry(entry: ArchiveEntry): Promise<"continue" | "stop"> {
    const where = entry.path === PACK_MANIFEST_PATH ? null : classifyPackPath(entry.path);
    if (entry.type === "directory") {
      if (where?.kind !== "dir") throw refused(entry.path, "unexpected directory");
      return "continue";
    }
    if (this.seen.has(entry.path)) throw refused(entry.path, "duplicate entry");
    this.seen.add(entry.path);
    if (!this.pack) {
      if (entry.path !== PACK_MANIFEST_PATH) {
        throw new ForkdError(
          "unprocessable",
          `not a forkd pack: its first entry is ${JSON.stringify(entry.path)}`,
        );
      }
      if (entry.size > MAX_PACK_MANIFEST_BYTES) throw refused(entry.path, "pack manifest too large");
      this.pack = parsePackManifest((await readAll(entry.body, entry.size)).toString("utf8"));
      await this.checkPackAgainstHost(this.pack);
      return "continue";
    }
    const expected = this.pack.files[this.next];
    if (!expected || where === null || where.kind === "dir") throw refused(entry.path, "unexpected entry");
    if (expected.path !== entry.path) {
      const listed = this.pack.files.some((f) => f.path === entry.path);
      throw refused(entry.path, listed ? `out of order (expected ${expected.path})` : "unexpected entry");
    }
    if (entry.size !== expected.size) {
      throw refused(entry.path, `${entry.size} bytes, the pack manifest says ${expected.size}`);
    }
    this.next++;
    if (where.kind === "snapshot" && where.name === MANIFEST_FILE) {
      if (entry.size > MAX_LAYER_MANIFEST_BYTES) throw refused(entry.path, "manifest too large");
      const bytes = await readAll(entry.body, entry.size);
      checkHash(entry.path, digestOf(bytes), expected);
      this.manifestBytes.set(where.tag, bytes);
    } else {
      if (this.layers.length === 0) await this.planLayers();
      await this.receiveFile(entry.path, where, expected, entry.body);
    }
    this.contentBytes += entry.size;
    // Read on to the end even when everything listed is in: trailing entries are refused too.
    return "continue";
  }

  /** The pack's image and QEMU against this host, before any large entry is read. */
  private async checkPackAgainstHost(pack: PackManifest): Promise<void> {
    const local = await qemuVersion();
    const [major, minor] = pack.qemuVersion.split(".");
    if (major !== String(local.major) || minor !== String(local.minor)) {
      throw conflict(
        `pack was made with QEMU ${pack.qemuVersion}, this host has ${local.version}: its device state needs the same QEMU release`,
      );
    }
    // The exact build the pack's disk layers were made on: built here, or imported by an earlier unpack.
    const built = await readImage(pack.image.hash, { cacheDir: this.paths.images });
    this.localImage =
      built?.manifest.buildId === pack.image.buildId
        ? built
        : await readImageDir(this.importedDir(), pack.image.hash);
    if (!this.localImage && !pack.image.included) {
      throw conflict(
        `pack has no image and image ${pack.image.hash.slice(0, 12)} (build ${pack.image.buildId}) is not cached here`,
      );
    }
    // Everything the pack may write (its files are bounded above): refused now, not when the disk is full.
    this.disk = await this.store.reserveDisk(
      pack.files.reduce((sum, f) => sum + f.size, 0),
      "unpacking the pack",
    );
    if (!this.localImage) {
      const listed = new Set(pack.files.map((f) => f.path));
      const missing = IMAGE_PACK_FILES.filter((name) => !listed.has(imagePackPath(pack.image.hash, name)));
      if (missing.length > 0) {
        throw new ForkdError(
          "unprocessable",
          `pack says it includes its image but lists no ${missing.join(", ")}`,
        );
      }
      this.imageStaging = await createStaging(this.importedDir(), pack.image.hash);
    }
    const head = pack.chain[pack.chain.length - 1]?.tag;
    if (
      this.newHeadTag !== undefined &&
      this.newHeadTag !== head &&
      pack.chain.some((l) => l.tag === this.newHeadTag)
    ) {
      throw invalidArgument(`--tag ${this.newHeadTag} names another layer of the packed chain`);
    }
    checkPackedFileList(pack);
  }

  /**
   * Once every layer's manifest is in: checks the chain (edges, tags, image), decides each layer's fate
   * (install, reuse an identical local copy, replace with --force) and refuses clashes before any big entry.
   */
  private async planLayers(): Promise<void> {
    const pack = this.pack as PackManifest;
    const image = this.imagePaths();
    let parentDigest: string | null = null;
    pack.chain.forEach((link, i) => {
      const bytes = this.manifestBytes.get(link.tag);
      const manifest = checkedLayerManifest(pack, i, bytes);
      const isHead = i === pack.chain.length - 1;
      const tag = isHead && this.newHeadTag !== undefined ? this.newHeadTag : link.tag;
      const installedManifest = installedManifestOf(bytes as Buffer, manifest, { tag, image, parentDigest });
      const installedDigest = digestOf(installedManifest);
      parentDigest = installedDigest;
      this.layers.push({
        packedTag: link.tag,
        tag,
        packedManifest: bytes as Buffer,
        manifest,
        installedManifest,
        installedDigest,
        fate: "install",
      });
    });
    checkPackedFiles(pack, this.layers);
    checkLayersComplete(pack, this.layers);
    await this.decideFates();
  }

  private async decideFates(): Promise<void> {
    const clashes: string[] = [];
    for (const layer of this.layers) {
      if (!(await this.store.exists(layer.tag))) continue;
      const existing = await readFile(path.join(this.store.dirOf(layer.tag), MANIFEST_FILE)).catch(
        () => null,
      );
      if (existing !== null && digestOf(existing) === layer.installedDigest) layer.fate = "reuse";
      else if (this.options.force) layer.fate = "replace";
      else clashes.push(layer.tag);
    }
    if (clashes.length > 0) {
      const one = clashes.length === 1;
      throw conflict(
        `${one ? "snapshot" : "snapshots"} ${clashes.join(", ")} already ${one ? "exists and differs" : "exist and differ"} ` +
          `from the packed ${one ? "one" : "ones"} (--force replaces; --tag installs the head under another name)`,
        { tags: clashes },
      );
    }
  }

  /** Imported images never go where builds look (see importedImagesDir: image cache poisoning). */
  private importedDir(): string {
    return importedImagesDir(this.paths.images, (this.pack as PackManifest).image.buildId);
  }

  private imagePaths(): { rootfs: string; kernel: string; initrd: string } {
    const dir = this.localImage?.dir ?? path.join(this.importedDir(), (this.pack as PackManifest).image.hash);
    return {
      rootfs: path.join(dir, IMAGE_FILES.rootfs),
      kernel: path.join(dir, IMAGE_FILES.kernel),
      initrd: path.join(dir, IMAGE_FILES.initrd),
    };
  }

  private async receiveFile(
    entryPath: string,
    where: { kind: "snapshot"; tag: string; name: string } | { kind: "image"; hash: string; name: string },
    expected: PackFile,
    body: AsyncIterable<Buffer>,
  ): Promise<void> {
    let target: string | null = null;
    if (where.kind === "snapshot") {
      const layer = this.layers.find((l) => l.packedTag === where.tag) as Layer;
      if (layer.fate !== "reuse") {
        await mkdir(path.join(this.staging, layer.tag), { recursive: true, mode: 0o700 });
        target = path.join(this.staging, layer.tag, where.name);
      }
    } else if (this.imageStaging) {
      target = path.join(this.imageStaging.out, where.name);
    }
    // Layers and images already here are only hashed: the pack must still be intact as a whole.
    const writer = await SparseHashWriter.create(target);
    try {
      for await (const chunk of body) {
        if (writer.bytes + chunk.length > expected.size)
          throw refused(entryPath, "longer than its header says");
        await writer.write(chunk);
      }
    } catch (err) {
      await writer.abandon();
      throw err;
    }
    const got = await writer.finish();
    if (got.size !== expected.size)
      throw refused(entryPath, `truncated (${got.size} of ${expected.size} bytes)`);
    checkHash(entryPath, got.sha256, expected);
    if (where.kind === "snapshot" && target) {
      const layer = this.layers.find((l) => l.packedTag === where.tag) as Layer;
      this.verifiedFiles.push({ tag: layer.tag, name: where.name, sha256: got.sha256 });
    }
  }

  /**
   * The packed image.json, once it describes the packed files and the pack's build (checkPackedImageManifest),
   * is rewritten with `origin: "imported"`, whatever the pack claimed.
   */
  private async markImageImported(dir: string): Promise<void> {
    const pack = this.pack as PackManifest;
    const file = path.join(dir, IMAGE_FILES.manifest);
    let manifest: ImageManifest;
    try {
      manifest = JSON.parse(await readFile(file, "utf8")) as ImageManifest;
    } catch {
      throw new ForkdError("unprocessable", "pack: the packed image.json is not JSON");
    }
    checkPackedImageManifest(pack, manifest);
    await rm(file);
    await writeDurably(file, `${JSON.stringify({ ...manifest, origin: "imported" }, null, 2)}\n`);
  }

  /** What the hashes cannot say: memory layers well-formed, disk layers reading through only where forkd's do. */
  private async checkLayerFiles(): Promise<void> {
    for (const layer of this.layers) {
      if (layer.fate === "reuse") continue;
      const dir = path.join(this.staging, layer.tag);
      const what = `packed snapshot ${layer.packedTag}`;
      if (layer.manifest.memory.format === "layer") {
        const { header } = await readLayerIndex(path.join(dir, SNAPSHOT_FILES.memoryLayer));
        if (header.ramBytes !== layer.manifest.memory.ramBytes) {
          throw new ForkdError("unprocessable", `${what}: memory layer is for another RAM size`);
        }
      }
      const parent = layer.manifest.parent;
      const header = await readQcow2Header(path.join(dir, SNAPSHOT_FILES.disk), what);
      assertLayerShape(
        header,
        parent
          ? {
              backingFile: path.join("..", "..", "snapshots", parent.tag, SNAPSHOT_FILES.disk),
              backingFormat: "qcow2",
            }
          : { backingFile: SNAPSHOT_FILES.baseDisk, backingFormat: "raw" },
        what,
      );
    }
  }

  // ---- installing ----

  /** Installs what was read: the image if it came with the pack, then the layers, root first. */
  async install(): Promise<void> {
    if (this.imageStaging) await this.installImage(this.imageStaging);
    const image = this.imagePaths();
    for (const layer of this.layers) {
      if (layer.fate === "reuse") continue;
      const dir = path.join(this.staging, layer.tag);
      if (!layer.manifest.parent) await symlink(image.rootfs, path.join(dir, SNAPSHOT_FILES.baseDisk));
      for (const name of Object.keys(layer.manifest.files)) await chmod(path.join(dir, name), 0o444);
      await writeDurably(path.join(dir, MANIFEST_FILE), layer.installedManifest);
      await fsyncPath(dir);
    }
    await this.checkReplaceable();
    this.progress("publishing");
    await this.publishLayers();
    for (const { tag, displaced } of this.published) {
      if (displaced) {
        await removeAssembledImages(this.paths, tag, displaced).catch(() => {});
        await rm(displaced, { recursive: true, force: true });
      }
    }
    const verifier = new FileVerifier(cacheDirs(this.paths).verifiedDir);
    for (const { tag, name, sha256 } of this.verifiedFiles) {
      await verifier.remember(path.join(this.store.dirOf(tag), name), sha256);
    }
  }

  /** The packed image, published into the imported images (never where builds look), its files remembered. */
  private async installImage(staging: Staging): Promise<void> {
    const pack = this.pack as PackManifest;
    this.progress("installing the guest image");
    await this.markImageImported(staging.out);
    for (const name of IMAGE_PACK_FILES) await chmod(path.join(staging.out, name), 0o644);
    const outcome = await publish(staging, this.importedDir(), pack.image.hash, false);
    crashPoint("unpack.image");
    const present = await readImageDir(this.importedDir(), pack.image.hash);
    if (!present) throw new ForkdError("unprocessable", "the packed image is not a complete forkd image");
    if (present.manifest.buildId !== pack.image.buildId) {
      throw conflict(
        outcome === "lost-race"
          ? "another build of the pack's image was cached meanwhile; unpack again"
          : "the packed image's image.json names another build than the pack",
      );
    }
    if (outcome === "published") {
      const verifier = new FileVerifier(cacheDirs(this.paths).verifiedDir);
      for (const f of pack.files) {
        const where = classifyPackPath(f.path);
        // image.json was rewritten (origin: imported); the files it describes are what the pack carried.
        if (where.kind === "image" && where.name !== IMAGE_FILES.manifest) {
          await verifier.remember(path.join(present.dir, where.name), f.sha256);
        }
      }
    }
  }

  /** Renames the staged layers into place, root first (a layer is never visible before its parent); on failure every rename is undone. */
  private async publishLayers(): Promise<void> {
    try {
      for (const layer of this.layers) {
        if (layer.fate === "reuse") continue;
        const final = this.store.dirOf(layer.tag);
        const displaced = layer.fate === "replace" ? await this.store.moveAside(layer.tag) : null;
        this.published.push({ tag: layer.tag, displaced });
        await rename(path.join(this.staging, layer.tag), final).catch((err: NodeJS.ErrnoException) => {
          if (err.code === "ENOTEMPTY" || err.code === "EEXIST") {
            throw conflict(`snapshot ${layer.tag} was created by someone else meanwhile`);
          }
          throw err;
        });
        crashPoint("unpack.layer");
      }
      await fsyncPath(this.paths.snapshots);
      crashPoint("unpack.published");
    } catch (err) {
      await this.rollback();
      throw err;
    }
  }

  /** --force must not pull a layer from under a running VM, and says which local snapshots it orphans. */
  private async checkReplaceable(): Promise<void> {
    const replaced = this.layers.filter((l) => l.fate === "replace").map((l) => l.tag);
    if (replaced.length === 0) return;
    const graph = await loadGraph(this.store);
    const affected = new Set<string>();
    for (const tag of replaced) {
      affected.add(tag);
      for (const d of descendantsOf(graph, tag)) affected.add(d);
    }
    const users: string[] = [];
    for (const tag of affected) {
      const ids = this.options.sandboxesOf?.(tag) ?? [];
      if (ids.length > 0) users.push(`${tag} (sandboxes ${ids.join(", ")})`);
    }
    for (const [tag, pids] of await qemusUsing(this.paths, [...affected])) {
      users.push(`${tag} (QEMU processes ${pids.join(", ")})`);
    }
    if (users.length > 0) {
      throw conflict(`cannot replace snapshots in use by running VMs: ${users.join("; ")}`);
    }
    const ours = new Set(this.layers.map((l) => l.tag));
    this.orphaned = [...affected].filter((t) => !ours.has(t));
  }

  private async rollback(): Promise<void> {
    for (const { tag, displaced } of this.published.reverse()) {
      await rename(this.store.dirOf(tag), path.join(this.staging, tag)).catch(() => {});
      if (displaced) await rename(displaced, this.store.dirOf(tag)).catch(() => {});
    }
    this.published = [];
  }

  async cleanup(): Promise<void> {
    this.disk?.release();
    await rm(this.staging, { recursive: true, force: true });
    if (this.imageStaging) await removeStaging(this.imageStaging.dir).catch(() => {});
  }
}

/**
 * The manifest a layer is installed with here: this host's image paths, its tag here, its parent's digest as
 * installed, the restore key for those; byte for byte the packed one where nothing changed (the chain's digests
 * then match the source's).
 */
function installedManifestOf(
  packed: Buffer,
  manifest: SnapshotManifest,
  here: {
    tag: string;
    image: { rootfs: string; kernel: string; initrd: string };
    parentDigest: string | null;
  },
): Buffer {
  const installed: SnapshotManifest = {
    ...manifest,
    tag: here.tag,
    image: { ...manifest.image, ...here.image },
    parent: manifest.parent && { tag: manifest.parent.tag, manifestSha256: here.parentDigest as string },
  };
  installed.machine = { ...manifest.machine, compatKey: restoreKey(installed) };
  const unchanged = isDeepStrictEqual(installed, manifest);
  return unchanged ? packed : Buffer.from(`${JSON.stringify(installed, null, 2)}\n`);
}
