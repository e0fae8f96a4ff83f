/**
 * Parsers for the daemon's streamed answers: NDJSON (one JSON value per line) and Server-Sent Events.
 * Both take raw byte chunks split anywhere (even inside a UTF-8 sequence) and bound the length of one record.
 */
import { StringDecoder } from "node:string_decoder";
import { MAX_STREAM_RECORD_BYTES } from "../common/limits.js";
import { ForkdSdkError } from "./errors.js";

/** One record of a stream, whichever framing carried it. */
export interface StreamEvent {
  /** SSE `event:` field; for NDJSON, the record's `type` (or `event`) field if it is a string. */
  event: string | undefined;
  data: unknown;
  /** SSE `id:` field. */
  id?: string;
}

export class StreamFormatError extends ForkdSdkError {}

/** Splits a byte stream into lines (LF, CRLF or, for SSE, lone CR), without the terminators. */
async function* lines(
  chunks: AsyncIterable<Buffer | Uint8Array | string>,
  allowLoneCr: boolean,
): AsyncGenerator<string> {
  const decoder = new StringDecoder("utf8");
  let pending = "";
  // A CR at the very end of a chunk may be the first half of a CRLF split across chunks.
  let crAtEnd = false;
  for await (const chunk of chunks) {
    let text = typeof chunk === "string" ? chunk : decoder.write(Buffer.from(chunk));
    if (crAtEnd && text.startsWith("\n")) text = text.slice(1);
    crAtEnd = false;
    pending += text;
    const pattern = allowLoneCr ? /\r\n|\n|\r/g : /\r?\n/g;
    let start = 0;
    for (let match = pattern.exec(pending); match !== null; match = pattern.exec(pending)) {
      if (match[0] === "\r" && match.index === pending.length - 1) {
        crAtEnd = true;
      }
      yield pending.slice(start, match.index);
      start = match.index + match[0].length;
    }
    pending = pending.slice(start);
    if (pending.length > MAX_STREAM_RECORD_BYTES) {
      throw new StreamFormatError(
        `a streamed record passed ${MAX_STREAM_RECORD_BYTES} bytes without a line end`,
      );
    }
  }
  pending += decoder.end();
  if (pending !== "") yield pending;
}

/** Parses NDJSON: every non-blank line is one JSON value. */
export async function* parseNdjson(
  chunks: AsyncIterable<Buffer | Uint8Array | string>,
): AsyncGenerator<StreamEvent> {
  for await (const line of lines(chunks, false)) {
    if (line.trim() === "") continue;
    let data: unknown;
    try {
      data = JSON.parse(line);
    } catch {
      throw new StreamFormatError(
        `the daemon streamed a line that is not JSON: ${JSON.stringify(line.slice(0, 120))}`,
      );
    }
    const record = data !== null && typeof data === "object" ? (data as Record<string, unknown>) : undefined;
    const type = record?.type ?? record?.event;
    yield { event: typeof type === "string" ? type : undefined, data };
  }
}

/**
 * Parses Server-Sent Events (the WHATWG event-stream format): `event:`, `data:` (joined by newlines), `id:`,
 * comments and `retry:` ignored. `data` is JSON-decoded when it parses as JSON, else kept as text.
 */
export async function* parseSse(
  chunks: AsyncIterable<Buffer | Uint8Array | string>,
): AsyncGenerator<StreamEvent> {
  let event: string | undefined;
  let data: string[] = [];
  let id: string | undefined;
  let size = 0;
  const dispatch = (): StreamEvent | undefined => {
    const out =
      data.length === 0
        ? undefined
        : { event, data: decodeData(data.join("\n")), ...(id === undefined ? {} : { id }) };
    event = undefined;
    data = [];
    size = 0;
    return out;
  };
  let first = true;
  for await (let line of lines(chunks, true)) {
    if (first) {
      line = line.replace(/^\uFEFF/, "");
      first = false;
    }
    if (line === "") {
      const out = dispatch();
      if (out !== undefined) yield out;
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") {
      size += value.length;
      if (size > MAX_STREAM_RECORD_BYTES)
        throw new StreamFormatError(`a streamed event passed ${MAX_STREAM_RECORD_BYTES} bytes`);
      data.push(value);
    } else if (field === "id" && !value.includes("\0")) id = value;
  }
  // A final event without its blank line is incomplete and, per the format, dropped.
}

function decodeData(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Picks the parser from the response's content type. */
export function parseEventStream(
  contentType: string | undefined,
  chunks: AsyncIterable<Buffer | Uint8Array | string>,
): AsyncGenerator<StreamEvent> {
  const type = (contentType ?? "").split(";")[0]?.trim().toLowerCase();
  if (type === "text/event-stream") return parseSse(chunks);
  if (
    type === "application/x-ndjson" ||
    type === "application/ndjson" ||
    type === "application/jsonl" ||
    type === "application/jsonlines"
  ) {
    return parseNdjson(chunks);
  }
  throw new StreamFormatError(
    `the daemon answered a streamed call with content type ${JSON.stringify(contentType ?? "")}, not NDJSON or SSE`,
  );
}
