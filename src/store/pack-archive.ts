/**
 * Reading and writing pack archives: tar by node-tar, compression by the `zstd` program (Node 20's zlib has no
 * zstd), always through argv arrays. The reader hands out entries one at a time as they stream past and never
 * lets node-tar write anything itself: what reaches the disk is decided by the caller, entry by entry.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { createHash, type Hash } from "node:crypto";
import { constants as fsConstants } from "node:fs";
import {
  type FileHandle,
  mkdir,
  mkdtemp,
  open,
  readdir,
  rename,
  rm,
  symlink,
  writeFile,
} from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Pack, Parser, type ReadEntry } from "tar";
import { crashPoint } from "../common/crash-points.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { OWNER_TOKEN_PATTERN, ownerTokenAlive, selfOwnerToken } from "../common/processes.js";

export const ZSTD_BINARY = "zstd";
const FARM_PREFIX = "forkd-pack-";
const PARTIAL_INFIX = ".partial-";

/**
 * Removes what killed pack writers left: their link farms in the temp directory and, next to `out` (when
 * given), partial archives of the same name (seen: a pack killed mid-write left both behind for good).
 */
export async function sweepDeadPackScratch(out?: string): Promise<void> {
  const farm = new RegExp(`^${FARM_PREFIX}(${OWNER_TOKEN_PATTERN})-`);
  for (const name of await readdir(os.tmpdir()).catch(() => [] as string[])) {
    const token = farm.exec(name)?.[1];
    if (token !== undefined && !(await ownerTokenAlive(token))) {
      await rm(path.join(os.tmpdir(), name), { recursive: true, force: true });
    }
  }
  if (out === undefined) return;
  const prefix = `${path.basename(out)}${PARTIAL_INFIX}`;
  for (const name of await readdir(path.dirname(out)).catch(() => [] as string[])) {
    if (!name.startsWith(prefix)) continue;
    const token = name.slice(prefix.length);
    if (new RegExp(`^${OWNER_TOKEN_PATTERN}$`).test(token) && !(await ownerTokenAlive(token))) {
      await rm(path.join(path.dirname(out), name), { force: true });
    }
  }
}
export const DEFAULT_ZSTD_LEVEL = 3;

export interface ArchiveSource {
  /** Path inside the archive. */
  path: string;
  /** A file to read, or the entry's bytes. */
  source: string | Buffer;
}

/**
 * Writes `entries`, in order, as a zstd-compressed tar at `out` (via a temp name renamed when complete). Files
 * are packed as regular files whatever links lead to them; owners, modes and times are not recorded.
 */
export async function writeArchive(
  out: string,
  entries: ArchiveSource[],
  options: { level?: number; signal?: AbortSignal } = {},
): Promise<{ bytes: number }> {
  const level = options.level ?? DEFAULT_ZSTD_LEVEL;
  if (!Number.isInteger(level) || level < 1 || level > 19) {
    throw new ForkdError("invalid_argument", `zstd level must be an integer in 1..19, got ${level}`);
  }
  await sweepDeadPackScratch(out);
  // node-tar names entries by their path under one directory: lay the archive's tree out as links to the sources.
  // Both scratch names carry the writer's owner token, so a later pack can tell a killed writer's leftovers.
  const farm = await mkdtemp(path.join(os.tmpdir(), `${FARM_PREFIX}${selfOwnerToken()}-`));
  const partial = `${out}${PARTIAL_INFIX}${selfOwnerToken()}`;
  let output: FileHandle | undefined;
  try {
    for (const entry of entries) {
      const at = path.join(farm, entry.path);
      await mkdir(path.dirname(at), { recursive: true, mode: 0o700 });
      if (typeof entry.source === "string") await symlink(path.resolve(entry.source), at);
      else await writeFile(at, entry.source, { mode: 0o600 });
    }
    output = await open(partial, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, 0o600);
    crashPoint("pack.writing");
    const zstd = spawnZstd(["-q", "-T0", `-${level}`, "-c"], ["pipe", output.fd, "pipe"], options.signal);
    const pack = new Pack({ cwd: farm, follow: true, portable: true, noMtime: true, strict: true });
    const packed = new Promise<void>((resolve, reject) => {
      pack.on("error", reject);
      pack.on("end", resolve);
    });
    pack.pipe(zstd.process.stdin as NodeJS.WritableStream);
    for (const entry of entries) pack.add(entry.path);
    pack.end();
    await Promise.all([packed, zstd.done]);
    await output.sync();
    const { size } = await output.stat();
    await output.close();
    output = undefined;
    await rename(partial, out);
    return { bytes: size };
  } finally {
    await output?.close().catch(() => {});
    await rm(partial, { force: true });
    await rm(farm, { recursive: true, force: true });
  }
}

export interface ArchiveEntry {
  path: string;
  type: "file" | "directory";
  size: number;
  body: AsyncIterable<Buffer>;
}

export interface ReadArchiveOptions {
  signal?: AbortSignal;
  /** Most decompressed bytes to accept so far (re-read on every chunk: it grows once the manifest is known). */
  maxBytes: () => number;
}

/**
 * Streams the entries of a zstd-compressed tar to `onEntry`, one at a time, in archive order. Entries other
 * than regular files and directories (links, devices, FIFOs, ...) and malformed headers end the read with an
 * `unprocessable` error naming the entry. `onEntry` returns "stop" once it has everything it needs.
 */
export async function readArchive(
  file: string,
  onEntry: (entry: ArchiveEntry) => Promise<"continue" | "stop">,
  options: ReadArchiveOptions,
): Promise<void> {
  await new ArchiveRead(file, onEntry, options).run();
}

/** One readArchive: zstd's output through the tar parser, the entries handed out one at a time. */
class ArchiveRead {
  private readonly zstd: ReturnType<typeof spawnZstd>;
  private readonly parser = new Parser({ strict: true, maxMetaEntrySize: 64 * 1024 });
  private readonly sink: NodeJS.WritableStream;
  private readonly stdout: NodeJS.ReadableStream;
  private decompressed = 0;
  private failure: unknown;
  private stopped = false;
  private zstdClosed = false;
  /** zstd's output has ended. */
  private drained = false;
  /** The parser failed first (before anything else did). */
  private parserFailed = false;
  /** The entry the handler is reading. */
  private current: ReadEntry | undefined;
  /** The handlers, one after the other in archive order. */
  private chain = Promise.resolve();
  private settle = () => {};

  constructor(
    file: string,
    private readonly onEntry: (entry: ArchiveEntry) => Promise<"continue" | "stop">,
    private readonly options: ReadArchiveOptions,
  ) {
    this.zstd = spawnZstd(["-d", "-q", "-c", "--", file], ["ignore", "pipe", "pipe"], options.signal);
    this.sink = this.parser as unknown as NodeJS.WritableStream;
    this.stdout = this.zstd.process.stdout as NodeJS.ReadableStream;
  }

  async run(): Promise<void> {
    const parsed = this.parsed();
    this.stdout.on("data", (chunk: Buffer) => {
      this.decompressed += chunk.length;
      if (this.decompressed > this.options.maxBytes()) {
        this.fail(
          new ForkdError("unprocessable", "pack decompresses to more than its manifest accounts for"),
        );
      }
    });
    this.parser.on("error", (err: Error) => {
      this.parserFailed ||= this.failure === undefined;
      this.fail(new ForkdError("unprocessable", `pack is not a valid tar archive: ${errorMessage(err)}`));
    });
    this.parser.on("entry", (entry: ReadEntry) => this.enqueue(entry));
    this.stdout.pipe(this.sink);
    await Promise.all([parsed, this.exited()]);
    await this.chain;
    if (this.failure !== undefined) throw this.failure;
    this.options.signal?.throwIfAborted();
  }

  /**
   * The parser's "end" comes after its last entry was handed out. After a failure or an early stop the parser
   * is cut off from its input and never ends: then zstd's exit is the end.
   */
  private parsed(): Promise<void> {
    const parsed = new Promise<void>((resolve) => {
      this.settle = () => {
        if (this.zstdClosed && (this.failure !== undefined || this.stopped)) resolve();
      };
      this.parser.on("end", resolve);
    });
    this.zstd.process.on("close", () => {
      this.zstdClosed = true;
      this.settle();
    });
    this.stdout.on("end", () => {
      this.drained = true;
    });
    return parsed;
  }

  /** zstd's end; its own failure (not zstd data, corrupt frame) explains a parser failure on what it let through. */
  private exited(): Promise<void> {
    const { zstd } = this;
    return zstd.done
      .catch((err: unknown) => {
        const ownFailure = typeof zstd.process.exitCode === "number" && zstd.process.exitCode !== 0;
        if (!this.stopped && ownFailure && (this.failure === undefined || this.parserFailed))
          this.failure = err;
        else if (!this.stopped) this.failure ??= err;
      })
      .finally(() => {
        // Also reached when zstd could not be started at all (then there is no "close").
        this.zstdClosed = true;
        if (this.failure !== undefined) {
          this.stdout.unpipe(this.sink);
          this.current?.destroy();
        }
        this.settle();
      });
  }

  /** Hands `entry` to the handler once the ones before it are done. */
  private enqueue(entry: ReadEntry): void {
    const type = entryType(entry);
    this.chain = this.chain.then(async () => {
      try {
        if (this.failure !== undefined || this.stopped) return;
        if (typeof type !== "string") throw type;
        this.current = entry;
        const verdict = await this.onEntry({ path: entry.path, type, size: entry.size, body: entry });
        if (verdict === "stop") {
          this.stopped = true;
          this.cutOff();
        }
      } catch (err) {
        this.fail(err);
      } finally {
        this.current = undefined;
        // Whatever the handler did not read is drained, so the parser moves on (or winds down).
        entry.resume();
      }
    });
  }

  private cutOff(): void {
    this.stdout.unpipe(this.sink);
    // Once its output has ended zstd exits by itself, with its own verdict on the input.
    if (!this.drained) this.zstd.process.kill("SIGKILL");
    this.settle();
  }

  private fail(err: unknown): void {
    this.failure ??= err;
    this.cutOff();
    // A handler waiting for more of this entry's body would wait forever: end it.
    this.current?.destroy();
  }
}

function entryType(entry: ReadEntry): "file" | "directory" | ForkdError {
  if (entry.type === "File" || entry.type === "OldFile") return "file";
  if (entry.type === "Directory") return "directory";
  const kind =
    entry.type === "SymbolicLink" ? "a symbolic link" : entry.type === "Link" ? "a hard link" : entry.type;
  return new ForkdError(
    "unprocessable",
    `pack entry ${JSON.stringify(entry.path)} refused: it is ${kind} (only regular files and directories)`,
  );
}

interface Zstd {
  process: ChildProcess;
  /** Resolves when zstd exits 0; rejects with its message otherwise. */
  done: Promise<void>;
}

function spawnZstd(
  args: string[],
  stdio: ["pipe" | "ignore", "pipe" | number, "pipe"],
  signal?: AbortSignal,
): Zstd {
  const child = spawn(ZSTD_BINARY, args, { stdio, signal });
  let stderr = "";
  child.stderr?.on("data", (chunk: Buffer) => {
    if (stderr.length < 4096) stderr += chunk.toString("utf8");
  });
  // A reader that stops early closes the pipe under zstd: that is not zstd's failure.
  child.stdin?.on("error", () => {});
  const done = new Promise<void>((resolve, reject) => {
    child.on("error", (err: NodeJS.ErrnoException) => {
      reject(
        err.code === "ENOENT"
          ? new ForkdError("unavailable", `${ZSTD_BINARY} is not installed (Debian package zstd)`)
          : signal?.aborted
            ? signal.reason
            : new ForkdError("internal", `${ZSTD_BINARY}: ${errorMessage(err)}`),
      );
    });
    child.on("close", (code, sig) => {
      if (code === 0) resolve();
      else
        reject(
          new ForkdError(
            "unprocessable",
            `${ZSTD_BINARY} ${args.includes("-d") ? "could not decompress the pack" : "failed"}: ${
              stderr.trim().split("\n").pop() || (sig ? `killed by ${sig}` : `exit code ${code}`)
            }`,
          ),
        );
    });
  });
  return { process: child, done };
}

const SPARSE_BLOCK = 4096;
const SPARSE_BUFFER = 1024 * 1024;
const ZERO_BLOCK = Buffer.alloc(SPARSE_BLOCK);

/**
 * Hashes a stream and, when given a file, writes it there with all-zero 4 KiB blocks left as holes: a packed
 * RAM image or root filesystem is mostly zeros, and unpacking it must not make it dense.
 */
export class SparseHashWriter {
  private readonly hash: Hash = createHash("sha256");
  private readonly buffer = Buffer.allocUnsafe(SPARSE_BUFFER);
  private filled = 0;
  private written = 0;

  private constructor(private readonly handle: FileHandle | null) {}

  /** Writes to a new file `file` (created exclusively, mode 0600), or only hashes when `file` is null. */
  static async create(file: string | null): Promise<SparseHashWriter> {
    if (file === null) return new SparseHashWriter(null);
    const handle = await open(file, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, 0o600);
    return new SparseHashWriter(handle);
  }

  get bytes(): number {
    return this.written + this.filled;
  }

  async write(chunk: Buffer): Promise<void> {
    this.hash.update(chunk);
    if (!this.handle) {
      this.written += chunk.length;
      return;
    }
    let at = 0;
    while (at < chunk.length) {
      const n = Math.min(chunk.length - at, SPARSE_BUFFER - this.filled);
      chunk.copy(this.buffer, this.filled, at, at + n);
      this.filled += n;
      at += n;
      if (this.filled === SPARSE_BUFFER) await this.flush();
    }
  }

  /** Flushes, sizes the file (trailing holes included), syncs and closes it; returns size and sha256. */
  async finish(): Promise<{ size: number; sha256: string }> {
    if (this.handle) {
      try {
        await this.flush();
        await this.handle.truncate(this.written);
        await this.handle.sync();
      } finally {
        await this.handle.close();
      }
    }
    return { size: this.written, sha256: this.hash.digest("hex") };
  }

  /** Closes the file without finishing it (the caller removes it). */
  async abandon(): Promise<void> {
    await this.handle?.close().catch(() => {});
  }

  private async flush(): Promise<void> {
    const handle = this.handle as FileHandle;
    let run = -1;
    for (let block = 0; block < this.filled; block += SPARSE_BLOCK) {
      const end = Math.min(block + SPARSE_BLOCK, this.filled);
      const zero = this.buffer.subarray(block, end).equals(ZERO_BLOCK.subarray(0, end - block));
      if (!zero && run < 0) run = block;
      if (zero && run >= 0) {
        await handle.write(this.buffer, run, block - run, this.written + run);
        run = -1;
      }
    }
    if (run >= 0) await handle.write(this.buffer, run, this.filled - run, this.written + run);
    this.written += this.filled;
    this.filled = 0;
  }
}
