/** QEMU's command-line tools: version of the emulator, qcow2 overlays with qemu-img. */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import fsp from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { resolveQemuBinary } from "./qemu-process.js";

export const QEMU_IMG_BINARY = "qemu-img";

/** `--version` and `qemu-img create` answer in milliseconds; this bounds a hung binary. */
export const TOOL_TIMEOUT_MS = 30_000;

/** Output kept from a tool run; their messages are short. */
const TOOL_MAX_OUTPUT_BYTES = 1024 * 1024;

export interface QemuVersion {
  /** e.g. "7.2.22" */
  version: string;
  major: number;
  minor: number;
  /** The first line of `--version`, e.g. "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)". */
  banner: string;
}

const versionCache = new Map<string, Promise<QemuVersion>>();

/** `qemu-system-x86_64 --version`, parsed; memoised per binary. */
export function qemuVersion(binary?: string): Promise<QemuVersion> {
  const resolved = resolveQemuBinary(binary);
  let cached = versionCache.get(resolved);
  if (!cached) {
    cached = run(resolved, ["--version"]).then((stdout) => {
      const banner = stdout.split("\n")[0]?.trim() ?? "";
      const match = /version (\d+)\.(\d+)(?:\.(\d+))?/.exec(banner);
      if (!match)
        throw new ForkdError("unavailable", `cannot parse QEMU version from ${JSON.stringify(banner)}`);
      const version =
        match[3] === undefined ? `${match[1]}.${match[2]}` : `${match[1]}.${match[2]}.${match[3]}`;
      return { version, major: Number(match[1]), minor: Number(match[2]), banner };
    });
    cached.catch(() => versionCache.delete(resolved));
    versionCache.set(resolved, cached);
  }
  return cached;
}

export interface CreateOverlayOptions {
  /**
   * Existing image the overlay reads through to, stored in the overlay as given. A relative path is resolved
   * against the overlay's directory (by qemu-img now and by QEMU whenever the overlay is opened), which keeps
   * a tree of layers relocatable.
   */
  backing: string;
  backingFormat: "qcow2" | "raw";
  overlay: string;
  binary?: string;
}

/**
 * `qemu-img create -f qcow2 -b <backing> -F <fmt> <overlay>`, written under a temp name in the overlay's
 * directory and renamed when complete, so a crash never leaves a half-made overlay at `overlay`.
 */
export async function createOverlay(options: CreateOverlayOptions): Promise<void> {
  if (!path.isAbsolute(options.overlay)) {
    throw new ForkdError("invalid_argument", `overlay must be an absolute path: ${options.overlay}`);
  }
  if (options.backingFormat !== "qcow2" && options.backingFormat !== "raw") {
    throw new ForkdError(
      "invalid_argument",
      `backingFormat must be qcow2 or raw, got ${options.backingFormat}`,
    );
  }
  const partial = path.join(
    path.dirname(options.overlay),
    `.${path.basename(options.overlay)}.${randomBytes(4).toString("hex")}.partial`,
  );
  try {
    await run(options.binary ?? QEMU_IMG_BINARY, [
      "create",
      "-q",
      "-f",
      "qcow2",
      "-b",
      options.backing,
      "-F",
      options.backingFormat,
      partial,
    ]);
    await fsp.rename(partial, options.overlay);
  } finally {
    await fsp.rm(partial, { force: true });
  }
}

function run(binary: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      binary,
      args,
      { timeout: TOOL_TIMEOUT_MS, maxBuffer: TOOL_MAX_OUTPUT_BYTES, encoding: "utf8" },
      (err, stdout, stderr) => {
        if (!err) return resolve(stdout);
        const code = (err as NodeJS.ErrnoException).code;
        const detail = stderr.trim().slice(-2000) || (typeof code === "string" ? code : err.message);
        reject(new ForkdError("unavailable", `${binary} ${args[0]} failed: ${detail}`, { cause: err }));
      },
    );
  });
}
