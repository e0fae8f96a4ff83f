/**
 * A VM's serial console as the host keeps it: a bounded log, never more than `maxBytes` on disk however much
 * the guest prints. Two files, `<path>` and `<path>.1`, each at most half the budget: when the current one
 * would pass its half it becomes `.1` (the older half is dropped) and a new one starts, so the last output is
 * always kept and plain tools (`tail`) can read both.
 *
 * The files live in the VM's run directory, which belongs to the (unprivileged) QEMU: it could rename or
 * replace them. Every open is O_NOFOLLOW, new files are O_EXCL, and a file found on reopening (after a daemon
 * restart) is used only if it is a regular file of ours with one link; otherwise it is replaced.
 */
import { constants } from "node:fs";
import fsp from "node:fs/promises";

/** Default budget per VM: 4 MiB (two halves of 2 MiB). */
export const DEFAULT_CONSOLE_LOG_BYTES = 4 * 2 ** 20;
/** Below this the halves are too small to hold a kernel panic's backtrace. */
export const MIN_CONSOLE_LOG_BYTES = 16 * 1024;
export const MAX_CONSOLE_LOG_BYTES = 1024 * 2 ** 20;

const OPEN_APPEND = constants.O_WRONLY | constants.O_APPEND | constants.O_NOFOLLOW;
const CREATE = OPEN_APPEND | constants.O_CREAT | constants.O_EXCL;
const OPEN_READ = constants.O_RDONLY | constants.O_NOFOLLOW;

export class ConsoleLog {
  private handle: fsp.FileHandle | undefined;
  private size = 0;
  private queue: Promise<void> = Promise.resolve();
  private closed = false;

  private constructor(
    readonly path: string,
    readonly maxBytes: number,
  ) {}

  /** Opens the log at `path` (continuing one a previous daemon wrote, if it is intact). */
  static async open(path: string, maxBytes = DEFAULT_CONSOLE_LOG_BYTES): Promise<ConsoleLog> {
    if (!Number.isInteger(maxBytes) || maxBytes < MIN_CONSOLE_LOG_BYTES || maxBytes > MAX_CONSOLE_LOG_BYTES) {
      throw new RangeError(
        `console log size ${maxBytes} must be an integer in ${MIN_CONSOLE_LOG_BYTES}..${MAX_CONSOLE_LOG_BYTES} bytes`,
      );
    }
    const log = new ConsoleLog(path, maxBytes);
    await log.openCurrent();
    return log;
  }

  private get half(): number {
    return Math.floor(this.maxBytes / 2);
  }

  /** Appends `chunk` (in order with earlier writes); resolves once it is written. */
  write(chunk: Buffer): Promise<void> {
    const next = this.queue.then(() => this.append(chunk));
    this.queue = next.catch(() => {});
    return next;
  }

  /** The last `maxBytes` bytes of output (both halves), as written. */
  async tail(maxBytes: number): Promise<Buffer> {
    await this.queue;
    return readTail(this.path, maxBytes);
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.queue;
    await this.handle?.close().catch(() => {});
    this.handle = undefined;
  }

  private async append(chunk: Buffer): Promise<void> {
    if (this.closed) return;
    // A chunk larger than a half keeps only its end: that is what the log would hold after writing it anyway.
    const data = chunk.length > this.half ? chunk.subarray(chunk.length - this.half) : chunk;
    if (this.size + data.length > this.half) await this.rotate();
    const handle = this.handle;
    if (!handle) return;
    await handle.write(data);
    this.size += data.length;
  }

  private async rotate(): Promise<void> {
    await this.handle?.close().catch(() => {});
    this.handle = undefined;
    await fsp.rm(`${this.path}.1`, { recursive: true, force: true });
    await fsp.rename(this.path, `${this.path}.1`).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOENT") throw err;
    });
    await this.create();
  }

  private async openCurrent(): Promise<void> {
    try {
      const handle = await fsp.open(this.path, OPEN_APPEND);
      const st = await handle.stat();
      if (st.isFile() && st.uid === process.getuid?.() && st.nlink === 1 && st.size <= this.half) {
        this.handle = handle;
        this.size = st.size;
        return;
      }
      await handle.close();
    } catch (err) {
      if (
        (err as NodeJS.ErrnoException).code !== "ENOENT" &&
        (err as NodeJS.ErrnoException).code !== "ELOOP"
      ) {
        throw err;
      }
    }
    await fsp.rm(this.path, { recursive: true, force: true });
    await this.create();
  }

  private async create(): Promise<void> {
    try {
      this.handle = await fsp.open(this.path, CREATE, 0o600);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      // Something appeared under the name meanwhile (only the VM's own uid could do that): replace it once.
      await fsp.rm(this.path, { recursive: true, force: true });
      this.handle = await fsp.open(this.path, CREATE, 0o600);
    }
    this.size = 0;
  }
}

/** The last `maxBytes` of the log at `path` (older half first), read without following symlinks. */
export async function readTail(path: string, maxBytes: number): Promise<Buffer> {
  const current = await readEnd(path, maxBytes);
  if (current.length >= maxBytes) return current;
  const older = await readEnd(`${path}.1`, maxBytes - current.length);
  return Buffer.concat([older, current]);
}

async function readEnd(file: string, maxBytes: number): Promise<Buffer> {
  let handle: fsp.FileHandle;
  try {
    handle = await fsp.open(file, OPEN_READ);
  } catch {
    return Buffer.alloc(0);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) return Buffer.alloc(0);
    const length = Math.min(st.size, maxBytes);
    const buffer = Buffer.alloc(length);
    const { bytesRead } = await handle.read(buffer, 0, length, st.size - length);
    return buffer.subarray(0, bytesRead);
  } finally {
    await handle.close();
  }
}

/** Console output made safe to show: control characters other than newline and tab removed (it is untrusted). */
export function printableConsole(data: Buffer): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: stripping control characters is the point
  return data.toString("utf8").replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "");
}
