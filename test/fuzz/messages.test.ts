/**
 * Property-based: the protocol's header and result validators on arbitrary JSON, on both sides. A validator
 * either accepts a value (which then has the declared shape) or throws the catalogue's invalid_argument naming the
 * field; nothing else ever escapes, whatever the input.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import {
  type Frame,
  OPS,
  opValidators,
  parseGuestMessage,
  parseHostMessage,
} from "../../src/agent/protocol/index.js";
import { ForkdError } from "../../src/common/errors.js";

const RUNS = Number(process.env.FORKD_FUZZ_RUNS ?? 500);
const KINDS = ["hello", "req", "res", "evt", "in", "cancel", "bogus", ""];

/** Headers close to real ones (right kind, ids near the bounds, plausible fields) and plain noise. */
const header = fc.oneof(
  fc.record(
    {
      t: fc.constantFrom(...KINDS),
      id: fc.oneof(fc.integer({ min: -5, max: 2 ** 31 + 5 }), fc.double(), fc.string()),
      op: fc.oneof(fc.constantFrom(...Object.keys(OPS)), fc.string()),
      args: fc.jsonValue({ maxDepth: 3 }),
      ok: fc.boolean(),
      result: fc.jsonValue({ maxDepth: 3 }),
      error: fc.oneof(fc.record({ code: fc.string(), message: fc.string() }), fc.jsonValue()),
      ev: fc.constantFrom("stdout", "stderr", "stdin_ack", "pty", "started", "fs", "x"),
      bytes: fc.oneof(fc.nat(), fc.integer(), fc.string()),
      pid: fc.oneof(fc.integer(), fc.string()),
      protocol: fc.integer(),
      eof: fc.jsonValue(),
    },
    { requiredKeys: ["t"] },
  ),
  fc.dictionary(fc.string(), fc.jsonValue({ maxDepth: 2 })).map((d) => ({ t: "res", ...d })),
);

function only(fn: () => unknown): void {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ForkdError, `not a ForkdError: ${String(err)}`);
    assert.equal(err.code, "invalid_argument", err.message);
    assert.ok(err.message.length > 0 && err.message.length < 10_000);
  }
}

describe("protocol validators on arbitrary JSON", () => {
  it("host and guest message parsers accept or refuse with invalid_argument, nothing else", () => {
    fc.assert(
      fc.property(header, (h) => {
        const frame = { header: h, body: Buffer.alloc(0) } as unknown as Frame;
        only(() => parseGuestMessage(frame));
        only(() => parseHostMessage(frame));
      }),
      { numRuns: RUNS },
    );
  });

  it("every op's argument and result validators accept or refuse with invalid_argument", () => {
    const ops = Object.keys(OPS) as (keyof typeof OPS)[];
    fc.assert(
      fc.property(fc.constantFrom(...ops), fc.jsonValue({ maxDepth: 4 }), (op, value) => {
        only(() => opValidators[op].args.assert(value, `${op} arguments`));
        only(() => opValidators[op].result.assert(value, `${op} result`));
        assert.equal(typeof opValidators[op].result.check(value), "boolean");
      }),
      { numRuns: RUNS },
    );
  });
});
