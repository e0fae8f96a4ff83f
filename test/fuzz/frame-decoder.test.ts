/**
 * Property-based: the agent protocol's frame decoder (both ends use it) against hostile byte streams. Valid frames
 * separated by garbage and cut into arbitrary chunks all come out, in order; any byte stream at all is consumed
 * without an exception and with bounded memory.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  encodeFrame,
  type Frame,
  FrameDecoder,
  FrameError,
  MAX_FRAME_BYTES,
} from "../../src/agent/protocol/index.js";

const RUNS = Number(process.env.FORKD_FUZZ_RUNS ?? 300);

/** Cuts `bytes` at the given (sorted, deduplicated) offsets. */
function cut(bytes: Buffer, cuts: number[]): Buffer[] {
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let at = 0;
  for (const p of points) {
    out.push(bytes.subarray(at, p));
    at = p;
  }
  out.push(bytes.subarray(at));
  return out;
}

const header = fc.record({
  t: fc.string({ minLength: 1, maxLength: 8 }),
  id: fc.integer({ min: 1, max: 2 ** 31 - 1 }),
  extra: fc.option(fc.jsonValue({ maxDepth: 2 }), { nil: undefined }),
});
const body = fc.uint8Array({ maxLength: 2048 }).map((a) => Buffer.from(a));
/** Garbage that cannot contain the magic (no 0xFD byte): every frame after it must still be found. */
const garbage = fc
  .uint8Array({ minLength: 1, maxLength: 300 })
  .map((a) => Buffer.from(a.filter((b) => b !== 0xfd)));
const segment = fc.oneof(
  fc.record({ kind: fc.constant("frame" as const), header, body }),
  fc.record({ kind: fc.constant("garbage" as const), bytes: garbage }),
);

describe("frame decoder under hostile streams", () => {
  it("recovers every frame between stretches of garbage, whatever the chunking", () => {
    fc.assert(
      fc.property(
        fc.array(segment, { maxLength: 12 }),
        fc.array(fc.nat(), { maxLength: 40 }),
        (segments, cuts) => {
          const expected: { header: object; body: Buffer }[] = [];
          const parts: Buffer[] = [];
          let garbageRuns = 0;
          let previousGarbage = false;
          for (const s of segments) {
            if (s.kind === "frame") {
              const h = s.header.extra === undefined ? { t: s.header.t, id: s.header.id } : { ...s.header };
              expected.push({ header: JSON.parse(JSON.stringify(h)), body: s.body });
              parts.push(encodeFrame(h, s.body));
              previousGarbage = false;
            } else if (s.bytes.length > 0) {
              parts.push(s.bytes);
              if (!previousGarbage) garbageRuns++;
              previousGarbage = true;
            }
          }
          const got: Frame[] = [];
          const errors: FrameError[] = [];
          const decoder = new FrameDecoder({ onFrame: (f) => got.push(f), onError: (e) => errors.push(e) });
          for (const chunk of cut(Buffer.concat(parts), cuts)) decoder.push(chunk);
          assert.equal(got.length, expected.length);
          got.forEach((f, i) => {
            assert.deepEqual(f.header, expected[i]?.header);
            assert.ok(f.body.equals(expected[i]?.body as Buffer));
          });
          // One report per stretch of garbage at most (a short tail may still be waiting for more bytes).
          assert.ok(errors.length <= garbageRuns, `${errors.length} errors for ${garbageRuns} garbage runs`);
          for (const e of errors) assert.ok(e instanceof FrameError);
        },
      ),
      { numRuns: RUNS },
    );
  });

  it("consumes any byte stream without throwing and keeps what it buffers bounded", () => {
    // Bytes biased towards the magic's, so prefixes, lengths and headers get exercised, not only resync.
    const byte = fc.oneof(
      fc.constantFrom(0xfd, 0x46, 0x4b, 0x44, 0x00, 0x7b, 0x22),
      fc.integer({ min: 0, max: 255 }),
    );
    fc.assert(
      fc.property(fc.array(fc.array(byte, { maxLength: 4096 }), { maxLength: 20 }), (chunks) => {
        const decoder = new FrameDecoder({ onFrame: () => {}, onError: () => {} });
        for (const c of chunks) {
          decoder.push(Buffer.from(c));
          assert.ok(decoder.bufferedBytes <= MAX_FRAME_BYTES + c.length);
        }
      }),
      { numRuns: RUNS },
    );
  });

  it("never buffers for a frame whose declared length exceeds the limit", () => {
    fc.assert(
      fc.property(fc.integer({ min: MAX_FRAME_BYTES, max: 2 ** 32 - 1 }), (length) => {
        const prefix = Buffer.alloc(12);
        Buffer.from([0xfd, 0x46, 0x4b, 0x44]).copy(prefix);
        prefix.writeUInt32BE(length, 4);
        prefix.writeUInt32BE(10, 8);
        const errors: FrameError[] = [];
        const decoder = new FrameDecoder({
          onFrame: () => assert.fail("no frame"),
          onError: (e) => errors.push(e),
        });
        decoder.push(Buffer.concat([prefix, Buffer.alloc(1000, 0x41)]));
        assert.equal(errors[0]?.reason, "frame_too_large");
        assert.ok(decoder.bufferedBytes < 16);
      }),
      { numRuns: RUNS },
    );
  });
});
