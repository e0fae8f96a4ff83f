/**
 * Archives uploaded for template builds' copy steps, kept per tenant under the hash the caller named them by
 * (E2B's files hash): a tenant's upload is never another's, so no one can plant files under a hash someone
 * else's template copies. An upload is streamed to a temporary file, bounded in bytes, then read back entry by
 * entry (gzip or plain tar) and refused unless every entry is a regular file, directory or symlink with a
 * relative path that stays inside the archive; only then is it published by rename. Unpacking (for a build)
 * repeats the checks and bounds the bytes unpacked, so a compressed bomb stops at the limit.
 *
 * The hash the caller names is its own cache key: forkd's step cache keys copy steps by the content it
 * unpacked (image/step-plan.ts), never by this name, so a wrong name costs only the caller's own build.
 */
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGunzip } from "node:zlib";
import { extract, Parser, type ReadEntry } from "tar";
import { errorMessage, ForkdError, invalidArgument, notFound } from "../../common/errors.js";
import {
  MAX_TEMPLATE_UNPACKED_BYTES,
  MAX_TEMPLATE_UPLOAD_BYTES,
  MAX_TEMPLATE_UPLOAD_ENTRIES,
} from "../../common/limits.js";

export interface BuildFileLimits {
  /** Bytes of one upload (the archive as sent). */
  maxUploadBytes: number;
  /** Bytes one archive may unpack to. */
  maxUnpackedBytes: number;
  /** Entries of one archive. */
  maxEntries: number;
}

export const DEFAULT_BUILD_FILE_LIMITS: BuildFileLimits = {
  maxUploadBytes: MAX_TEMPLATE_UPLOAD_BYTES,
  maxUnpackedBytes: MAX_TEMPLATE_UNPACKED_BYTES,
  maxEntries: MAX_TEMPLATE_UPLOAD_ENTRIES,
};

/** The files hash E2B's SDKs send: lowercase hex SHA-256. */
export const FILES_HASH = /^[a-f0-9]{64}$/;
const ENTRY_TYPES = new Set(["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink"]);
const GZIP_MAGIC = [0x1f, 0x8b];

/** A name on disk for a tenant (tenant names are the token file's; never a path). */
function ownerDir(owner: string | null): string {
  return owner === null ? "admin" : `t-${createHash("sha256").update(owner).digest("hex").slice(0, 32)}`;
}

export function assertFilesHash(hash: string): string {
  if (!FILES_HASH.test(hash))
    throw invalidArgument(`files hash ${JSON.stringify(hash)} is not a SHA-256 in hex`);
  return hash;
}

/** Why an archive entry's path is refused, or null: relative, normalized, nothing climbing out. */
export function entryPathProblem(name: string): string | null {
  const clean = name.replace(/^\.\//, "").replace(/\/+$/, "");
  if (clean === "" || clean === ".") return null;
  if (name.startsWith("/")) return "is absolute";
  if (name.includes("\0")) return "contains NUL";
  if (clean.split("/").some((part) => part === ".." || part === "")) return "climbs out of the archive";
  if (clean.length > 4096) return "is longer than 4096 characters";
  return null;
}

function entryProblem(entry: ReadEntry): string | null {
  if (!ENTRY_TYPES.has(entry.type))
    return `is a ${entry.type} (only files, directories and symlinks are copied)`;
  const problem = entryPathProblem(entry.path);
  if (problem) return problem;
  if (entry.type === "SymbolicLink" && (entry.linkpath ?? "").includes("\0"))
    return "has a NUL in its target";
  return null;
}

async function isGzip(file: string): Promise<boolean> {
  const handle = await fs.open(file, "r");
  try {
    const head = Buffer.alloc(2);
    await handle.read(head, 0, 2, 0);
    return head[0] === GZIP_MAGIC[0] && head[1] === GZIP_MAGIC[1];
  } finally {
    await handle.close();
  }
}

/** Counts bytes through a stream and fails past `max` (the unpacked size of a compressed archive). */
function byteLimit(max: number, what: string): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      seen += chunk.length;
      if (seen > max) done(new ForkdError("payload_too_large", `${what} is larger than ${max} bytes`));
      else done(null, chunk);
    },
  });
}

export class BuildFiles {
  constructor(
    private readonly dir: string,
    readonly limits: BuildFileLimits = DEFAULT_BUILD_FILE_LIMITS,
  ) {}

  private fileOf(hash: string, owner: string | null): string {
    return path.join(this.dir, ownerDir(owner), `${assertFilesHash(hash)}.tar`);
  }

  async has(hash: string, owner: string | null): Promise<boolean> {
    return (await fs.stat(this.fileOf(hash, owner)).catch(() => undefined))?.isFile() === true;
  }

  /** Stores `body` as archive `hash` of `owner` (replacing an earlier upload of it). */
  async put(hash: string, body: Readable, owner: string | null): Promise<void> {
    const target = this.fileOf(hash, owner);
    await fs.mkdir(path.dirname(target), { recursive: true, mode: 0o700 });
    const temp = `${target}.upload-${randomBytes(6).toString("hex")}`;
    try {
      await pipeline(
        body,
        byteLimit(this.limits.maxUploadBytes, "the upload"),
        createWriteStream(temp, { mode: 0o600 }),
      );
      await this.scan(temp, "the upload");
      await fs.rename(temp, target);
    } catch (err) {
      await fs.rm(temp, { force: true });
      if (err instanceof ForkdError) throw err;
      throw invalidArgument(`the upload is not a readable tar archive: ${errorMessage(err)}`);
    }
  }

  /** Reads every entry of `file`, refusing the archive at the first entry that breaks a rule. */
  private async scan(file: string, what: string): Promise<void> {
    let entries = 0;
    let problem: string | undefined;
    const parser = new Parser({
      strict: true,
      onReadEntry: (entry: ReadEntry) => {
        entries++;
        const why = entryProblem(entry);
        if (why && !problem) problem = `entry ${JSON.stringify(entry.path.slice(0, 200))} ${why}`;
        if (entries > this.limits.maxEntries && !problem)
          problem = `more than ${this.limits.maxEntries} entries`;
        entry.resume();
      },
    });
    const streams: NodeJS.ReadWriteStream[] = (await isGzip(file)) ? [createGunzip()] : [];
    await pipeline([
      createReadStream(file),
      ...streams,
      byteLimit(this.limits.maxUnpackedBytes, `${what} unpacked`),
      parser as unknown as NodeJS.WritableStream,
    ]);
    if (problem) throw invalidArgument(`${what} is refused: ${problem}`);
    if (entries === 0) throw invalidArgument(`${what} is not a tar archive with files in it`);
  }

  /** Unpacks archive `hash` of `owner` into the empty directory `dest` (the build's own). */
  async unpack(hash: string, owner: string | null, dest: string, signal?: AbortSignal): Promise<void> {
    const file = this.fileOf(hash, owner);
    if (!(await this.has(hash, owner))) {
      throw notFound(`no files were uploaded under hash ${hash} (upload them before starting the build)`);
    }
    await this.scan(file, `the files of hash ${hash.slice(0, 12)}`);
    await fs.mkdir(dest, { recursive: true, mode: 0o755 });
    const streams: NodeJS.ReadWriteStream[] = (await isGzip(file)) ? [createGunzip()] : [];
    await pipeline(
      [
        createReadStream(file),
        ...streams,
        byteLimit(this.limits.maxUnpackedBytes, `the files of hash ${hash.slice(0, 12)} unpacked`),
        // Checked above; node-tar also refuses absolute paths and `..` and never writes through a symlink.
        extract({
          cwd: dest,
          strict: true,
          preserveOwner: false,
          filter: (_path, entry) => entryProblem(entry as ReadEntry) === null,
        }) as unknown as NodeJS.WritableStream,
      ],
      { signal },
    );
  }

  /** Removes every archive of `owner`. */
  async removeAll(owner: string | null): Promise<void> {
    await fs.rm(path.join(this.dir, ownerDir(owner)), { recursive: true, force: true });
  }
}
