/**
 * Checks the layers of an image from elsewhere before anything unpacks them: a layer is a tar archive written
 * by whoever made the image, and forkd unpacks it as root. Every entry of every layer is read (headers only,
 * bodies are skipped) with node-tar's parser and held to these rules, lower layers first:
 *
 *   - paths are relative and never contain `..` (no path escapes);
 *   - no entry is written through a symlink an earlier entry made (no symlink out of the root), and no hard
 *     link names a path outside the image or through a symlink;
 *   - a relative symlink target never climbs above the image's root (absolute targets are resolved inside the
 *     root, in the guest and by every host-side step);
 *   - character and block devices only under /dev; sockets and other special entries nowhere;
 *   - whiteouts (`.wh.<name>`, `.wh..wh..opq`) remove what lower layers made, as the image spec says;
 *   - bounded entry counts, path lengths and sizes.
 *
 * The first violation ends the check with an `unprocessable` error naming the layer, the entry and the rule.
 * umoci then unpacks the checked layers (it also resolves every path inside the root on its own).
 */
import { spawn } from "node:child_process";
import { createReadStream } from "node:fs";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { createGunzip } from "node:zlib";
import { Parser, type ReadEntry } from "tar";
import { errorMessage, ForkdError } from "../common/errors.js";
import { blobPath, type Descriptor } from "./oci-layout.js";

export const LAYER_LIMITS = {
  entries: 2_000_000,
  pathChars: 4096,
  /** Uncompressed bytes of all layers together. */
  totalBytes: 256 * 1024 ** 3,
};

const LAYER_TYPES: Record<string, "none" | "gzip" | "zstd"> = {
  "application/vnd.oci.image.layer.v1.tar": "none",
  "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
  "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
  "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
  "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
  "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
  "application/vnd.docker.image.rootfs.diff.tar": "none",
};

type Kind = "dir" | "file" | "symlink" | "other";

export interface LayerCheckReport {
  layers: number;
  entries: number;
  /** Uncompressed bytes of file bodies. */
  bytes: number;
}

class Refusal extends ForkdError {}

/** The model of the image's tree, layer over layer: what each path is, as far as the layers said so far. */
class TreeModel {
  private readonly kinds = new Map<string, Kind>();
  /** Paths the current layer added (an opaque whiteout only hides what lower layers made). */
  private layerAdded = new Set<string>();

  nextLayer(): void {
    this.layerAdded = new Set();
  }

  get(p: string): Kind | undefined {
    return this.kinds.get(p);
  }

  set(p: string, kind: Kind): void {
    if (kind !== "dir") this.removeBelow(p, false);
    this.kinds.set(p, kind);
    this.layerAdded.add(p);
  }

  remove(p: string): void {
    this.kinds.delete(p);
    this.removeBelow(p, false);
  }

  /** Removes what is under `dir` (only what lower layers made, for an opaque whiteout). */
  removeBelow(dir: string, lowerOnly: boolean): void {
    const prefix = `${dir}/`;
    for (const key of this.kinds.keys()) {
      if (key.startsWith(prefix) && !(lowerOnly && this.layerAdded.has(key))) this.kinds.delete(key);
    }
  }

  /** The first ancestor of `p` that is a symlink, if any. */
  symlinkAncestor(p: string): string | undefined {
    const parts = p.split("/");
    for (let i = 1; i < parts.length; i++) {
      const prefix = parts.slice(0, i).join("/");
      if (this.kinds.get(prefix) === "symlink") return prefix;
    }
    return undefined;
  }
}

/** `raw` as a clean relative path ("./a/b/" -> "a/b"), or a refusal. An empty result is the root itself. */
function cleanPath(raw: string, what: string): string {
  if (raw.includes("\0")) throw new Refusal("unprocessable", `${what}: NUL in path`);
  if (raw.length > LAYER_LIMITS.pathChars) throw new Refusal("unprocessable", `${what}: path too long`);
  if (raw.startsWith("/")) throw new Refusal("unprocessable", `${what}: absolute path (path escape)`);
  const parts = raw.split("/").filter((p) => p !== "" && p !== ".");
  if (parts.includes("..")) throw new Refusal("unprocessable", `${what}: ".." in path (path escape)`);
  return parts.join("/");
}

/** Where a relative symlink at `at` points, lexically; undefined when it climbs above the root. */
function lexicalTarget(at: string, target: string): string | undefined {
  const stack = path.posix.dirname(at) === "." ? [] : path.posix.dirname(at).split("/");
  for (const part of target.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (stack.length === 0) return undefined;
      stack.pop();
    } else stack.push(part);
  }
  return stack.join("/");
}

function checkEntry(model: TreeModel, entry: ReadEntry, layer: string): void {
  const p = cleanPath(entry.path, `${layer}: entry ${JSON.stringify(entry.path)}`);
  const what = `${layer}: entry ${JSON.stringify(entry.path)}`;
  if (p === "") {
    if (entry.type === "Directory") return; // "./" itself
    throw new Refusal("unprocessable", `${what}: replaces the image's root directory`);
  }
  const through = model.symlinkAncestor(p);
  if (through !== undefined) {
    throw new Refusal(
      "unprocessable",
      `${what}: is written through the symlink /${through} (symlink out of the root)`,
    );
  }
  const base = path.posix.basename(p);
  const dir = path.posix.dirname(p);
  if (base === ".wh..wh..opq") {
    if (dir !== ".") model.removeBelow(dir, true);
    return;
  }
  if (base.startsWith(".wh.")) {
    const hidden = base.slice(4);
    if (hidden === "" || hidden === "." || hidden === "..")
      throw new Refusal("unprocessable", `${what}: malformed whiteout`);
    model.remove(dir === "." ? hidden : `${dir}/${hidden}`);
    return;
  }
  switch (entry.type) {
    case "Directory":
      model.set(p, "dir");
      return;
    case "File":
    case "OldFile":
    case "ContiguousFile":
      model.set(p, "file");
      return;
    case "SymbolicLink": {
      const target = entry.linkpath ?? "";
      if (target === "" || target.includes("\0"))
        throw new Refusal("unprocessable", `${what}: empty symlink target`);
      if (!target.startsWith("/") && lexicalTarget(p, target) === undefined) {
        throw new Refusal(
          "unprocessable",
          `${what}: symlink to ${JSON.stringify(target)} climbs above the image's root (symlink out)`,
        );
      }
      model.set(p, "symlink");
      return;
    }
    case "Link": {
      const target = cleanPath(entry.linkpath ?? "", `${what}: hard link target`);
      if (target === "" || model.symlinkAncestor(target) !== undefined || model.get(target) !== "file") {
        throw new Refusal(
          "unprocessable",
          `${what}: hard link to ${JSON.stringify(entry.linkpath)}, which is not a regular file of the image`,
        );
      }
      model.set(p, "file");
      return;
    }
    case "CharacterDevice":
    case "BlockDevice":
      if (p !== "dev" && !p.startsWith("dev/")) {
        throw new Refusal(
          "unprocessable",
          `${what}: ${entry.type === "BlockDevice" ? "block" : "character"} device outside /dev`,
        );
      }
      model.set(p, "other");
      return;
    case "FIFO":
      model.set(p, "other");
      return;
    default:
      throw new Refusal("unprocessable", `${what}: unsupported entry type ${entry.type}`);
  }
}

function decompressor(kind: "none" | "gzip" | "zstd", file: string): NodeJS.ReadableStream {
  if (kind === "none") return createReadStream(file);
  if (kind === "gzip") return createReadStream(file).pipe(createGunzip());
  const zstd = spawn("zstd", ["-d", "-q", "-c", "--", file], { stdio: ["ignore", "pipe", "ignore"] });
  return zstd.stdout;
}

/** Checks every layer of an image in `layoutDir` (lowest first); throws at the first violation. */
export async function checkLayers(
  layoutDir: string,
  layers: Descriptor[],
  signal?: AbortSignal,
): Promise<LayerCheckReport> {
  const model = new TreeModel();
  const report: LayerCheckReport = { layers: layers.length, entries: 0, bytes: 0 };
  for (const [i, layer] of layers.entries()) {
    const name = `layer ${i + 1} of ${layers.length} (${layer.digest.slice(0, 19)})`;
    const compression = LAYER_TYPES[layer.mediaType];
    if (compression === undefined) {
      throw new ForkdError("unprocessable", `${name}: media type ${layer.mediaType} is not an image layer`);
    }
    model.nextLayer();
    let refusal: unknown;
    const parser = new Parser({ strict: true, maxMetaEntrySize: 1024 * 1024 });
    parser.on("entry", (entry: ReadEntry) => {
      try {
        if (refusal === undefined) {
          if (++report.entries > LAYER_LIMITS.entries) {
            throw new Refusal(
              "unprocessable",
              `${name}: more than ${LAYER_LIMITS.entries} entries in the image`,
            );
          }
          report.bytes += entry.size;
          if (report.bytes > LAYER_LIMITS.totalBytes) {
            throw new Refusal(
              "unprocessable",
              `${name}: the image unpacks to more than ${LAYER_LIMITS.totalBytes} bytes`,
            );
          }
          checkEntry(model, entry, name);
        }
      } catch (err) {
        refusal ??= err;
        parser.abort(err as Error);
      }
      entry.resume();
    });
    try {
      await pipeline(
        decompressor(compression, blobPath(layoutDir, layer.digest)),
        parser as unknown as NodeJS.WritableStream,
        { signal },
      );
    } catch (err) {
      if (refusal !== undefined) throw refusal;
      if (signal?.aborted) throw err;
      throw new ForkdError("unprocessable", `${name}: not a readable layer: ${errorMessage(err)}`);
    }
    if (refusal !== undefined) throw refusal;
  }
  return report;
}
