/** NDJSON and SSE parsing: records split at every byte, CRLF and CR line ends, UTF-8 across chunks, limits. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MAX_STREAM_RECORD_BYTES } from "../../src/common/limits.js";
import {
  parseEventStream,
  parseNdjson,
  parseSse,
  type StreamEvent,
  StreamFormatError,
} from "../../src/sdk/event-stream.js";

async function collect(events: AsyncIterable<StreamEvent>): Promise<StreamEvent[]> {
  const out: StreamEvent[] = [];
  for await (const event of events) out.push(event);
  return out;
}

async function* chunksOf(bytes: Buffer, sizes: number[]): AsyncGenerator<Buffer> {
  let offset = 0;
  let i = 0;
  while (offset < bytes.length) {
    const size = sizes[i++ % sizes.length] as number;
    yield bytes.subarray(offset, offset + size);
    offset += size;
  }
}

const NDJSON = Buffer.from(
  '{"type":"stdout","data":"héllo ✓"}\n\n{"type":"stderr","data":"x"}\r\n{"type":"exit","exit_code":3}\n',
);
const NDJSON_EXPECTED: StreamEvent[] = [
  { event: "stdout", data: { type: "stdout", data: "héllo ✓" } },
  { event: "stderr", data: { type: "stderr", data: "x" } },
  { event: "exit", data: { type: "exit", exit_code: 3 } },
];

const SSE = Buffer.from(
  '\uFEFF: comment\nretry: 10\nevent: stdout\ndata: {"data":"a"}\n\n' +
    "event: stderr\r\ndata: line one\r\ndata: line two\r\nid: 7\r\n\r\n" +
    'event: exit\rdata: {"exit_code":0}\r\r' +
    'data: {"orphan": true}\n',
);
const SSE_EXPECTED: StreamEvent[] = [
  { event: "stdout", data: { data: "a" } },
  { event: "stderr", data: "line one\nline two", id: "7" },
  // The last event id carries over to later events, as in the WHATWG format.
  { event: "exit", data: { exit_code: 0 }, id: "7" },
];

describe("NDJSON", () => {
  it("parses the same records whatever the chunking (every byte, odd sizes, all at once)", async () => {
    for (const sizes of [[1], [2, 3, 5], [7], [NDJSON.length]]) {
      assert.deepEqual(
        await collect(parseNdjson(chunksOf(NDJSON, sizes))),
        NDJSON_EXPECTED,
        `chunks of ${sizes}`,
      );
    }
  });

  it("accepts a last record without a trailing newline", async () => {
    assert.deepEqual(await collect(parseNdjson(chunksOf(Buffer.from('{"type":"exit"}'), [4]))), [
      { event: "exit", data: { type: "exit" } },
    ]);
  });

  it("rejects a line that is not JSON, quoting it", async () => {
    await assert.rejects(collect(parseNdjson(chunksOf(Buffer.from("{oops}\n"), [3]))), (err: unknown) => {
      assert.ok(err instanceof StreamFormatError);
      assert.match(err.message, /not JSON: "\{oops\}"/);
      return true;
    });
  });

  it("refuses a record longer than the limit instead of buffering without end", async () => {
    async function* endless(): AsyncGenerator<Buffer> {
      const block = Buffer.alloc(1024 * 1024, 0x61);
      for (let sent = 0; sent <= MAX_STREAM_RECORD_BYTES + block.length; sent += block.length) yield block;
      assert.fail("the parser kept reading past its limit");
    }
    await assert.rejects(collect(parseNdjson(endless())), StreamFormatError);
  });
});

describe("Server-Sent Events", () => {
  it("parses events, multi-line data, ids, comments and all three line ends, whatever the chunking", async () => {
    for (const sizes of [[1], [2, 3, 5], [SSE.length]]) {
      assert.deepEqual(await collect(parseSse(chunksOf(SSE, sizes))), SSE_EXPECTED, `chunks of ${sizes}`);
    }
  });

  it("keeps a UTF-8 character split across chunks intact", async () => {
    const bytes = Buffer.from("event: stdout\ndata: ✓✓\n\n");
    const events = await collect(parseSse(chunksOf(bytes, [1])));
    assert.deepEqual(events, [{ event: "stdout", data: "✓✓" }]);
  });
});

describe("content type selection", () => {
  it("picks the parser from the content type and refuses anything else", async () => {
    assert.deepEqual(
      await collect(parseEventStream("application/x-ndjson; charset=utf-8", chunksOf(NDJSON, [9]))),
      NDJSON_EXPECTED,
    );
    assert.deepEqual(await collect(parseEventStream("text/event-stream", chunksOf(SSE, [9]))), SSE_EXPECTED);
    assert.throws(() => parseEventStream("application/json", chunksOf(NDJSON, [9])), /not NDJSON or SSE/);
  });
});
