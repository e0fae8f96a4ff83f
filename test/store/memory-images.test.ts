/**
 * Assembled RAM images (no VM: a synthetic chain, chains-synthetic.ts): made once and shared, re-made when one was
 * changed behind forkd's back, and never made in a directory someone else owns.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { chmod, chown, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { after, before, describe, it } from "node:test";
import { memoryImageOptions } from "../../src/controller/machines/restore-plan.js";
import { resolveChain } from "../../src/store/chain.js";
import { flatImageFor } from "../../src/store/memory-images.js";
import { SnapshotStore, type StoredSnapshot } from "../../src/store/snapshot-store.js";
import { syntheticChain } from "../controller/chains-synthetic.js";
import { tempHome } from "../support/host.js";

const sha256 = async (file: string) =>
  createHash("sha256")
    .update(await readFile(file))
    .digest("hex");

describe("assembled RAM images", { timeout: 10 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let chain: StoredSnapshot[];

  before(async () => {
    home = await tempHome("forkd-images-");
    await syntheticChain(home, 2);
    chain = await resolveChain(new SnapshotStore(home.snapshots), "t2");
  });
  after(() => home.cleanup());

  it("reuses an intact image and makes again one that was changed behind forkd's back", async () => {
    for (const inMemory of [false, true]) {
      const options = memoryImageOptions(home, inMemory);
      const image = await flatImageFor(chain, options);
      const digest = await sha256(image);
      assert.equal(await flatImageFor(chain, options), image, "the same file for every child");
      await chmod(image, 0o644);
      const bytes = await readFile(image);
      bytes[4096 * 100] = (bytes[4096 * 100] as number) ^ 0xff;
      await writeFile(image, bytes);
      assert.notEqual(await sha256(image), digest);
      assert.equal(await flatImageFor(chain, options), image);
      assert.equal(await sha256(image), digest, inMemory ? "tmpfs image re-made" : "disk image re-made");
    }
  });

  it("refuses to put images in a tmpfs directory another user created", async () => {
    const options = memoryImageOptions(home, true);
    await rm(options.tmpfsDir, { recursive: true, force: true });
    await mkdir(options.tmpfsDir, { mode: 0o700 });
    await chown(options.tmpfsDir, 65534, 65534);
    await assert.rejects(flatImageFor(chain, options), /owned by uid 65534/);
    await rm(options.tmpfsDir, { recursive: true, force: true });
  });
});
