/**
 * Packs through the daemon with the TypeScript SDK, on a real daemon with real VMs: packSnapshot downloads a chain
 * (here without its image, which the same host has), unpackSnapshot installs it under a new tag, and a child of the
 * installed copy runs. A pack that is not one is refused without installing anything; an existing output file is
 * never overwritten.
 */
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { InvalidArgumentError, NotFoundError } from "../../src/sdk/index.js";
import { startDaemon, type TestDaemon } from "./daemon-fixture.js";

describe("packs through the daemon (TypeScript SDK, real VMs)", { timeout: 15 * 60_000 }, () => {
  let daemon: TestDaemon;
  let dir: string;

  before(async () => {
    daemon = await startDaemon();
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-packs-api-"));
  });
  after(async () => {
    await daemon?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it("packs, unpacks under a new tag, and the copy spawns", async () => {
    const c = daemon.controller;
    const out = path.join(dir, "pyagent.tar.zst");
    const packed = await c.packSnapshot(daemon.tag, { out, withoutImage: true });
    assert.deepEqual(packed.chain, [daemon.tag]);
    assert.equal((await stat(out)).size, packed.bytes);
    await assert.rejects(
      c.packSnapshot(daemon.tag, { out }),
      InvalidArgumentError,
      "an existing file is kept",
    );
    await assert.rejects(c.packSnapshot("no-such-tag", { out: path.join(dir, "x") }), NotFoundError);
    await assert.rejects(stat(path.join(dir, "x")), "a failed download leaves no file");

    const installed = await c.unpackSnapshot(out, { tag: "moved" });
    assert.deepEqual([installed.head, installed.installed, installed.image], ["moved", ["moved"], "present"]);
    const [child] = await c.spawnSandboxes({ snapshotTag: "moved", n: 1 });
    assert.equal((await c.evalCode(child?.id as string, "int(numpy.arange(4).sum())")).result, "6");
    await c.killSandbox(child?.id as string);

    const garbage = path.join(dir, "garbage.tar.zst");
    await writeFile(garbage, "this is not a pack\n".repeat(100));
    const before = (await c.listSnapshots()).map((s) => s.tag).sort();
    await assert.rejects(c.unpackSnapshot(garbage, { tag: "evil" }), (err: Error) => {
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.match(err.message, /could not decompress the pack/);
      return true;
    });
    assert.deepEqual((await c.listSnapshots()).map((s) => s.tag).sort(), before, "nothing installed");
    await c.deleteSnapshot("moved");
    const left = await readdir(path.join(daemon.home, "transfers")).catch(() => []);
    assert.deepEqual(left, [], "no pack left in transit");
  });
});
