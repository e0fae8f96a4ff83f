/** Newline-delimited JSON in from a byte stream, with a bound on one line so a client cannot make us buffer forever. */
import { ForkdError } from "../common/errors.js";

/** Yields each non-empty line's parsed JSON value. Throws invalid_argument on a line over `maxLineBytes` or bad JSON. */
export async function* readNdjson(
  source: AsyncIterable<Buffer | string>,
  maxLineBytes: number,
): AsyncGenerator<unknown, void, undefined> {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  let lineNumber = 0;
  const parse = (line: Buffer) => {
    lineNumber++;
    const text = line.toString("utf8").trim();
    if (text === "") return undefined;
    try {
      return { value: JSON.parse(text) as unknown };
    } catch (err) {
      throw new ForkdError(
        "invalid_argument",
        `NDJSON line ${lineNumber}: malformed JSON: ${(err as Error).message}`,
      );
    }
  };
  for await (const piece of source) {
    let chunk = typeof piece === "string" ? Buffer.from(piece) : piece;
    for (let newline = chunk.indexOf(0x0a); newline !== -1; newline = chunk.indexOf(0x0a)) {
      const head = chunk.subarray(0, newline);
      if (pendingBytes + head.length > maxLineBytes) throw lineTooLong(lineNumber + 1, maxLineBytes);
      const line = pending.length === 0 ? head : Buffer.concat([...pending, head]);
      pending = [];
      pendingBytes = 0;
      chunk = chunk.subarray(newline + 1);
      const parsed = parse(line);
      if (parsed) yield parsed.value;
    }
    if (chunk.length > 0) {
      pendingBytes += chunk.length;
      if (pendingBytes > maxLineBytes) throw lineTooLong(lineNumber + 1, maxLineBytes);
      pending.push(chunk);
    }
  }
  if (pending.length > 0) {
    const parsed = parse(Buffer.concat(pending));
    if (parsed) yield parsed.value;
  }
}

function lineTooLong(line: number, max: number): ForkdError {
  return new ForkdError("payload_too_large", `NDJSON line ${line} is longer than ${max} bytes`);
}

export function ndjsonLine(value: unknown): string {
  return `${JSON.stringify(value)}\n`;
}
