/**
 * The checks an unpack holds a pack to before it installs anything (unpack.ts runs them as the entries stream
 * past): what each packed file may claim to be, that each layer sits on the one below it and was taken on a
 * machine this forkd builds, that the files match the layers' own manifests, and that the packed image.json
 * describes the packed image. A pack is hostile input: every refusal is `unprocessable` (or `conflict` for a
 * machine this forkd does not build) and names the entry.
 */

import { createHash } from "node:crypto";
import { conflict, ForkdError } from "../../common/errors.js";
import { IMAGE_FILES, type ImageManifest } from "../../image/index.js";
import { MANIFEST_FILE, parseManifest, type SnapshotManifest } from "../../store/manifest.js";
import {
  classifyPackPath,
  type PackFile,
  type PackManifest,
  snapshotPackPath,
} from "../../store/pack-format.js";
import { restoreCompatibilityKey } from "../../vmm/qemu-args.js";
import { childSpec, SNAPSHOT_FILES } from "../machines/machine.js";
import { IMAGE_PACK_FILES } from "./pack.js";

/** Upper bounds for what one packed file may claim to be, so a pack cannot make us hash or write without end. */
const LIMITS = {
  manifest: 1024 * 1024,
  deviceState: 256 * 1024 * 1024,
  disk: 256 * 1024 ** 3,
  imageSmall: 1024 ** 3,
  rootfs: 256 * 1024 ** 3,
};

/** The largest snapshot manifest an unpack reads into memory. */
export const MAX_LAYER_MANIFEST_BYTES = LIMITS.manifest;

/** Largest QEMU's `-smp` takes for the machine types forkd uses. */
const MAX_VCPUS = 255;
const CPU_MODEL = /^[A-Za-z0-9._-]{1,64}$/;

/** A packed layer as the checks see it: its tag in the pack and its manifest there. */
export interface PackedLayer {
  packedTag: string;
  manifest: SnapshotManifest;
}

/** Every file the pack manifest lists is one forkd packs, no larger than forkd accepts for it. */
export function checkPackedFileList(pack: PackManifest): void {
  for (const f of pack.files) {
    const where = classifyPackPath(f.path);
    const limit =
      where.kind === "image"
        ? where.name === IMAGE_FILES.rootfs
          ? LIMITS.rootfs
          : LIMITS.imageSmall
        : where.kind === "snapshot"
          ? where.name === MANIFEST_FILE
            ? LIMITS.manifest
            : where.name === SNAPSHOT_FILES.deviceState
              ? LIMITS.deviceState
              : LIMITS.disk
          : 0;
    if (f.size > limit) throw refused(f.path, `claims ${f.size} bytes, more than forkd accepts (${limit})`);
    if (
      where.kind === "image" &&
      !IMAGE_PACK_FILES.includes(where.name as (typeof IMAGE_PACK_FILES)[number])
    ) {
      throw refused(f.path, "unexpected entry");
    }
  }
}

/**
 * Layer `i` of the packed chain, from its manifest's bytes: they are the ones the chain names, it sits on the
 * layer below, was made on the pack's image (the root with a flat memory image), on a machine this forkd builds.
 */
export function checkedLayerManifest(
  pack: PackManifest,
  i: number,
  bytes: Buffer | undefined,
): SnapshotManifest {
  const link = pack.chain[i] as PackManifest["chain"][number];
  if (!bytes) throw new ForkdError("unprocessable", `pack has no manifest for layer ${link.tag}`);
  if (digestOf(bytes) !== link.manifestSha256) {
    throw new ForkdError("unprocessable", `pack: layer ${link.tag}'s manifest does not match the chain`);
  }
  const manifest = parseManifest(bytes.toString("utf8"), `packed snapshot ${link.tag}`);
  const parent = pack.chain[i - 1];
  const edgeOk =
    parent === undefined
      ? manifest.parent === null
      : manifest.parent?.tag === parent.tag && manifest.parent.manifestSha256 === parent.manifestSha256;
  if (!edgeOk)
    throw new ForkdError("unprocessable", `pack: layer ${link.tag} does not sit on the layer below it`);
  if (manifest.image.hash !== pack.image.hash || manifest.image.buildId !== pack.image.buildId) {
    throw new ForkdError("unprocessable", `pack: layer ${link.tag} was made on another image`);
  }
  if (i === 0 && manifest.memory.format !== "flat") {
    throw new ForkdError("unprocessable", `pack: its root ${link.tag} has no flat memory image`);
  }
  checkMachine(link.tag, manifest);
  // The restore compatibility key digests the QEMU arguments this forkd builds for the layer's children.
  // Computed from the packed manifest it must match the recorded key (else this forkd's machine differs from
  // the one that wrote the device state); it is then recomputed for this host's image paths.
  if (restoreKey(manifest) !== manifest.machine.compatKey) {
    throw conflict(
      `pack: layer ${link.tag} was taken on a machine configuration this forkd does not build (another forkd ` +
        "version?); children could not load its state",
    );
  }
  return manifest;
}

/** Each layer's packed data files are the ones its own manifest lists, of sizes its RAM allows. */
export function checkPackedFiles(pack: PackManifest, layers: readonly PackedLayer[]): void {
  for (const f of pack.files) {
    const where = classifyPackPath(f.path);
    if (where.kind !== "snapshot" || where.name === MANIFEST_FILE) continue;
    const layer = layers.find((l) => l.packedTag === where.tag) as PackedLayer;
    const listed = layer.manifest.files[where.name];
    if (!listed || listed.size !== f.size || listed.sha256 !== f.sha256) {
      throw refused(f.path, `does not match layer ${where.tag}'s own manifest`);
    }
    if (where.name === SNAPSHOT_FILES.memory && f.size !== layer.manifest.memory.ramBytes) {
      throw refused(f.path, "is not the size of the layer's RAM");
    }
    if (where.name === SNAPSHOT_FILES.memoryLayer && f.size > maxLayerBytes(layer.manifest.memory.ramBytes)) {
      throw refused(f.path, "is larger than a memory layer of the layer's RAM can be");
    }
  }
}

/** Every layer comes with every file its manifest lists, and lists what a snapshot needs (memory, state, disk). */
export function checkLayersComplete(pack: PackManifest, layers: readonly PackedLayer[]): void {
  for (const layer of layers) {
    const needed = Object.keys(layer.manifest.files).filter((name) =>
      pack.files.every((f) => f.path !== snapshotPackPath(layer.packedTag, name)),
    );
    if (needed.length > 0)
      throw new ForkdError("unprocessable", `pack lacks ${needed.join(", ")} of ${layer.packedTag}`);
    const memoryName =
      layer.manifest.memory.format === "flat" ? SNAPSHOT_FILES.memory : SNAPSHOT_FILES.memoryLayer;
    for (const name of [memoryName, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk]) {
      if (!layer.manifest.files[name]) {
        throw new ForkdError("unprocessable", `pack: layer ${layer.packedTag} lists no ${name}`);
      }
    }
  }
}

/** The packed image.json must describe the packed files (the same sha256 for each) and the pack's build. */
export function checkPackedImageManifest(pack: PackManifest, manifest: ImageManifest): void {
  if (manifest?.hash !== pack.image.hash || manifest.buildId !== pack.image.buildId) {
    throw new ForkdError("unprocessable", "pack: the packed image.json names another image than the pack");
  }
  for (const f of pack.files) {
    const where = classifyPackPath(f.path);
    if (where.kind !== "image" || where.name === IMAGE_FILES.manifest) continue;
    if (manifest.files?.[where.name]?.sha256 !== f.sha256 || manifest.files[where.name]?.size !== f.size) {
      throw new ForkdError(
        "unprocessable",
        `pack: the packed image.json does not describe the packed ${where.name} (size or sha256 differ)`,
      );
    }
  }
}

/**
 * restoreCompatibilityKey of the children this forkd would start from `manifest` (as machines/restore-plan.ts
 * checks it).
 */
export function restoreKey(manifest: SnapshotManifest): string {
  return restoreCompatibilityKey(
    childSpec(manifest, { runDir: "/run", memoryFile: "/m", shared: false, disk: "/d", restoreFrom: "/s" }),
  );
}

/**
 * The machine fields become QEMU arguments when a child starts: each must be what forkd itself would write
 * (a plain CPU model name, not one with extra properties; a RAM size that matches the memory files).
 */
function checkMachine(tag: string, manifest: SnapshotManifest): void {
  const bad = (why: string) => new ForkdError("unprocessable", `pack: layer ${tag}: ${why}`);
  const { machine, memory } = manifest;
  if (memory.ramBytes !== machine.memoryMiB * 1024 * 1024) {
    throw bad(`its RAM (${memory.ramBytes} bytes) is not the machine's ${machine.memoryMiB} MiB`);
  }
  if (!CPU_MODEL.test(machine.cpu)) throw bad(`CPU model ${JSON.stringify(machine.cpu)} is not a plain name`);
  if (machine.vcpus > MAX_VCPUS) throw bad(`${machine.vcpus} vCPUs`);
  if (machine.cmdline.length > 4096 || machine.cmdline.includes("\0"))
    throw bad("kernel command line refused");
}

/** A memory layer's size when every page of `ramBytes` is in it (header, index, pages). */
function maxLayerBytes(ramBytes: number): number {
  const pages = ramBytes / 4096;
  return 24 + pages * 4 + ramBytes;
}

export function refused(entryPath: string, why: string): ForkdError {
  return new ForkdError("unprocessable", `pack entry ${JSON.stringify(entryPath)} refused: ${why}`);
}

export function checkHash(entryPath: string, sha256: string, expected: PackFile): void {
  if (sha256 !== expected.sha256) {
    throw new ForkdError(
      "unprocessable",
      `pack entry ${JSON.stringify(entryPath)} is corrupted (sha256 mismatch)`,
    );
  }
}

export function digestOf(bytes: Buffer): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** An entry's body, refused when it is longer than `size`. */
export async function readAll(body: AsyncIterable<Buffer>, size: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of body) {
    total += chunk.length;
    if (total > size) throw new ForkdError("unprocessable", "pack entry longer than its header says");
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}
