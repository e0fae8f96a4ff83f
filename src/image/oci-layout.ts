/**
 * OCI image layouts (image-spec `oci-layout`, `index.json`, `blobs/sha256/...`) as skopeo, umoci and buildah
 * write them. Everything read here is untrusted (it came from an image): JSON is size-bounded and checked
 * against a schema, digests are checked before they become file names, and a manifest list is resolved to
 * this host's platform.
 */
import { constants as fsConstants } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { ForkdError } from "../common/errors.js";

export const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";
export const OCI_INDEX = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json";
export const REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name";

const DIGEST = /^sha256:[0-9a-f]{64}$/;
const MAX_JSON_BYTES = 4 * 1024 * 1024;
const MAX_LAYERS = 512;

const Descriptor = Type.Object({
  mediaType: Type.String({ maxLength: 256 }),
  digest: Type.String({ pattern: DIGEST.source }),
  size: Type.Integer({ minimum: 0 }),
  annotations: Type.Optional(Type.Record(Type.String(), Type.String())),
  platform: Type.Optional(
    Type.Object({ architecture: Type.String({ maxLength: 64 }), os: Type.String({ maxLength: 64 }) }),
  ),
});
export type Descriptor = Static<typeof Descriptor>;

const IndexSchema = Type.Object({
  schemaVersion: Type.Literal(2),
  mediaType: Type.Optional(Type.String()),
  manifests: Type.Array(Descriptor, { maxItems: 4096 }),
});
export type OciIndex = Static<typeof IndexSchema>;

const ManifestSchema = Type.Object({
  schemaVersion: Type.Literal(2),
  mediaType: Type.Optional(Type.String()),
  config: Descriptor,
  layers: Type.Array(Descriptor, { maxItems: MAX_LAYERS }),
  annotations: Type.Optional(Type.Record(Type.String(), Type.String())),
});
export type OciManifest = Static<typeof ManifestSchema>;

const ConfigSchema = Type.Object({
  architecture: Type.Optional(Type.String()),
  os: Type.Optional(Type.String()),
  config: Type.Optional(
    Type.Object({
      Env: Type.Optional(
        Type.Union([Type.Array(Type.String({ maxLength: 65536 }), { maxItems: 4096 }), Type.Null()]),
      ),
      WorkingDir: Type.Optional(Type.String({ maxLength: 4096 })),
      User: Type.Optional(Type.String({ maxLength: 256 })),
      Entrypoint: Type.Optional(Type.Union([Type.Array(Type.String()), Type.Null()])),
      Cmd: Type.Optional(Type.Union([Type.Array(Type.String()), Type.Null()])),
    }),
  ),
});
export type OciConfig = Static<typeof ConfigSchema>;

export interface ResolvedImage {
  /** The layout directory. */
  dir: string;
  manifestDigest: string;
  manifest: OciManifest;
  config: OciConfig;
}

export function blobPath(layoutDir: string, digest: string): string {
  if (!DIGEST.test(digest)) throw new ForkdError("unprocessable", `image names a malformed digest ${digest}`);
  return path.join(layoutDir, "blobs", "sha256", digest.slice("sha256:".length));
}

async function readJson<T extends TSchema>(file: string, schema: T, what: string): Promise<Static<T>> {
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(file, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
  } catch {
    throw new ForkdError("unprocessable", `${what}: missing (${path.basename(file)})`);
  }
  let text: string;
  try {
    const st = await handle.stat();
    if (!st.isFile() || st.size > MAX_JSON_BYTES) {
      throw new ForkdError("unprocessable", `${what}: not a regular file of at most ${MAX_JSON_BYTES} bytes`);
    }
    text = await handle.readFile("utf8");
  } finally {
    await handle.close();
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new ForkdError("unprocessable", `${what}: not valid JSON`);
  }
  if (!Value.Check(schema, raw)) {
    const first = Value.Errors(schema, raw).First();
    throw new ForkdError(
      "unprocessable",
      `${what}: invalid at ${first?.path || "/"}: ${first?.message ?? "?"}`,
    );
  }
  return raw;
}

export async function readIndex(layoutDir: string): Promise<OciIndex> {
  return readJson(path.join(layoutDir, "index.json"), IndexSchema, "OCI layout index.json");
}

function isManifestType(mediaType: string | undefined): boolean {
  return mediaType === undefined || mediaType === OCI_MANIFEST || mediaType === DOCKER_MANIFEST;
}

const HOST_PLATFORM = { architecture: process.arch === "arm64" ? "arm64" : "amd64", os: "linux" };

/**
 * The image `ref` names in the layout (its ref.name annotation), or the layout's only image. A manifest list
 * is resolved to linux on this host's architecture.
 */
export async function resolveImage(layoutDir: string, ref?: string): Promise<ResolvedImage> {
  const index = await readIndex(layoutDir);
  const named =
    ref === undefined
      ? index.manifests
      : index.manifests.filter((m) => m.annotations?.[REF_NAME_ANNOTATION] === ref);
  if (named.length !== 1) {
    const refs = index.manifests.map((m) => m.annotations?.[REF_NAME_ANNOTATION] ?? "(unnamed)");
    throw new ForkdError(
      "invalid_argument",
      ref === undefined
        ? `OCI layout ${layoutDir} holds ${named.length} images (${refs.join(", ")}): name one with ref`
        : `OCI layout ${layoutDir} has ${named.length === 0 ? "no" : "more than one"} image named ${ref} (it has ${refs.join(", ")})`,
    );
  }
  let descriptor = named[0] as Descriptor;
  if (descriptor.mediaType === OCI_INDEX || descriptor.mediaType === DOCKER_LIST) {
    const list = await readJson(blobPath(layoutDir, descriptor.digest), IndexSchema, "image index");
    const match = list.manifests.find(
      (m) => m.platform?.os === HOST_PLATFORM.os && m.platform.architecture === HOST_PLATFORM.architecture,
    );
    if (!match) {
      throw new ForkdError(
        "unprocessable",
        `image ${ref ?? ""} has no ${HOST_PLATFORM.os}/${HOST_PLATFORM.architecture} variant`.replace(
          "  ",
          " ",
        ),
      );
    }
    descriptor = match;
  }
  if (!isManifestType(descriptor.mediaType)) {
    throw new ForkdError(
      "unprocessable",
      `image manifest has media type ${descriptor.mediaType}, not an image`,
    );
  }
  const manifest = await readJson(blobPath(layoutDir, descriptor.digest), ManifestSchema, "image manifest");
  const config = await readJson(blobPath(layoutDir, manifest.config.digest), ConfigSchema, "image config");
  if (config.os !== undefined && config.os !== HOST_PLATFORM.os) {
    throw new ForkdError("unprocessable", `image is for ${config.os}, not ${HOST_PLATFORM.os}`);
  }
  if (config.architecture !== undefined && config.architecture !== HOST_PLATFORM.architecture) {
    throw new ForkdError(
      "unprocessable",
      `image is for ${config.architecture}, this host runs ${HOST_PLATFORM.architecture} guests`,
    );
  }
  return { dir: layoutDir, manifestDigest: descriptor.digest, manifest, config };
}

/**
 * A new layout at `dest` with the same images as `src`: blobs hard-linked (they are content-addressed and
 * never modified in place, so sharing inodes is safe), index.json and oci-layout copied.
 */
export async function cloneLayout(src: string, dest: string): Promise<void> {
  const blobs = path.join(src, "blobs", "sha256");
  await fs.mkdir(path.join(dest, "blobs", "sha256"), { recursive: true, mode: 0o755 });
  for (const name of await fs.readdir(blobs)) {
    await fs.link(path.join(blobs, name), path.join(dest, "blobs", "sha256", name));
  }
  for (const name of ["index.json", "oci-layout"])
    await fs.copyFile(path.join(src, name), path.join(dest, name));
}

/** The image's run-time settings, as steps and the guest agent use them. */
export interface ImageSettings {
  /** KEY=VALUE, in order. */
  env: string[];
  workdir: string;
  user: string;
}

export const DEFAULT_SETTINGS: ImageSettings = {
  env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
  workdir: "/",
  user: "root",
};

export function settingsOf(config: OciConfig): ImageSettings {
  const c = config.config ?? {};
  const env = (c.Env ?? []).filter((e) => /^[A-Za-z_][A-Za-z0-9_]*=/.test(e) && !e.includes("\0"));
  const hasPath = env.some((e) => e.startsWith("PATH="));
  const workdir = c.WorkingDir?.startsWith("/") ? path.posix.normalize(c.WorkingDir) : "/";
  return {
    env: hasPath ? env : [...DEFAULT_SETTINGS.env, ...env],
    workdir,
    user: c.User && c.User !== "" ? c.User : "root",
  };
}

/** `env` with `changes` laid over it (a changed variable keeps its place; new ones go last). */
export function withEnv(env: string[], changes: Record<string, string>): string[] {
  const out = [...env];
  for (const [name, value] of Object.entries(changes)) {
    const at = out.findIndex((e) => e.startsWith(`${name}=`));
    if (at >= 0) out[at] = `${name}=${value}`;
    else out.push(`${name}=${value}`);
  }
  return out;
}

export function envRecord(env: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of env) {
    const at = e.indexOf("=");
    if (at > 0) out[e.slice(0, at)] = e.slice(at + 1);
  }
  return out;
}
