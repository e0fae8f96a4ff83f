/**
 * The console's page: the files `npm run build` bundled into dist/console (console/, built with Vite), read once
 * at start and served from memory under /console/. Nothing is fetched from anywhere else at runtime, and every
 * console response carries a Content-Security-Policy that allows scripts, styles, fonts and connections from
 * this origin only.
 */
import { createHash } from "node:crypto";
import { readdir, readFile, stat } from "node:fs/promises";
import path from "node:path";
import { packageRoot } from "../common/package-root.js";

/** Bounds on what is loaded (the build output is a few hundred KiB; anything far larger is a mistake). */
const MAX_FILES = 500;
const MAX_TOTAL_BYTES = 32 * 1024 * 1024;

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".woff2": "font/woff2",
  ".json": "application/json",
  ".map": "application/json",
  ".txt": "text/plain; charset=utf-8",
};

/**
 * `style-src 'unsafe-inline'`: xterm.js sizes its rows and applies its theme through <style> elements it creates.
 * Scripts stay strictly same-origin files: no inline script, no eval.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join("; ");

/** Headers on every console response (the page, its files, its API answers). */
export const CONSOLE_HEADERS: Record<string, string> = {
  "content-security-policy": CONSOLE_CSP,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
};

export interface StaticFile {
  body: Buffer;
  type: string;
  etag: string;
  /** Vite names bundled assets by content hash: they never change under the same name. */
  immutable: boolean;
}

export interface ConsoleFiles {
  /** Where the files came from. */
  dir: string;
  /** By path below /console/ ("index.html", "assets/index-abc123.js"). */
  files: Map<string, StaticFile>;
}

/** The console's build output directory. */
export function defaultConsoleDir(): string {
  return path.join(packageRoot(), "dist", "console");
}

/** Loads the built console; `files` is empty when it was not built (the daemon then says so at /console). */
export async function loadConsoleFiles(dir = defaultConsoleDir()): Promise<ConsoleFiles> {
  const files = new Map<string, StaticFile>();
  const info = await stat(dir).catch(() => null);
  if (!info?.isDirectory()) return { dir, files };
  let total = 0;
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  for (const entry of entries) {
    if (!entry.isFile()) continue;
    const full = path.join(entry.parentPath, entry.name);
    const relative = path.relative(dir, full).split(path.sep).join("/");
    const type = CONTENT_TYPES[path.extname(entry.name).toLowerCase()];
    if (type === undefined || relative.split("/").some((part) => part.startsWith("."))) continue;
    if (files.size >= MAX_FILES) throw new Error(`${dir} holds more than ${MAX_FILES} files`);
    const body = await readFile(full);
    total += body.length;
    if (total > MAX_TOTAL_BYTES) throw new Error(`${dir} holds more than ${MAX_TOTAL_BYTES} bytes`);
    files.set(relative, {
      body,
      type,
      etag: `"${createHash("sha256").update(body).digest("base64url").slice(0, 27)}"`,
      immutable: relative.startsWith("assets/"),
    });
  }
  return { dir, files };
}
