import assert from "node:assert/strict";
import { mkdtemp, open, readFile, rm, stat, truncate, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import {
  applyMemoryLayer,
  PAGE_SIZE,
  readLayerIndex,
  writeMemoryLayer,
} from "../../src/store/memory-layer.js";

const RAM = 64 * PAGE_SIZE;

function page(fill: number): Buffer {
  return Buffer.alloc(PAGE_SIZE, fill);
}

describe("memory layers", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-layer-"));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("stores only the changed pages and applies them at their offsets", async () => {
    const layer = path.join(dir, "a.layer");
    const pages = Uint32Array.from([1, 2, 3, 40]);
    const bytes = await writeMemoryLayer(
      layer,
      RAM,
      pages,
      Buffer.concat([page(1), page(2), page(3), page(4)]),
    );
    assert.equal(bytes, 24 + 4 * 4 + 4 * PAGE_SIZE, "header + index + pages, nothing else");
    assert.equal((await stat(layer)).size, bytes);
    const image = path.join(dir, "ram.bin");
    await writeFile(image, Buffer.alloc(RAM, 0xee));
    await applyMemoryLayer(layer, image);
    const ram = await readFile(image);
    for (const [n, fill] of [
      [0, 0xee],
      [1, 1],
      [2, 2],
      [3, 3],
      [4, 0xee],
      [40, 4],
      [63, 0xee],
    ] as const) {
      assert.equal(ram[n * PAGE_SIZE], fill, `page ${n}`);
      assert.equal(ram[n * PAGE_SIZE + PAGE_SIZE - 1], fill, `end of page ${n}`);
    }
  });

  it("refuses layers for another RAM size, and hostile files", async () => {
    const layer = path.join(dir, "b.layer");
    await writeMemoryLayer(layer, RAM, Uint32Array.from([5]), page(9));
    const small = path.join(dir, "small.bin");
    await writeFile(small, Buffer.alloc(RAM / 2));
    await assert.rejects(applyMemoryLayer(layer, small), /layer is for/);

    const isUnprocessable = (err: unknown) => err instanceof ForkdError && err.code === "unprocessable";
    const garbage = path.join(dir, "garbage.layer");
    await writeFile(garbage, "not a layer at all, just text");
    await assert.rejects(readLayerIndex(garbage), isUnprocessable);

    const truncated = path.join(dir, "truncated.layer");
    await writeMemoryLayer(truncated, RAM, Uint32Array.from([1, 2]), Buffer.concat([page(1), page(2)]));
    await truncate(truncated, 24 + 8 + PAGE_SIZE);
    await assert.rejects(readLayerIndex(truncated), isUnprocessable);

    const outOfRange = path.join(dir, "range.layer");
    await writeMemoryLayer(outOfRange, RAM, Uint32Array.from([3]), page(1));
    const handle = await open(outOfRange, "r+");
    const bad = Buffer.alloc(4);
    bad.writeUInt32LE(RAM / PAGE_SIZE + 7);
    await handle.write(bad, 0, 4, 24);
    await handle.close();
    await assert.rejects(readLayerIndex(outOfRange), isUnprocessable);

    await assert.rejects(
      writeMemoryLayer(
        path.join(dir, "unsorted.layer"),
        RAM,
        Uint32Array.from([3, 2]),
        Buffer.concat([page(1), page(2)]),
      ),
      /strictly increasing/,
    );
  });
});
