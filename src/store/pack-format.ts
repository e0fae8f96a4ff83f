/**
 * The portable pack: a chain of snapshots plus the guest image its root needs, in one zstd-compressed tar.
 *
 *   forkd-pack.json                      this manifest; always the first entry
 *   snapshots/<tag>/manifest.json        every layer's manifest, root first
 *   snapshots/<tag>/{memory.bin|memory.layer, vmstate, disk.qcow2}   every layer's data files, root first
 *   image/<hash>/{vmlinuz, initrd.img, probe-initrd.img, rootfs.ext4, image.json}   unless packed without image
 *
 * Only regular files, only these names. The manifest lists every other entry with its size and sha256, in
 * archive order, so an unpacker can check each entry as it streams past and refuse anything else.
 */
import { type Static, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { ForkdError } from "../common/errors.js";
import { isValidTag } from "../common/names.js";

export const PACK_FORMAT = "forkd-pack";
export const PACK_VERSION = 1;
export const PACK_MANIFEST_PATH = "forkd-pack.json";
export const MAX_PACK_MANIFEST_BYTES = 1024 * 1024;
/** A chain is at most MAX_CHAIN_DEPTH + 1 layers of 4 files, plus 5 image files: far below this. */
export const MAX_PACK_FILES = 256;

/** Files a snapshot directory may contribute to a pack (base.ext4 is a host-specific link: never packed). */
export const PACKED_SNAPSHOT_FILES = ["manifest.json", "memory.bin", "memory.layer", "vmstate", "disk.qcow2"];

const Sha256 = Type.String({ pattern: "^[0-9a-f]{64}$" });

export const PackManifestSchema = Type.Object({
  format: Type.Literal(PACK_FORMAT),
  version: Type.Literal(PACK_VERSION),
  createdAtUnix: Type.Integer(),
  forkdVersion: Type.String({ maxLength: 64 }),
  /** The QEMU that wrote the device state; children need a compatible one. */
  qemuVersion: Type.String({ maxLength: 64 }),
  /** Root first; the last one is the head. `manifestSha256` is of the packed manifest.json. */
  chain: Type.Array(Type.Object({ tag: Type.String({ maxLength: 64 }), manifestSha256: Sha256 }), {
    minItems: 1,
    maxItems: 64,
  }),
  image: Type.Object({
    hash: Type.String({ pattern: "^[0-9a-f]{64}$" }),
    buildId: Type.String({ maxLength: 128 }),
    /** False for a pack made for hosts that already have this exact image build. */
    included: Type.Boolean(),
  }),
  /** Every entry after this manifest, in archive order. */
  files: Type.Array(
    Type.Object({
      path: Type.String({ maxLength: 256 }),
      size: Type.Integer({ minimum: 0 }),
      sha256: Sha256,
    }),
    { maxItems: MAX_PACK_FILES },
  ),
});

export type PackManifest = Static<typeof PackManifestSchema>;
export type PackFile = PackManifest["files"][number];

export type PackPath =
  | { kind: "snapshot"; tag: string; name: string }
  | { kind: "image"; hash: string; name: string }
  | { kind: "dir" };

const IMAGE_HASH = /^[0-9a-f]{64}$/;
const IMAGE_FILE_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/**
 * What an archive path names, or a ForkdError saying why it is refused: absolute paths, `..` or `.` segments,
 * backslashes, NUL, and anything outside the layout above. Directories (`snapshots/`, `snapshots/<tag>/`,
 * `image/`, `image/<hash>/`) are recognised so an unpacker can skip them; files are checked by name here and
 * against the pack manifest by the caller.
 */
export function classifyPackPath(raw: string): PackPath {
  const refuse = (why: string) =>
    new ForkdError("unprocessable", `pack entry ${JSON.stringify(raw)} refused: ${why}`);
  if (raw.length === 0 || raw.length > 256) throw refuse("empty or overlong path");
  if (raw.includes("\0") || raw.includes("\\")) throw refuse("NUL or backslash in path");
  if (raw.startsWith("/")) throw refuse("absolute path");
  const isDir = raw.endsWith("/");
  const parts = (isDir ? raw.slice(0, -1) : raw).split("/");
  if (parts.some((p) => p === "..")) throw refuse("path traversal ('..')");
  if (parts.some((p) => p === "" || p === ".")) throw refuse("empty or '.' path segment");
  const [top, name, file, ...rest] = parts;
  if (rest.length > 0) throw refuse("unexpected entry (too deep)");
  if (top === "snapshots") {
    if (name === undefined) return isDirOrRefuse(isDir, refuse);
    if (!isValidTag(name)) throw refuse("not a valid snapshot tag");
    if (file === undefined) return isDirOrRefuse(isDir, refuse);
    if (isDir || !PACKED_SNAPSHOT_FILES.includes(file)) throw refuse("unexpected entry");
    return { kind: "snapshot", tag: name, name: file };
  }
  if (top === "image") {
    if (name === undefined) return isDirOrRefuse(isDir, refuse);
    if (!IMAGE_HASH.test(name)) throw refuse("not an image hash");
    if (file === undefined) return isDirOrRefuse(isDir, refuse);
    if (isDir || !IMAGE_FILE_NAME.test(file)) throw refuse("unexpected entry");
    return { kind: "image", hash: name, name: file };
  }
  throw refuse("unexpected entry");
}

function isDirOrRefuse(isDir: boolean, refuse: (why: string) => ForkdError): PackPath {
  if (!isDir) throw refuse("unexpected entry");
  return { kind: "dir" };
}

export function snapshotPackPath(tag: string, name: string): string {
  return `snapshots/${tag}/${name}`;
}

export function imagePackPath(hash: string, name: string): string {
  return `image/${hash}/${name}`;
}

/**
 * Parses and checks a pack manifest's structure: schema, every path well-formed and unique, snapshot files
 * only of chain members, the chain's tags unique. What the files contain is checked as they stream in.
 */
export function parsePackManifest(text: string): PackManifest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new ForkdError("unprocessable", "pack manifest is not valid JSON", { cause: err });
  }
  if (!Value.Check(PackManifestSchema, raw)) {
    const first = Value.Errors(PackManifestSchema, raw).First();
    throw new ForkdError(
      "unprocessable",
      `pack manifest is invalid at ${first?.path || "/"}: ${first?.message ?? "unknown error"}` +
        (typeof raw === "object" && raw && (raw as { format?: unknown }).format !== PACK_FORMAT
          ? " (not a forkd pack?)"
          : ""),
    );
  }
  const manifest = raw;
  const tags = new Set<string>();
  for (const { tag } of manifest.chain) {
    if (!isValidTag(tag)) throw new ForkdError("unprocessable", `pack chain names an invalid tag ${tag}`);
    if (tags.has(tag)) throw new ForkdError("unprocessable", `pack chain lists ${tag} twice`);
    tags.add(tag);
  }
  const paths = new Set<string>();
  for (const file of manifest.files) {
    const where = classifyPackPath(file.path);
    if (where.kind === "dir") {
      throw new ForkdError("unprocessable", `pack manifest lists a directory ${file.path}`);
    }
    if (paths.has(file.path)) {
      throw new ForkdError("unprocessable", `pack manifest lists ${file.path} twice (duplicate entry)`);
    }
    paths.add(file.path);
    if (where.kind === "snapshot" && !tags.has(where.tag)) {
      throw new ForkdError("unprocessable", `pack manifest lists ${file.path}, not part of its chain`);
    }
    if (where.kind === "image" && (where.hash !== manifest.image.hash || !manifest.image.included)) {
      throw new ForkdError("unprocessable", `pack manifest lists ${file.path}, not its image`);
    }
  }
  return manifest;
}
