/**
 * The file ops. Writes are atomic (a temp file beside the target, renamed into place), reads never block on
 * FIFOs, and filesystem errors become catalogue errors naming the op and the path.
 */
import { constants } from "node:fs";
import { chmod, lstat, mkdir, open, readdir, readlink, rename, rm, rmdir } from "node:fs/promises";
import path from "node:path";
import { type ErrorCode, ForkdError } from "../../common/errors.js";
import {
  type FileInfo,
  type FileListResult,
  type FileReadResult,
  type FileType,
  MAX_FILE_BYTES,
  MAX_LIST_ENTRIES,
  type OpArgs,
  type OpResult,
} from "../protocol/index.js";
import type { OpOutcome } from "./call.js";

const ERRNO_CODES: Record<string, ErrorCode> = {
  ENOENT: "not_found",
  EEXIST: "conflict",
  ENOTEMPTY: "conflict",
  EBUSY: "conflict",
  ENOTDIR: "invalid_argument",
  EISDIR: "invalid_argument",
  EACCES: "invalid_argument",
  EPERM: "invalid_argument",
  EROFS: "invalid_argument",
  ELOOP: "invalid_argument",
  ENAMETOOLONG: "invalid_argument",
  EINVAL: "invalid_argument",
  EXDEV: "invalid_argument",
  ENOSPC: "unavailable",
  EDQUOT: "unavailable",
  EMFILE: "unavailable",
  ENFILE: "unavailable",
};

/** Maps a Node filesystem error to a catalogue error: "file.read /x: no such file or directory (ENOENT)". */
export function fsError(err: unknown, op: string, target: string): ForkdError {
  if (err instanceof ForkdError) return err;
  const errno = (err as NodeJS.ErrnoException).code;
  const message = (err as Error).message ?? String(err);
  const description = /^[A-Z0-9_]+: ([^,]+)/.exec(message)?.[1] ?? message;
  const code = (errno && ERRNO_CODES[errno]) || "internal";
  return new ForkdError(code, `${op} ${target}: ${description}${errno ? ` (${errno})` : ""}`, { cause: err });
}

function fileType(stats: { isFile(): boolean; isDirectory(): boolean; isSymbolicLink(): boolean }): FileType {
  if (stats.isFile()) return "file";
  if (stats.isDirectory()) return "dir";
  if (stats.isSymbolicLink()) return "symlink";
  return "other";
}

let tempCounter = 0;

export async function fileWrite(
  args: OpArgs<"file.write">,
  data: Buffer,
): Promise<OpOutcome<OpResult<"file.write">>> {
  const target = args.path;
  const name = path.basename(target);
  if (target.endsWith("/") || name === "" || name === "." || name === "..") {
    throw new ForkdError("invalid_argument", `file.write ${target}: needs a file path, not a directory`);
  }
  if (data.length > MAX_FILE_BYTES) {
    throw new ForkdError(
      "payload_too_large",
      `file.write ${target}: ${data.length} bytes exceeds ${MAX_FILE_BYTES}`,
    );
  }
  const dir = path.dirname(target);
  const mode = args.mode ?? 0o644;
  const temp = path.join(dir, `.${name.slice(0, 200)}.forkd-${process.pid}-${++tempCounter}.tmp`);
  if (args.parents !== false) {
    await mkdir(dir, { recursive: true }).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "EEXIST" || err.code === "ENOTDIR") {
        throw new ForkdError(
          "invalid_argument",
          `file.write ${target}: a parent of it exists and is not a directory`,
        );
      }
      throw fsError(err, "file.write", target);
    });
  }
  try {
    const handle = await open(temp, "wx", mode);
    try {
      await handle.writeFile(data);
    } finally {
      await handle.close();
    }
    await chmod(temp, mode); // open()'s mode is filtered by the umask; the caller asked for exactly this one
    await rename(temp, target);
  } catch (err) {
    await rm(temp, { force: true }).catch(() => {});
    throw fsError(err, "file.write", target);
  }
  return { result: { bytes: data.length } };
}

export async function fileRead(args: OpArgs<"file.read">): Promise<OpOutcome<FileReadResult>> {
  let handle: Awaited<ReturnType<typeof open>>;
  try {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it would pin a threadpool thread forever).
    handle = await open(args.path, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch (err) {
    throw fsError(err, "file.read", args.path);
  }
  try {
    const stats = await handle.stat();
    if (stats.isDirectory())
      throw new ForkdError("invalid_argument", `file.read ${args.path}: is a directory`);
    if (stats.isFIFO() || stats.isSocket()) {
      throw new ForkdError("invalid_argument", `file.read ${args.path}: is a FIFO or socket, not a file`);
    }
    // Read one byte more than asked to learn whether there is more (sizes of /proc files are 0).
    const buffer = Buffer.allocUnsafe(args.max_bytes + 1);
    let filled = 0;
    let position = args.offset ?? 0;
    while (filled < buffer.length) {
      const { bytesRead } = await handle.read(buffer, filled, buffer.length - filled, position);
      if (bytesRead === 0) break;
      filled += bytesRead;
      position += bytesRead;
    }
    const truncated = filled > args.max_bytes;
    return {
      result: { size: stats.size, truncated },
      body: Buffer.from(buffer.subarray(0, Math.min(filled, args.max_bytes))),
    };
  } catch (err) {
    throw fsError(err, "file.read", args.path);
  } finally {
    await handle.close().catch(() => {});
  }
}

async function describe(target: string, name: string, withLink: boolean): Promise<FileInfo> {
  const stats = await lstat(target);
  const info: FileInfo = {
    name,
    type: fileType(stats),
    size: stats.size,
    mode: stats.mode & 0o7777,
    mtime_ms: stats.mtimeMs,
  };
  if (withLink && stats.isSymbolicLink()) info.link_target = await readlink(target);
  return info;
}

export async function fileStat(args: OpArgs<"file.stat">): Promise<OpOutcome<FileInfo>> {
  try {
    return { result: await describe(args.path, path.basename(args.path) || "/", true) };
  } catch (err) {
    throw fsError(err, "file.stat", args.path);
  }
}

export async function fileList(args: OpArgs<"file.list">): Promise<OpOutcome<FileListResult>> {
  const limit = args.max_entries ?? MAX_LIST_ENTRIES;
  let names: string[];
  try {
    names = (await readdir(args.path)).sort();
  } catch (err) {
    throw fsError(err, "file.list", args.path);
  }
  const kept = names.slice(0, limit);
  const entries = await Promise.all(
    kept.map((name) =>
      describe(path.join(args.path, name), name, false).catch(
        // Removed between readdir and lstat: still listed, as what little is known.
        (): FileInfo => ({ name, type: "other", size: 0, mode: 0, mtime_ms: 0 }),
      ),
    ),
  );
  return { result: { entries, truncated: names.length > limit } };
}

export async function fileRemove(args: OpArgs<"file.remove">): Promise<OpOutcome<OpResult<"file.remove">>> {
  if (path.resolve(args.path) === "/")
    throw new ForkdError("invalid_argument", "file.remove: refusing to remove /");
  try {
    const stats = await lstat(args.path);
    if (stats.isDirectory() && !args.recursive) {
      await rmdir(args.path).catch((err: NodeJS.ErrnoException) => {
        if (err.code === "ENOTEMPTY" || err.code === "EEXIST") {
          throw new ForkdError(
            "conflict",
            `file.remove ${args.path}: directory not empty (pass recursive to remove it)`,
          );
        }
        throw err;
      });
    } else {
      await rm(args.path, { recursive: args.recursive === true, force: false });
    }
  } catch (err) {
    throw fsError(err, "file.remove", args.path);
  }
  return { result: {} };
}
