/**
 * Packs on real VMs: a chain (base -> p1 -> p2, real diff BRANCHes of a sandbox with state) packed in one
 * FORKD_HOME is unpacked into another home with another path and another image cache, and spawns there with the
 * state intact. Hostile and damaged packs are covered without VMs in packs-hostile.test.ts.
 */
import assert from "node:assert/strict";
import { mkdtemp, open, readFile, rm, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { cacheDirs } from "../../src/controller/machines/restore-plan.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { packSnapshot } from "../../src/controller/snapshots/pack.js";
import { unpackSnapshot } from "../../src/controller/snapshots/unpack.js";
import { resolveChain } from "../../src/store/chain.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { FileVerifier } from "../../src/store/verify.js";
import { entries, qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

type Home = Awaited<ReturnType<typeof tempHome>>;

const STATE_PROBE = "(STEP, NOTES)";

describe("packs on real VMs", { timeout: 40 * 60_000 }, () => {
  let homeA: Home;
  let homeB: Home;
  let imagesB: string;
  let base: string;
  let pack: string;

  before(async () => {
    homeA = await tempHome("forkd-pack-a-");
    homeB = await tempHome("forkd-pack-b-");
    imagesB = await mkdtemp(path.join(os.tmpdir(), "forkd-pack-images-"));
    base = await linkSharedSnapshot(homeA.home, "pyagent");
    const services = await openServices(homeA);
    try {
      const [source] = await services.sandboxes.spawn({ snapshotTag: base, n: 1, timeoutMs: 0 });
      const id = (source as { id: string }).id;
      await services.sandboxes.eval(id, "STEP = 1\nNOTES = ['first']");
      await services.sandboxes.files.write(id, "/root/notes.txt", Buffer.from("first\n"));
      await services.sandboxes.branch(id, { tag: "p1", mode: "diff" });
      await services.sandboxes.eval(id, "STEP = 2\nNOTES.append('second')");
      await services.sandboxes.exec(id, ["sh", "-c", "echo second >> /root/notes.txt"]);
      await services.sandboxes.branch(id, { tag: "p2", mode: "diff" });
    } finally {
      await services.close({ killSandboxes: true });
    }
    pack = path.join(homeA.home, "p2.tar.zst");
  });
  after(async () => {
    assert.deepEqual(await qemusMentioning(homeA.home), [], "no QEMU left running in A");
    assert.deepEqual(await qemusMentioning(homeB.home), [], "no QEMU left running in B");
    await homeA.cleanup();
    await homeB.cleanup();
    await rm(imagesB, { recursive: true, force: true });
  });

  it("a chain packed in one home spawns in another home with another image cache", async (t) => {
    const packed = await packSnapshot(homeA, { tag: "p2", out: pack });
    assert.deepEqual([packed.chain, packed.image_included], [[base, "p1", "p2"], true]);
    assert.equal((await stat(pack)).size, packed.pack_bytes);
    t.diagnostic(
      `pack: ${(packed.content_bytes / 2 ** 20).toFixed(0)} MiB of files -> ${(packed.pack_bytes / 2 ** 20).toFixed(1)} MiB in ${packed.ms} ms`,
    );

    const pathsB = { ...homeB, images: imagesB };
    const unpacked = await unpackSnapshot(pathsB, { file: pack });
    t.diagnostic(`unpack (image installed): ${unpacked.ms} ms`);
    assert.deepEqual(
      [unpacked.head, unpacked.installed, unpacked.reused, unpacked.image],
      ["p2", [base, "p1", "p2"], [], "installed"],
    );
    assert.deepEqual((await entries(homeB.snapshots)).sort(), [base, "p1", "p2"].sort(), "no leftovers");
    const store = new SnapshotStore(homeB.snapshots);
    const chain = await resolveChain(store, "p2");
    for (const layer of chain) {
      assert.ok(
        layer.manifest.image.rootfs.startsWith(`${imagesB}/`),
        "manifests point at this host's image",
      );
    }
    // Verified while unpacking and recorded: the first spawn does not hash the files again.
    const verifier = new FileVerifier(cacheDirs(pathsB).verifiedDir);
    for (const layer of chain) {
      for (const [name, { sha256 }] of Object.entries(layer.manifest.files)) {
        assert.equal(await verifier.verify(path.join(layer.dir, name), sha256, layer.tag), "cached", name);
      }
    }

    const services = await openServices(pathsB);
    try {
      const [child] = await services.sandboxes.spawn({ snapshotTag: "p2", n: 1 });
      const id = (child as { id: string }).id;
      assert.equal((await services.sandboxes.eval(id, STATE_PROBE)).result, "(2, ['first', 'second'])");
      assert.equal(
        (await services.sandboxes.files.read(id, "/root/notes.txt")).data.toString(),
        "first\nsecond\n",
      );
      const [middle] = await services.sandboxes.spawn({ snapshotTag: "p1", n: 1 });
      assert.equal(
        (await services.sandboxes.eval((middle as { id: string }).id, STATE_PROBE)).result,
        "(1, ['first'])",
      );
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("--tag installs the head under a new name on top of the ancestors already there", async () => {
    const pathsB = { ...homeB, images: imagesB };
    const again = await unpackSnapshot(pathsB, { file: pack, tag: "p2-copy" });
    assert.deepEqual(
      [again.head, again.installed, again.reused, again.image],
      ["p2-copy", ["p2-copy"], [base, "p1"], "present"],
    );
    const services = await openServices(pathsB);
    try {
      const [child] = await services.sandboxes.spawn({ snapshotTag: "p2-copy", n: 1 });
      assert.equal(
        (await services.sandboxes.eval((child as { id: string }).id, STATE_PROBE)).result,
        "(2, ['first', 'second'])",
      );
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("a pack with a flipped byte is refused and installs nothing", async () => {
    const damaged = path.join(homeA.home, "damaged.tar.zst");
    const bytes = await readFile(pack);
    await rm(damaged, { force: true });
    const handle = await open(damaged, "wx");
    await handle.writeFile(bytes);
    const at = Math.floor(bytes.length / 2);
    await handle.write(Buffer.from([(bytes[at] as number) ^ 0x10]), 0, 1, at);
    await handle.close();
    const homeC = await tempHome("forkd-pack-c-");
    try {
      await assert.rejects(unpackSnapshot(homeC, { file: damaged }), /zstd could not decompress|corrupted/);
      assert.deepEqual(await entries(homeC.snapshots), []);
    } finally {
      await homeC.cleanup();
    }
  });
});
