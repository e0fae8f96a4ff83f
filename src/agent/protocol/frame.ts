/**
 * Framing of the agent byte stream: encode one frame, and decode frames from arbitrarily split or merged
 * chunks. The decoder trusts nothing: every length is checked before anything is buffered for it, and after
 * a bad frame it resynchronises on the next magic instead of giving up on the stream.
 */
import { ForkdError } from "../../common/errors.js";
import { FRAME_MAGIC, FRAME_PREFIX_BYTES, MAX_FRAME_BYTES, MAX_HEADER_BYTES } from "./limits.js";

/** A decoded frame: the JSON header (an object with a string `t`) and the raw body (possibly empty). */
export interface Frame {
  header: { t: string; [key: string]: unknown };
  body: Buffer;
}

export type FrameErrorReason =
  | "bad_magic"
  | "frame_too_large"
  | "header_too_large"
  | "bad_header_length"
  | "bad_header"
  | "header_not_object";

/** A frame (or stray bytes) that could not be decoded; the decoder has already skipped past it. */
export class FrameError extends ForkdError {
  readonly reason: FrameErrorReason;

  constructor(reason: FrameErrorReason, message: string) {
    super("invalid_argument", message);
    this.name = "FrameError";
    this.reason = reason;
  }
}

const EMPTY = Buffer.alloc(0);
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** Encodes one frame. Throws `payload_too_large` when the header or the whole frame exceeds the limits. */
export function encodeFrame(header: object, body: Buffer = EMPTY): Buffer {
  const headerBytes = Buffer.from(JSON.stringify(header), "utf8");
  if (headerBytes.length > MAX_HEADER_BYTES) {
    throw new ForkdError(
      "payload_too_large",
      `frame header of ${headerBytes.length} bytes exceeds the ${MAX_HEADER_BYTES}-byte limit`,
    );
  }
  const total = FRAME_PREFIX_BYTES + headerBytes.length + body.length;
  if (total > MAX_FRAME_BYTES) {
    throw new ForkdError(
      "payload_too_large",
      `frame of ${total} bytes exceeds the ${MAX_FRAME_BYTES}-byte limit`,
    );
  }
  const frame = Buffer.allocUnsafe(total);
  FRAME_MAGIC.copy(frame, 0);
  frame.writeUInt32BE(headerBytes.length + body.length, 4);
  frame.writeUInt32BE(headerBytes.length, 8);
  headerBytes.copy(frame, FRAME_PREFIX_BYTES);
  body.copy(frame, FRAME_PREFIX_BYTES + headerBytes.length);
  return frame;
}

export interface FrameDecoderHandlers {
  onFrame(frame: Frame): void;
  /** Called once per stretch of undecodable bytes, with what was wrong at its start. */
  onError(error: FrameError): void;
}

export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** True while skipping bytes after an error, so one stretch of garbage reports one error. */
  private skipping = false;
  private skippedBytes = 0;
  private readonly handlers: FrameDecoderHandlers;

  constructor(handlers: FrameDecoderHandlers) {
    this.handlers = handlers;
  }

  /** Bytes held waiting for the rest of a frame. Never more than MAX_FRAME_BYTES plus one chunk. */
  get bufferedBytes(): number {
    return this.buffered;
  }

  /** Bytes dropped while resynchronising since this decoder was created or reset. */
  get droppedBytes(): number {
    return this.skippedBytes;
  }

  /** Forgets any partial frame, e.g. when the peer reconnected and the old stream's tail is meaningless. */
  reset(): void {
    this.chunks = [];
    this.buffered = 0;
    this.skipping = false;
  }

  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    this.drain();
  }

  private drain(): void {
    while (this.buffered >= FRAME_PREFIX_BYTES) {
      const prefix = this.peek(FRAME_PREFIX_BYTES);
      if (prefix.compare(FRAME_MAGIC, 0, 4, 0, 4) !== 0) {
        this.fail("bad_magic", "stream does not start with a frame magic");
        continue;
      }
      const frameLength = prefix.readUInt32BE(4);
      const headerLength = prefix.readUInt32BE(8);
      if (frameLength > MAX_FRAME_BYTES - FRAME_PREFIX_BYTES) {
        this.fail(
          "frame_too_large",
          `frame of ${frameLength} bytes exceeds the ${MAX_FRAME_BYTES}-byte limit`,
        );
        continue;
      }
      if (headerLength > MAX_HEADER_BYTES) {
        this.fail(
          "header_too_large",
          `header of ${headerLength} bytes exceeds the ${MAX_HEADER_BYTES}-byte limit`,
        );
        continue;
      }
      if (headerLength < 2 || headerLength > frameLength) {
        this.fail(
          "bad_header_length",
          `header length ${headerLength} does not fit frame length ${frameLength}`,
        );
        continue;
      }
      const total = FRAME_PREFIX_BYTES + frameLength;
      if (this.buffered < total) return;
      const frame = this.peek(total);
      let header: unknown;
      try {
        header = JSON.parse(
          strictUtf8.decode(frame.subarray(FRAME_PREFIX_BYTES, FRAME_PREFIX_BYTES + headerLength)),
        );
      } catch (err) {
        this.fail("bad_header", `frame header is not UTF-8 JSON: ${(err as Error).message}`);
        continue;
      }
      if (typeof header !== "object" || header === null || Array.isArray(header)) {
        this.fail("header_not_object", "frame header is not a JSON object");
        continue;
      }
      if (typeof (header as { t?: unknown }).t !== "string") {
        this.fail("header_not_object", "frame header has no string field 't'");
        continue;
      }
      this.consume(total);
      this.skipping = false;
      // Copy the body out so the frame does not pin a merged buffer that also holds later frames.
      const body =
        frameLength > headerLength
          ? Buffer.from(frame.subarray(FRAME_PREFIX_BYTES + headerLength, total))
          : EMPTY;
      this.handlers.onFrame({ header: header as Frame["header"], body });
    }
  }

  /** Reports (once per stretch) and skips to the next magic after the current position. */
  private fail(reason: FrameErrorReason, message: string): void {
    if (!this.skipping) {
      this.skipping = true;
      this.handlers.onError(new FrameError(reason, message));
    }
    const all = this.peek(this.buffered);
    const next = all.indexOf(FRAME_MAGIC, 1);
    if (next >= 0) {
      this.skippedBytes += next;
      this.consume(next);
      return;
    }
    // Keep a tail that might be the start of a magic split across chunks.
    const keep = Math.min(FRAME_MAGIC.length - 1, this.buffered - 1);
    this.skippedBytes += this.buffered - keep;
    this.consume(this.buffered - keep);
  }

  /** The first `n` buffered bytes as one contiguous buffer (merging chunks only as far as needed). */
  private peek(n: number): Buffer {
    const first = this.chunks[0] as Buffer;
    if (first.length >= n) return first;
    let count = 0;
    let length = 0;
    while (length < n) length += (this.chunks[count++] as Buffer).length;
    const merged = Buffer.concat(this.chunks.slice(0, count), length);
    this.chunks.splice(0, count, merged);
    return merged;
  }

  private consume(n: number): void {
    this.buffered -= n;
    while (n > 0) {
      const first = this.chunks[0] as Buffer;
      if (first.length <= n) {
        this.chunks.shift();
        n -= first.length;
      } else {
        this.chunks[0] = first.subarray(n);
        n = 0;
      }
    }
  }
}
