/**
 * Snapshot packs over the wire: the download of GET /v1/snapshots/:tag/pack into a file (complete or absent), and
 * the streamed upload request of POST /v1/snapshots/unpack. The Controller's packSnapshot/unpackSnapshot call them.
 */
import { createReadStream } from "node:fs";
import { type FileHandle, open, rm, stat } from "node:fs/promises";
import {
  DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS,
  PACK_CHAIN_HEADER,
  PACK_CONTENT_TYPE,
} from "../common/limits.js";
import { CallScope } from "./call-scope.js";
import { InvalidArgumentError } from "./errors.js";
import { required } from "./options.js";
import { checkDurationMs, type RequestOptions, type ResolvedSettings } from "./settings.js";
import { type HttpRequest, openStream, pathOf, streamFailure } from "./transport.js";

export interface PackOptions extends RequestOptions {
  /** The file to write; it must not exist. */
  out: string;
  /** Leave the guest image out (the target must have that exact image build). */
  withoutImage?: boolean;
  /** zstd level, 1..19. @default the daemon's (3) */
  level?: number;
  /** Longest wait for the whole download in ms; 0 = no limit. @default 1_800_000 (30 minutes) */
  timeoutMs?: number;
}

export interface UnpackOptions extends RequestOptions {
  /** The head's new tag. */
  tag?: string;
  /** Replace same-tagged snapshots that differ. */
  force?: boolean;
  /** Longest wait for the upload and install in ms; 0 = no limit. @default 1_800_000 (30 minutes) */
  timeoutMs?: number;
}

export interface PackDownload {
  out: string;
  bytes: number;
  /** Root first. */
  chain: string[];
}

/** Downloads the pack of `tag` into `options.out`; a failed download leaves no file. */
export async function downloadPack(
  settings: ResolvedSettings,
  tag: string,
  options: PackOptions,
): Promise<PackDownload> {
  const out = required(options.out, "out");
  const timeoutMs = options.timeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS;
  checkDurationMs(timeoutMs, "timeoutMs");
  const scope = new CallScope(options.signal);
  scope.deadline(timeoutMs, "timeoutMs", `packing ${tag}`);
  const query: Record<string, string | number | boolean> = {};
  if (options.withoutImage) query.without_image = true;
  if (options.level !== undefined) query.level = options.level;
  const request: HttpRequest = {
    method: "GET",
    path: pathOf`/v1/snapshots/${required(tag, "tag")}/pack`,
    query,
    accept: PACK_CONTENT_TYPE,
  };
  let file: FileHandle;
  try {
    file = await open(out, "wx", 0o600);
  } catch (err) {
    scope.dispose();
    throw new InvalidArgumentError(`cannot write the pack to ${out}: ${(err as NodeJS.ErrnoException).code}`);
  }
  let bytes = 0;
  try {
    const response = await openStream(settings, request, scope);
    try {
      for await (const chunk of response as AsyncIterable<Buffer>) {
        bytes += chunk.length;
        await file.write(chunk);
      }
    } catch (err) {
      throw await streamFailure(settings, request, scope, err);
    }
    if (!response.complete) {
      throw await streamFailure(settings, request, scope, new Error("the pack ended early"));
    }
    await file.close();
    const chain = String(response.headers[PACK_CHAIN_HEADER] ?? "")
      .split(",")
      .filter(Boolean);
    return { out, bytes, chain };
  } catch (err) {
    await file.close().catch(() => {});
    await rm(out, { force: true });
    throw err;
  } finally {
    scope.dispose();
  }
}

/** The upload of the pack in `file` (streamed from disk; checked to be readable first). */
export async function packUploadRequest(file: string, options: UnpackOptions): Promise<HttpRequest> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS;
  checkDurationMs(timeoutMs, "timeoutMs");
  await stat(required(file, "file")).catch((err: NodeJS.ErrnoException) => {
    throw new InvalidArgumentError(`cannot read the pack ${file}: ${err.code}`);
  });
  const query: Record<string, string | boolean> = {};
  if (options.tag !== undefined) query.tag = options.tag;
  if (options.force) query.force = true;
  return {
    method: "POST",
    path: "/v1/snapshots/unpack",
    query,
    bodyStream: createReadStream(file) as AsyncIterable<Buffer>,
    contentType: PACK_CONTENT_TYPE,
    deadlineMs: timeoutMs,
    deadlineSetting: "timeoutMs",
  };
}
