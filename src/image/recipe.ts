/**
 * The recipe of an image: everything that determines what a build produces. Its hash names the image's
 * cache directory, so two builds share an image exactly when their recipes are equal.
 *
 * The template enters in normalized form (parsed values, extra files by content), so reformatting a template
 * or adding a comment does not rebuild, while any change to a value or to an extra file's bytes does.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import type { Interpreter, Template } from "./template.js";

/** Bump whenever the builder's output changes for the same inputs (init script, trimming, mkfs options, image.json format...). */
export const BUILDER_VERSION = 3;

/** The template as it enters the recipe and the image manifest: values only, no host paths. */
export interface ImageTemplate {
  name: string;
  description: string;
  packages: string[];
  memoryMib: number;
  vcpus: number;
  diskMib: number;
  interpreter: Interpreter;
  warmup: string | null;
  files: { dest: string; mode: number; sha256: string; size: number }[];
  /** Format 2 only (absent for format 1, so format-1 recipes hash as they always did). */
  format?: 2;
  /** Format 2: the step key of the tree the image is made from (covers the base and every step). */
  rootfsKey?: string;
}

export interface Recipe {
  builderVersion: number;
  suite: string;
  arch: string;
  kernelPackage: string;
  kernelVersion: string;
  busyboxVersion: string;
  /** `bootRecipeDigest()`: the /init template and kernel command line. */
  bootRecipe: string;
  /** Content hash of the guest payload directory (dist/guest). */
  payloadHash: string;
  template: ImageTemplate;
  /**
   * Format 1 only (always a Debian tree): DEBIAN_TREE_VERSION, forkd's edits to the tree mmdebstrap made. A
   * format-2 Debian base has it in its step key, so images from other bases keep their hashes.
   */
  debianTree?: number;
}

export async function sha256File(file: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(file, { highWaterMark: 1 << 20 })) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

export async function imageTemplate(template: Template, rootfsKey?: string): Promise<ImageTemplate> {
  const files = [];
  for (const f of template.files) {
    const st = await fs.stat(f.src);
    files.push({ dest: f.dest, mode: f.mode, sha256: await sha256File(f.src), size: st.size });
  }
  return {
    name: template.name,
    description: template.description,
    packages: [...template.packages].sort(),
    memoryMib: template.memoryMib,
    vcpus: template.vcpus,
    diskMib: template.diskMib,
    interpreter: template.interpreter,
    warmup: template.warmup ?? null,
    files: files.sort((a, b) => (a.dest < b.dest ? -1 : 1)),
    ...(template.format === 2 ? { format: 2 as const, rootfsKey } : {}),
  };
}

const MAX_PAYLOAD_ENTRIES = 100_000;

/** The agent binary in the payload directory (dist/guest), copied to /opt/forkd/ in every image. */
export const GUEST_AGENT_FILE = "forkd-agent";

/**
 * A hash over the guest payload directory (see hashTree). Fails clearly when the payload is missing, since a
 * build without it would produce a guest with no agent.
 */
export async function hashPayloadDir(dir: string): Promise<string> {
  const st = await fs.stat(dir).catch(() => undefined);
  if (!st?.isDirectory()) {
    throw new ForkdError(
      "unavailable",
      `guest agent payload not found at ${dir} (run \`npm run build\` to produce dist/guest)`,
    );
  }
  const agent = await fs.stat(path.join(dir, GUEST_AGENT_FILE)).catch(() => undefined);
  if (!agent?.isFile()) {
    throw new ForkdError(
      "unavailable",
      `guest agent payload ${dir} has no ${GUEST_AGENT_FILE} (run \`npm run build\`)`,
    );
  }
  return hashTree(dir, "guest payload");
}

/**
 * A hash over a directory tree: every entry's relative path, type, permission bits and content (or link
 * target), in sorted order. Special files (devices, sockets, FIFOs) are refused; so are trees with more than
 * MAX_PAYLOAD_ENTRIES entries. A regular file is hashed as itself (its name is empty).
 */
export async function hashTree(dir: string, what: string): Promise<string> {
  const top = await fs.lstat(dir);
  if (top.isFile())
    return createHash("sha256")
      .update(`F  ${(top.mode & 0o7777).toString(8)} ${await sha256File(dir)}\n`)
      .digest("hex");
  const hash = createHash("sha256");
  let entries = 0;
  const walk = async (rel: string): Promise<void> => {
    const names = (await fs.readdir(path.join(dir, rel))).sort();
    for (const name of names) {
      if (++entries > MAX_PAYLOAD_ENTRIES) {
        throw new ForkdError(
          "invalid_argument",
          `${what} ${dir} has more than ${MAX_PAYLOAD_ENTRIES} entries`,
        );
      }
      const childRel = rel === "" ? name : `${rel}/${name}`;
      const full = path.join(dir, childRel);
      const lst = await fs.lstat(full);
      const perm = (lst.mode & 0o7777).toString(8);
      if (lst.isSymbolicLink()) {
        hash.update(`L ${childRel} ${await fs.readlink(full)}\n`);
      } else if (lst.isDirectory()) {
        hash.update(`D ${childRel} ${perm}\n`);
        await walk(childRel);
      } else if (lst.isFile()) {
        hash.update(`F ${childRel} ${perm} ${await sha256File(full)}\n`);
      } else {
        throw new ForkdError("invalid_argument", `${what} contains a special file: ${full}`);
      }
    }
  };
  await walk("");
  return hash.digest("hex");
}

/** JSON with object keys sorted at every level, so equal recipes always serialize identically. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value as object).sort();
    const obj = value as Record<string, unknown>;
    return `{${keys
      .filter((k) => obj[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value);
}

/** 64 hex digits: the image's cache directory name. */
export function recipeHash(recipe: Recipe): string {
  return createHash("sha256").update(canonicalJson(recipe)).digest("hex");
}

export const RECIPE_HASH_PATTERN = /^[0-9a-f]{64}$/;
