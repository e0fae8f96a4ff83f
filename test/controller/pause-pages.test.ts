/**
 * The page bookkeeping of a pause, without VMs: packing the kept pages in place (runs moved with overlapping
 * copies) and which captured pages a merged layer keeps.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { keptForMerge } from "../../src/controller/sandboxes/pause-layer.js";
import { packInPlace } from "../../src/controller/snapshots/chain-ram.js";
import { PAGE_SIZE } from "../../src/store/memory-layer.js";

/** Pages numbered `pages`, page i filled with byte (i + 1). */
function capture(pages: number[]) {
  const data = Buffer.alloc(pages.length * PAGE_SIZE);
  pages.forEach((_, i) => {
    data.fill(i + 1, i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
  });
  return { pages: Uint32Array.from(pages), data };
}

describe("pause page bookkeeping", () => {
  it("packs the kept pages at the start of the same buffer, content intact", () => {
    const captured = capture([3, 4, 5, 9, 10, 20, 21, 22]);
    const buffer = captured.data.buffer;
    const packed = packInPlace(captured, Uint32Array.from([1, 2, 4, 6, 7]));
    assert.deepEqual([...packed.pages], [4, 5, 10, 21, 22]);
    assert.equal(packed.data.length, 5 * PAGE_SIZE);
    assert.equal(packed.data.buffer, buffer, "nothing was allocated for the data");
    // Each kept page still holds what it held (its original index + 1), in order.
    assert.deepEqual(
      [0, 1, 2, 3, 4].map((k) => [packed.data[k * PAGE_SIZE], packed.data[(k + 1) * PAGE_SIZE - 1]]),
      [2, 3, 5, 7, 8].map((b) => [b, b]),
    );
  });

  it("keeps everything or nothing without copying", () => {
    const all = capture([1, 2, 3]);
    assert.equal(packInPlace(all, Uint32Array.from([0, 1, 2])).data, all.data);
    assert.equal(packInPlace(capture([1, 2]), new Uint32Array(0)).data.length, 0);
  });

  it("a merged layer keeps the changed pages and those its own layers hold", () => {
    const pages = Uint32Array.from([2, 5, 7, 8, 11, 40]);
    // Changed against the parent: indices 0 (page 2) and 4 (page 11); the own layers hold pages 7, 11 and 50.
    const keep = keptForMerge(pages, Uint32Array.from([0, 4]), Uint32Array.from([7, 11, 50]));
    assert.deepEqual([...keep], [0, 2, 4]);
    assert.deepEqual([...keptForMerge(pages, new Uint32Array(0), new Uint32Array(0))], []);
  });
});
