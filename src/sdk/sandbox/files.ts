/** `sandbox.files`: read, write, list, stat and remove files inside the sandbox; binary-safe. */
import type { Controller } from "../controller.js";
import { InvalidArgumentError, NotFoundError, SandboxNotFoundError } from "../errors.js";
import type { RequestOptions } from "../settings.js";
import type { FileInfo } from "../wire.js";

export interface EntryInfo {
  name: string;
  /** Absolute path in the sandbox. */
  path: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  modifiedTime: Date | undefined;
  symlinkTarget: string | undefined;
}

export interface FileReadOptions extends RequestOptions {
  /** "text" (UTF-8, the default) or "bytes". */
  format?: "text" | "bytes";
  /** Refuse files larger than this many bytes. */
  maxBytes?: number;
}

export interface FileWriteOptions extends RequestOptions {
  /** Permission bits of a new file, e.g. 0o755. */
  mode?: number;
}

export type FileData = string | Uint8Array | ArrayBuffer;

export class Files {
  /** @internal */
  constructor(
    private readonly controller: Controller,
    private readonly sandboxId: string,
    private readonly diagnose: (err: unknown, what: string) => Promise<unknown>,
  ) {}

  /** Reads a file as UTF-8 text (default) or, with `format: "bytes"`, as raw bytes. */
  async read(path: string, options?: FileReadOptions & { format?: "text" }): Promise<string>;
  async read(path: string, options: FileReadOptions & { format: "bytes" }): Promise<Uint8Array>;
  async read(path: string, options: FileReadOptions = {}): Promise<string | Uint8Array> {
    const format = options.format ?? "text";
    if (format !== "text" && format !== "bytes") {
      throw new InvalidArgumentError(`format must be "text" or "bytes", got ${JSON.stringify(format)}`);
    }
    const data = await this.guard(`reading ${path}`, () =>
      this.controller.readFile(this.sandboxId, path, options),
    );
    return format === "bytes" ? data : data.toString("utf8");
  }

  /** Replaces (or creates) the file at `path`, creating missing parent directories. */
  async write(
    path: string,
    data: FileData,
    options: FileWriteOptions = {},
  ): Promise<{ path: string; bytes: number }> {
    const bytes =
      typeof data === "string"
        ? data
        : data instanceof ArrayBuffer
          ? new Uint8Array(data)
          : ArrayBuffer.isView(data)
            ? data
            : undefined;
    if (bytes === undefined)
      throw new InvalidArgumentError("data must be a string, a Uint8Array/Buffer or an ArrayBuffer");
    const written = await this.guard(`writing ${path}`, () =>
      this.controller.writeFile(this.sandboxId, path, bytes, options),
    );
    return { path, bytes: written.bytes };
  }

  /** Lists a directory's entries. */
  async list(path: string, options: RequestOptions = {}): Promise<EntryInfo[]> {
    const listing = await this.guard(`listing ${path}`, () =>
      this.controller.listFiles(this.sandboxId, path, options),
    );
    return listing.entries.map((entry) => entryInfo(entry, joinPath(path, entry.name)));
  }

  /** Information about one file or directory (symlinks are not followed). */
  async stat(path: string, options: RequestOptions = {}): Promise<EntryInfo> {
    const info = await this.guard(`stat of ${path}`, () =>
      this.controller.statFile(this.sandboxId, path, options),
    );
    return entryInfo(info, path);
  }

  /** Same as `stat` (the E2B SDK's name). */
  async getInfo(path: string, options: RequestOptions = {}): Promise<EntryInfo> {
    return this.stat(path, options);
  }

  /** true if something exists at `path`. */
  async exists(path: string, options: RequestOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, options);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError && !(err instanceof SandboxNotFoundError)) return false;
      throw err;
    }
  }

  /** Removes a file, or a directory (with `recursive: true` if it is not empty). */
  async remove(path: string, options: RequestOptions & { recursive?: boolean } = {}): Promise<void> {
    await this.guard(`removing ${path}`, () => this.controller.removeFile(this.sandboxId, path, options));
  }

  private async guard<T>(what: string, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (err) {
      throw await this.diagnose(err, what);
    }
  }
}

function entryInfo(info: FileInfo, path: string): EntryInfo {
  const known: readonly string[] = ["file", "dir", "symlink"];
  const type = (known.includes(info.type) ? info.type : "other") as EntryInfo["type"];
  return {
    name: info.name,
    path,
    type,
    size: info.size,
    mode: info.mode,
    modifiedTime: typeof info.mtime_ms === "number" ? new Date(info.mtime_ms) : undefined,
    symlinkTarget: typeof info.link_target === "string" ? info.link_target : undefined,
  };
}

function joinPath(dir: string, name: string): string {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}
