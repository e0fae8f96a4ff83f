/** The frame codec and header validation, fed split, merged, oversize and hostile input. */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, it } from "node:test";
import {
  encodeFrame,
  FRAME_MAGIC,
  FRAME_PREFIX_BYTES,
  type Frame,
  FrameDecoder,
  type FrameError,
  MAX_FRAME_BYTES,
  MAX_HEADER_BYTES,
  opValidators,
  parseGuestMessage,
  parseHostMessage,
} from "../../src/agent/protocol/index.js";
import { ForkdError } from "../../src/common/errors.js";

function collect() {
  const frames: Frame[] = [];
  const errors: FrameError[] = [];
  const decoder = new FrameDecoder({ onFrame: (f) => frames.push(f), onError: (e) => errors.push(e) });
  return { decoder, frames, errors };
}

function prefix(frameLength: number, headerLength: number): Buffer {
  const p = Buffer.alloc(FRAME_PREFIX_BYTES);
  FRAME_MAGIC.copy(p, 0);
  p.writeUInt32BE(frameLength, 4);
  p.writeUInt32BE(headerLength, 8);
  return p;
}

describe("frame codec", () => {
  it("round-trips headers and binary bodies", () => {
    const { decoder, frames, errors } = collect();
    const body = randomBytes(70_000);
    decoder.push(encodeFrame({ t: "req", id: 1, op: "ping", args: {} }));
    decoder.push(encodeFrame({ t: "in", id: 7, text: "ünïcødé ✓" }, body));
    assert.equal(errors.length, 0);
    assert.equal(frames.length, 2);
    assert.deepEqual(frames[0]?.header, { t: "req", id: 1, op: "ping", args: {} });
    assert.equal(frames[0]?.body.length, 0);
    assert.equal(frames[1]?.header.text, "ünïcødé ✓");
    assert.ok(frames[1]?.body.equals(body));
  });

  it("decodes the same frames whether fed byte by byte, in random splits or all merged", () => {
    const stream = Buffer.concat(
      Array.from({ length: 20 }, (_, i) =>
        encodeFrame({ t: "evt", id: i + 1, ev: "stdout" }, randomBytes(i * 97)),
      ),
    );
    const reference = collect();
    reference.decoder.push(stream);
    assert.equal(reference.frames.length, 20);

    const bytewise = collect();
    for (let i = 0; i < stream.length; i++) bytewise.decoder.push(stream.subarray(i, i + 1));
    const random = collect();
    for (let at = 0; at < stream.length; ) {
      const n = 1 + Math.floor(Math.random() * 300);
      random.decoder.push(stream.subarray(at, at + n));
      at += n;
    }
    for (const run of [bytewise, random]) {
      assert.equal(run.errors.length, 0);
      assert.equal(run.frames.length, 20);
      run.frames.forEach((f, i) => {
        assert.deepEqual(f.header, reference.frames[i]?.header);
        assert.ok(f.body.equals(reference.frames[i]?.body as Buffer));
      });
    }
    assert.equal(random.decoder.bufferedBytes, 0);
  });

  it("refuses to encode oversize headers and frames", () => {
    assert.throws(
      () => encodeFrame({ t: "req", pad: "x".repeat(MAX_HEADER_BYTES) }),
      (e: unknown) => e instanceof ForkdError && e.code === "payload_too_large" && /header/.test(e.message),
    );
    assert.throws(
      () => encodeFrame({ t: "req" }, Buffer.alloc(MAX_FRAME_BYTES)),
      (e: unknown) => e instanceof ForkdError && e.code === "payload_too_large",
    );
  });

  it("rejects an oversize frame without buffering it, then resynchronises", () => {
    const { decoder, frames, errors } = collect();
    decoder.push(prefix(MAX_FRAME_BYTES, 10));
    assert.equal(errors.length, 1);
    assert.equal(errors[0]?.reason, "frame_too_large");
    assert.ok(decoder.bufferedBytes < FRAME_PREFIX_BYTES);
    decoder.push(encodeFrame({ t: "cancel", id: 3 }));
    assert.equal(frames.length, 1);
    assert.equal(frames[0]?.header.t, "cancel");
  });

  it("rejects an oversize header length", () => {
    const { decoder, errors } = collect();
    decoder.push(prefix(MAX_HEADER_BYTES + 100, MAX_HEADER_BYTES + 1));
    assert.equal(errors[0]?.reason, "header_too_large");
  });

  it("reports one error for a stretch of garbage and recovers at the next frame", () => {
    const { decoder, frames, errors } = collect();
    decoder.push(Buffer.from("this is not a frame at all, just noise\n".repeat(50)));
    decoder.push(Buffer.from(randomBytes(4096).map((b) => (b === 0xfd ? 0 : b))));
    decoder.push(encodeFrame({ t: "req", id: 9, op: "ping" }));
    assert.equal(errors.length, 1);
    assert.equal(errors[0]?.reason, "bad_magic");
    assert.equal(frames.length, 1);
    assert.equal(frames[0]?.header.id, 9);
  });

  it("recovers when a frame's tail was cut off (stale bytes after a reconnect)", () => {
    const { decoder, frames, errors } = collect();
    const cut = encodeFrame({ t: "evt", id: 1, ev: "stdout" }, Buffer.alloc(1000, 0x41));
    decoder.push(cut.subarray(500));
    decoder.push(encodeFrame({ t: "hello", x: 1 }));
    assert.equal(errors.length, 1);
    assert.deepEqual(
      frames.map((f) => f.header.t),
      ["hello"],
    );
  });

  it("rejects headers that are not UTF-8 JSON objects with a string t", () => {
    const cases: [Buffer, string][] = [
      [Buffer.from("{not json"), "bad_header"],
      [Buffer.from([0x7b, 0xc3, 0x28, 0x7d]), "bad_header"],
      [Buffer.from("[1,2,3]"), "header_not_object"],
      [Buffer.from('{"t":5}'), "header_not_object"],
      [Buffer.from("null"), "header_not_object"],
      [Buffer.from("[".repeat(60_000)), "bad_header"],
    ];
    for (const [header, reason] of cases) {
      const { decoder, frames, errors } = collect();
      decoder.push(Buffer.concat([prefix(header.length, header.length), header]));
      decoder.push(encodeFrame({ t: "ok" }));
      assert.equal(errors[0]?.reason, reason, `header ${header.subarray(0, 20).toString()}`);
      assert.deepEqual(
        frames.map((f) => f.header.t),
        ["ok"],
      );
    }
  });

  it("rejects a header length larger than the frame", () => {
    const { decoder, errors } = collect();
    decoder.push(Buffer.concat([prefix(4, 10), Buffer.from("{}{}")]));
    assert.equal(errors[0]?.reason, "bad_header_length");
  });
});

describe("header validation", () => {
  const frame = (header: Record<string, unknown>): Frame => ({
    header: header as Frame["header"],
    body: Buffer.alloc(0),
  });

  it("accepts well-formed host and guest headers", () => {
    assert.equal(parseHostMessage(frame({ t: "req", id: 1, op: "ping", args: {} })).t, "req");
    assert.equal(parseHostMessage(frame({ t: "in", id: 2, eof: true })).t, "in");
    assert.equal(
      parseGuestMessage(frame({ t: "res", id: 2, ok: false, error: { code: "x", message: "y" } })).t,
      "res",
    );
  });

  it("names the bad field", () => {
    assert.throws(
      () => parseHostMessage(frame({ t: "req", id: 0, op: "ping" })),
      (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument" && /\/id/.test(e.message),
    );
    assert.throws(() => parseHostMessage(frame({ t: "req", id: 2 ** 31, op: "ping" })), /\/id/);
    assert.throws(() => parseHostMessage(frame({ t: "hello" })), /unknown host message kind "hello"/);
    assert.throws(() => parseGuestMessage(frame({ t: "__proto__" })), /unknown guest message kind/);
    assert.throws(() => parseGuestMessage(frame({ t: "evt", id: 1, ev: "exit" })), /\/ev/);
  });

  it("rejects unknown op arguments and paths that are not absolute", () => {
    assert.throws(() =>
      opValidators.exec.args.assert({ argv: ["ls"], stdin: "none", timeout_ms: 1, shell: true }, "exec"),
    );
    assert.throws(
      () => opValidators["file.read"].args.assert({ path: "etc/passwd", max_bytes: 1 }, "x"),
      /\/path/,
    );
    assert.throws(
      () => opValidators.exec.args.assert({ argv: ["a\0b"], stdin: "none", timeout_ms: 1 }, "x"),
      /argv/,
    );
    assert.doesNotThrow(() =>
      opValidators.exec.args.assert({ argv: ["ls"], stdin: "none", timeout_ms: 1 }, "x"),
    );
  });
});
