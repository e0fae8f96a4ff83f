/**
 * Portable packs (format: store/pack-format.ts): `pack` bundles a snapshot, every ancestor and the guest image
 * their root needs, every file verified against its recorded hash first; unpack.ts installs them on another
 * host or home. `preparePack` is shared with a registry push (one blob per layer).
 */

import { stat } from "node:fs/promises";
import path from "node:path";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, ForkdError } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { FORKD_VERSION } from "../../common/version.js";
import { IMAGE_FILES } from "../../image/index.js";
import { manifestDigest, resolveChain } from "../../store/chain.js";
import { digestFile } from "../../store/hash.js";
import { MANIFEST_FILE } from "../../store/manifest.js";
import { type ArchiveSource, writeArchive } from "../../store/pack-archive.js";
import {
  imagePackPath,
  PACK_FORMAT,
  PACK_MANIFEST_PATH,
  PACK_VERSION,
  type PackFile,
  type PackManifest,
  snapshotPackPath,
} from "../../store/pack-format.js";
import { SnapshotStore, type StoredSnapshot } from "../../store/snapshot-store.js";
import { FileVerifier } from "../../store/verify.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import { cacheDirs, snapshotIsBootable, verifyImage } from "../machines/restore-plan.js";
import type { PackResult } from "../sandbox-service.js";

/** Data files of a snapshot in the order they are packed (manifests come first, for every layer). */
const DATA_FILES = [
  SNAPSHOT_FILES.memory,
  SNAPSHOT_FILES.memoryLayer,
  SNAPSHOT_FILES.deviceState,
  SNAPSHOT_FILES.disk,
];
/** The guest image's files a pack carries, in pack order. */
export const IMAGE_PACK_FILES = [
  IMAGE_FILES.manifest,
  IMAGE_FILES.kernel,
  IMAGE_FILES.initrd,
  IMAGE_FILES.probeInitrd,
  IMAGE_FILES.rootfs,
];

// ---- pack ----

export interface PackOptions {
  tag: string;
  out: string;
  /** zstd level 1..19 (default 3). */
  level?: number;
  /** Leave the guest image out: the pack then unpacks only where that exact image build is cached. */
  withoutImage?: boolean;
  signal?: AbortSignal;
  onProgress?: (message: string) => void;
}

export async function packSnapshot(paths: ForkdPaths, options: PackOptions): Promise<PackResult> {
  const started = performance.now();
  const out = path.resolve(options.out);
  await stat(out).then(
    () => {
      throw conflict(`${out} already exists`);
    },
    () => {},
  );
  const { chain, manifest, files } = await preparePack(paths, options);
  const progress = options.onProgress ?? (() => {});
  const entries: ArchiveSource[] = [
    { path: PACK_MANIFEST_PATH, source: packManifestBytes(manifest) },
    ...files.map((f) => ({ path: f.path, source: f.source })),
  ];
  crashPoint("pack.verified");
  progress(`writing ${out}`);
  const written = await writeArchive(out, entries, { level: options.level, signal: options.signal });
  crashPoint("pack.written");
  return {
    out,
    chain: chain.map((s) => s.tag),
    files: files.length,
    content_bytes: files.reduce((n, f) => n + f.size, 0),
    pack_bytes: written.bytes,
    image_included: !options.withoutImage,
    ms: Math.round(performance.now() - started),
  };
}

export const packManifestBytes = (manifest: PackManifest) =>
  Buffer.from(`${JSON.stringify(manifest, null, 2)}\n`);

/** A packed file and where its bytes come from. */
export type PackedFile = PackFile & { source: string };

export interface PreparedPack {
  /** Root first. */
  chain: StoredSnapshot[];
  manifest: PackManifest;
  /** In pack order: every layer's manifest, then each layer's data files, then the image's files. */
  files: PackedFile[];
}

/**
 * What a pack of `tag` holds, with every file verified against its recorded hash: the chain, the pack manifest
 * and the files in pack order. Shared by `pack` (one archive) and `push` (one registry blob per layer).
 */
export async function preparePack(
  paths: ForkdPaths,
  options: Pick<PackOptions, "tag" | "withoutImage" | "onProgress">,
): Promise<PreparedPack> {
  const tag = assertTag(options.tag);
  const progress = options.onProgress ?? (() => {});
  const store = new SnapshotStore(paths.snapshots);
  const chain = await resolveChain(store, tag);
  const head = chain[chain.length - 1] as StoredSnapshot;
  const problem = await snapshotIsBootable(head);
  if (problem) throw conflict(`snapshot ${tag} cannot be packed: ${problem}`);
  for (const layer of chain) {
    if (layer.manifest.image.hash !== head.manifest.image.hash) {
      throw new ForkdError("unprocessable", `snapshot ${tag}: layer ${layer.tag} was made on another image`);
    }
  }

  progress(`verifying ${chain.length} layer${chain.length > 1 ? "s" : ""}`);
  const verifier = new FileVerifier(cacheDirs(paths).verifiedDir);
  const files: PackedFile[] = [];
  for (const layer of chain) {
    files.push({
      path: snapshotPackPath(layer.tag, MANIFEST_FILE),
      ...(await digestFile(path.join(layer.dir, MANIFEST_FILE))),
      source: path.join(layer.dir, MANIFEST_FILE),
    });
  }
  for (const layer of chain) {
    for (const name of DATA_FILES) {
      const expected = layer.manifest.files[name];
      if (!expected) continue;
      const source = path.join(layer.dir, name);
      // The pack carries the manifest's hashes: make sure the files still have them.
      await verifier.verify(source, expected.sha256, `snapshot ${layer.tag}`);
      files.push({
        path: snapshotPackPath(layer.tag, name),
        size: expected.size,
        sha256: expected.sha256,
        source,
      });
    }
  }
  if (!options.withoutImage) {
    progress("verifying the guest image");
    // Its files must still have the hashes image.json recorded; image.json itself is hashed as it is.
    const image = await verifyImage(paths, head.manifest.image);
    for (const name of IMAGE_PACK_FILES) {
      const source = path.join(image.dir, name);
      const recorded = name === IMAGE_FILES.manifest ? undefined : image.manifest.files[name];
      const { size, sha256 } = recorded ?? (await digestFile(source));
      files.push({ path: imagePackPath(head.manifest.image.hash, name), size, sha256, source });
    }
  }
  const manifest: PackManifest = {
    format: PACK_FORMAT,
    version: PACK_VERSION,
    createdAtUnix: Math.floor(Date.now() / 1000),
    forkdVersion: FORKD_VERSION,
    qemuVersion: head.manifest.machine.qemuVersion,
    chain: await Promise.all(
      chain.map(async (s) => ({ tag: s.tag, manifestSha256: await manifestDigest(s) })),
    ),
    image: {
      hash: head.manifest.image.hash,
      buildId: head.manifest.image.buildId,
      included: !options.withoutImage,
    },
    files: files.map(({ path: p, size, sha256 }) => ({ path: p, size, sha256 })),
  };
  return { chain, manifest, files };
}
