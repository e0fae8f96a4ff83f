/**
 * Snapshots through an OCI registry: `push` puts a snapshot chain (the pack format) into any registry that
 * speaks the distribution API as one artifact, and `pull` installs one, with exactly the checks `unpack` makes
 * (it is the same UnpackSession, fed from the artifact's blobs instead of one archive).
 *
 * The artifact is an OCI image manifest whose config is the pack manifest (forkd-pack.json) and whose layers
 * ("parts") are zstd tar archives of the pack's entries, in pack order:
 *
 *   part 0          every layer's manifest.json (small; changes with the chain)
 *   part 1..n       one per snapshot layer, root first: its memory, device state and disk layer
 *   part n+1        the guest image, unless pushed without it
 *
 * Parts are written deterministically (tar without owners or times, zstd at a fixed level), so a layer's part
 * has the same digest in every chain it belongs to: a registry that already has a base layer's blob (from an
 * earlier push of any chain on it) is not sent it again. skopeo does the distribution API: it asks the
 * registry for each blob by digest and uploads only the missing ones, reads credentials from the usual auth
 * files, and verifies every digest it downloads.
 *
 * A registry on a loopback address may be plain HTTP (as Docker treats localhost); any other needs verified
 * TLS unless the caller says `insecure`.
 */
import { createHash } from "node:crypto";
import { mkdir, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { type Static, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { createStaging, removeStaging, sweepStaleStaging } from "../../image/cache.js";
import {
  IMAGE_REFERENCE,
  ociLayoutName,
  registryTlsVerify,
  skopeoCopy,
  skopeoInspectRaw,
} from "../../image/index.js";
import { blobPath, OCI_MANIFEST, REF_NAME_ANNOTATION, resolveImage } from "../../image/oci-layout.js";
import { digestFile } from "../../store/hash.js";
import { type ArchiveSource, readArchive, writeArchive } from "../../store/pack-archive.js";
import {
  classifyPackPath,
  MAX_PACK_MANIFEST_BYTES,
  PACK_MANIFEST_PATH,
  parsePackManifest,
} from "../../store/pack-format.js";
import type { UnpackResult } from "../sandbox-service.js";
import { type PackedFile, packManifestBytes, preparePack } from "./pack.js";
import { type PackSource, type UnpackOptions, unpackSnapshot } from "./unpack.js";

export const PACK_CONFIG_MEDIA_TYPE = "application/vnd.forkd.pack.v1+json";
export const PACK_PART_MEDIA_TYPE = "application/vnd.forkd.pack.part.v1.tar+zstd";
/** Says what a part holds: "manifests", "layer:<tag>" or "image". */
export const PART_ANNOTATION = "org.forkd.pack.part";
/** zstd level of every part: fixed, so equal content gives equal digests in every push. */
const PART_ZSTD_LEVEL = 3;
/** A chain of at most MAX_CHAIN_DEPTH + 1 layers, the manifests and the image. */
const MAX_PARTS = 80;
const MAX_REGISTRY_MANIFEST_BYTES = 256 * 1024;

const TAG_IN_REFERENCE = /:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;

/** Checks a registry reference (it becomes a skopeo argument) and says whether TLS is verified for it. */
export function checkReference(
  reference: string,
  insecure: boolean,
): { reference: string; tlsVerify: boolean } {
  if (typeof reference !== "string" || !IMAGE_REFERENCE.test(reference)) {
    throw invalidArgument(
      `${JSON.stringify(reference)} is not a registry reference (host[:port]/name[:tag], e.g. registry.example:5000/team/snapshots:v1)`,
    );
  }
  return { reference, tlsVerify: registryTlsVerify(reference, insecure) };
}

/** `host/name:tag@sha256:...` -> `host/name` */
function repositoryOf(reference: string): string {
  const noDigest = reference.replace(/@sha256:[0-9a-f]{64}$/, "");
  const lastSlash = noDigest.lastIndexOf("/");
  const tail = noDigest.slice(lastSlash + 1).replace(TAG_IN_REFERENCE, "");
  return `${noDigest.slice(0, lastSlash + 1)}${tail}`;
}

async function transferDir(paths: ForkdPaths) {
  const dir = path.join(paths.home, "cache", "registry");
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await sweepStaleStaging(dir);
  return createStaging(dir, "registrytransfer");
}

// ---- push ----

export interface PushOptions {
  tag: string;
  reference: string;
  /** Allow plain HTTP / unverified TLS to a registry that is not on a loopback address. */
  insecure?: boolean;
  withoutImage?: boolean;
  signal?: AbortSignal;
  onProgress?: (message: string) => void;
}

export interface PushedPart {
  part: string;
  digest: string;
  size: number;
  /** False when the registry already had this blob (skopeo did not send it). */
  uploaded: boolean;
}

export interface PushResult {
  reference: string;
  /** The pushed artifact's manifest digest (pull by `<repository>@<digest>` for exactly this chain). */
  digest: string;
  chain: string[];
  parts: PushedPart[];
  uploaded_bytes: number;
  ms: number;
}

function partName(file: PackedFile): string {
  const where = classifyPackPath(file.path);
  if (where.kind === "snapshot") return where.name === "manifest.json" ? "manifests" : `layer:${where.tag}`;
  return "image";
}

/** The pack's files grouped into parts, in pack order (manifests first, then one part per layer, then the image). */
function groupParts(files: PackedFile[]): { part: string; files: PackedFile[] }[] {
  const parts: { part: string; files: PackedFile[] }[] = [];
  for (const file of files) {
    const name = partName(file);
    const last = parts[parts.length - 1];
    if (last?.part === name) last.files.push(file);
    else if (parts.some((p) => p.part === name))
      throw new ForkdError("internal", `pack order splits part ${name}`);
    else parts.push({ part: name, files: [file] });
  }
  return parts;
}

async function putBlob(layout: string, bytes: Buffer): Promise<{ digest: string; size: number }> {
  const hex = createHash("sha256").update(bytes).digest("hex");
  await writeFile(path.join(layout, "blobs", "sha256", hex), bytes, { mode: 0o600 });
  return { digest: `sha256:${hex}`, size: bytes.length };
}

export async function pushSnapshot(paths: ForkdPaths, options: PushOptions): Promise<PushResult> {
  const started = performance.now();
  const { reference, tlsVerify } = checkReference(options.reference, options.insecure === true);
  const progress = options.onProgress ?? (() => {});
  const prepared = await preparePack(paths, options);
  const staging = await transferDir(paths);
  try {
    const layout = path.join(staging.work, "layout");
    await mkdir(path.join(layout, "blobs", "sha256"), { recursive: true, mode: 0o700 });
    await writeFile(path.join(layout, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}\n');
    const parts: PushedPart[] = [];
    const descriptors = [];
    for (const [i, group] of groupParts(prepared.files).entries()) {
      progress(`writing part ${group.part}`);
      const tmp = path.join(staging.work, `part-${i}.tar.zst`);
      const entries: ArchiveSource[] = group.files.map((f) => ({ path: f.path, source: f.source }));
      await writeArchive(tmp, entries, { level: PART_ZSTD_LEVEL, signal: options.signal });
      const { size, sha256 } = await digestFile(tmp);
      await rename(tmp, path.join(layout, "blobs", "sha256", sha256));
      parts.push({ part: group.part, digest: `sha256:${sha256}`, size, uploaded: true });
      descriptors.push({
        mediaType: PACK_PART_MEDIA_TYPE,
        digest: `sha256:${sha256}`,
        size,
        annotations: { [PART_ANNOTATION]: group.part },
      });
    }
    const config = await putBlob(layout, packManifestBytes(prepared.manifest));
    const manifestBytes = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: OCI_MANIFEST,
        config: { mediaType: PACK_CONFIG_MEDIA_TYPE, ...config },
        layers: descriptors,
        annotations: { "org.forkd.pack.head": prepared.chain[prepared.chain.length - 1]?.tag ?? "" },
      }),
    );
    const manifest = await putBlob(layout, manifestBytes);
    await writeFile(
      path.join(layout, "index.json"),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [{ mediaType: OCI_MANIFEST, ...manifest, annotations: { [REF_NAME_ANNOTATION]: "push" } }],
      }),
    );
    progress(`pushing to ${reference}`);
    const skipped = new Set<string>();
    await skopeoCopy(ociLayoutName(layout, "push"), `docker://${reference}`, {
      signal: options.signal,
      destTlsVerify: tlsVerify,
      onBlobSkipped: (digest) => skipped.add(digest),
      onLine: (line) => {
        if (line.startsWith("Copying blob")) progress(line.trim());
      },
    });
    for (const part of parts) part.uploaded = !skipped.has(part.digest);
    return {
      reference,
      digest: manifest.digest,
      chain: prepared.chain.map((s) => s.tag),
      parts,
      uploaded_bytes: parts.filter((p) => p.uploaded).reduce((n, p) => n + p.size, 0),
      ms: Math.round(performance.now() - started),
    };
  } finally {
    await removeStaging(staging.dir);
  }
}

// ---- pull ----

const RegistryManifestSchema = Type.Object({
  schemaVersion: Type.Literal(2),
  config: Type.Object({
    mediaType: Type.String({ maxLength: 256 }),
    digest: Type.String({ pattern: "^sha256:[0-9a-f]{64}$" }),
    size: Type.Integer({ minimum: 0 }),
  }),
  layers: Type.Array(
    Type.Object({
      mediaType: Type.String({ maxLength: 256 }),
      digest: Type.String({ pattern: "^sha256:[0-9a-f]{64}$" }),
      size: Type.Integer({ minimum: 0 }),
    }),
    { maxItems: MAX_PARTS },
  ),
});
type RegistryManifest = Static<typeof RegistryManifestSchema>;

export interface PullOptions
  extends Pick<UnpackOptions, "tag" | "force" | "sandboxesOf" | "signal" | "onProgress"> {
  reference: string;
  insecure?: boolean;
  /** Refuse the pull (conflict, before any part is downloaded) unless the registry's manifest has this digest. */
  expectDigest?: string;
}

export interface PullResult extends UnpackResult {
  reference: string;
  digest: string;
}

function parseRegistryManifest(reference: string, text: string): RegistryManifest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new ForkdError("unprocessable", `${reference}: the registry's manifest is not JSON`);
  }
  if (!Value.Check(RegistryManifestSchema, raw)) {
    throw new ForkdError(
      "unprocessable",
      `${reference}: not an image manifest (a manifest list, or malformed)`,
    );
  }
  if (raw.config.mediaType !== PACK_CONFIG_MEDIA_TYPE) {
    throw new ForkdError(
      "unprocessable",
      `${reference} is not a forkd snapshot (its config is ${raw.config.mediaType}, not ${PACK_CONFIG_MEDIA_TYPE})`,
    );
  }
  const stray = raw.layers.find((l) => l.mediaType !== PACK_PART_MEDIA_TYPE);
  if (stray)
    throw new ForkdError(
      "unprocessable",
      `${reference}: part ${stray.digest} has media type ${stray.mediaType}`,
    );
  if (raw.config.size > MAX_PACK_MANIFEST_BYTES) {
    throw new ForkdError("unprocessable", `${reference}: its pack manifest claims ${raw.config.size} bytes`);
  }
  return raw;
}

async function* once(bytes: Buffer): AsyncIterable<Buffer> {
  yield bytes;
}

export async function pullSnapshot(paths: ForkdPaths, options: PullOptions): Promise<PullResult> {
  const { reference, tlsVerify } = checkReference(options.reference, options.insecure === true);
  const progress = options.onProgress ?? (() => {});
  const image = `docker://${reference}`;
  progress(`reading ${reference}`);
  const manifestText = await skopeoInspectRaw(image, "manifest", {
    tlsVerify,
    signal: options.signal,
    maxBytes: MAX_REGISTRY_MANIFEST_BYTES,
  });
  const manifest = parseRegistryManifest(reference, manifestText);
  const digest = `sha256:${createHash("sha256").update(manifestText).digest("hex")}`;
  if (options.expectDigest !== undefined && options.expectDigest !== digest) {
    throw new ForkdError(
      "conflict",
      `${reference} is ${digest} in the registry, not the expected ${options.expectDigest} (pushed over?)`,
    );
  }
  // Pinned by digest from here on: what is downloaded is the manifest just checked, whatever the tag does.
  const pinned = `docker://${repositoryOf(reference)}@${digest}`;
  const configText = await skopeoInspectRaw(pinned, "config", {
    tlsVerify,
    signal: options.signal,
    maxBytes: MAX_PACK_MANIFEST_BYTES,
  });
  const config = Buffer.from(configText, "utf8");
  if (`sha256:${createHash("sha256").update(config).digest("hex")}` !== manifest.config.digest) {
    throw new ForkdError(
      "unprocessable",
      `${reference}: its pack manifest does not match the digest the manifest names`,
    );
  }
  // The parts are compressed archives of the files the pack manifest lists: they cannot be much larger than
  // those files, and a registry claiming otherwise is not sent to fill this host's disk.
  const listed = parsePackManifest(configText).files.reduce((n, f) => n + f.size, 0);
  const parts = manifest.layers.reduce((n, l) => n + l.size, 0);
  const allowed = listed * 1.01 + (manifest.layers.length + 1) * 1024 * 1024;
  if (parts > allowed) {
    throw new ForkdError(
      "unprocessable",
      `${reference}: its parts claim ${parts} bytes for ${listed} bytes of packed files (refused before downloading)`,
    );
  }
  const staging = await transferDir(paths);
  const source: PackSource = {
    name: reference,
    read: async (onEntry, readOptions) => {
      // The pack manifest first: the session checks it against this host (QEMU, image, tags) before any blob
      // is downloaded.
      await onEntry({ path: PACK_MANIFEST_PATH, type: "file", size: config.length, body: once(config) });
      const layout = path.join(staging.work, "layout");
      progress(`downloading ${manifest.layers.length} parts`);
      await skopeoCopy(pinned, ociLayoutName(layout, "pull"), {
        srcTlsVerify: tlsVerify,
        signal: options.signal,
      });
      const pulled = await resolveImage(layout, "pull");
      const same =
        pulled.manifest.layers.length === manifest.layers.length &&
        pulled.manifest.layers.every((l, i) => l.digest === manifest.layers[i]?.digest);
      if (!same)
        throw new ForkdError("unprocessable", `${reference}: the downloaded parts are not the manifest's`);
      for (const part of manifest.layers) {
        await readArchive(blobPath(layout, part.digest), onEntry, readOptions);
        // A part's blob is no longer needed once read: keep the disk for the unpacked files.
        await rm(blobPath(layout, part.digest), { force: true });
      }
    },
  };
  try {
    const result = await unpackSnapshot(paths, { ...options, source });
    return { ...result, reference, digest };
  } finally {
    await removeStaging(staging.dir);
  }
}
