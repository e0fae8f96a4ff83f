/**
 * Snapshot chains on real VMs: a sandbox builds state in three steps and is BRANCHed (diff) after each, giving
 * base -> l1 -> l2 -> l3. Then: what snapshot-info reports, compaction (children of the flat snapshot behave
 * like children of the head), a flipped byte in any layer refused before a child runs on it, and rmi's rules
 * (dependents, --cascade, --force, never under a running VM).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { chmod, open, readdir, rename } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { ForkdError } from "../../src/common/errors.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { removeSnapshot } from "../../src/controller/snapshots/chains.js";
import { manifestDigest } from "../../src/store/chain.js";
import { readQcow2Header } from "../../src/store/qcow2-header.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const run = promisify(execFile);
type Services = Awaited<ReturnType<typeof openServices>>;

const L1 = "chain-l1";
const L2 = "chain-l2";
const L3 = "chain-l3";
const FLAT = "chain-flat";

const isError = (code: string, pattern: RegExp) => (err: unknown) => {
  assert.ok(err instanceof ForkdError, String(err));
  assert.equal(err.code, code, err.message);
  assert.match(err.message, pattern);
  return true;
};

/** What a child of the chain should see, whichever snapshot of it it came from. */
const STATE_PROBE = "(STEP, len(DATA), sum(len(d) for d in DATA), DATA[-1][:1])";

async function childState(services: Services, id: string): Promise<{ memory: string; disk: string }> {
  const memory = (await services.sandboxes.eval(id, STATE_PROBE)).result ?? "";
  const disk = await services.sandboxes.exec(id, [
    "sh",
    "-c",
    "sha256sum /root/step-*.txt; cat /root/step-*.txt",
  ]);
  return { memory, disk: disk.stdout.toString() };
}

async function flipByte(file: string, offset: number): Promise<void> {
  const handle = await open(file, "r+");
  try {
    const byte = Buffer.alloc(1);
    await handle.read(byte, 0, 1, offset);
    byte[0] = (byte[0] as number) ^ 0xff;
    await handle.write(byte, 0, 1, offset);
  } finally {
    await handle.close();
  }
}

describe("snapshot chains on real VMs", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Services;
  let store: SnapshotStore;
  let base: string;
  let sourceId: string;

  before(async () => {
    home = await tempHome("forkd-chains-");
    base = await linkSharedSnapshot(home.home, "pyagent");
    services = await openServices(home);
    store = new SnapshotStore(home.snapshots);
    const [source] = await services.sandboxes.spawn({ snapshotTag: base, n: 1, timeoutMs: 0 });
    sourceId = (source as { id: string }).id;
    await services.sandboxes.eval(sourceId, "DATA = []\nSTEP = 0");
    for (const [step, tag] of [L1, L2, L3].entries()) {
      const n = step + 1;
      // Each step changes memory (a few hundred KiB of Python objects) and the disk (a new file).
      await services.sandboxes.eval(sourceId, `STEP = ${n}\nDATA.append(bytes([${n}]) * 300_000)`);
      await services.sandboxes.files.write(sourceId, `/root/step-${n}.txt`, Buffer.from(`step ${n}\n`));
      const branch = await services.sandboxes.branch(sourceId, { tag, mode: "diff" });
      assert.equal(branch.status, "ready");
    }
  });
  after(async () => {
    await services?.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("snapshot-info: depth, ancestors, dependents and bytes per layer", async () => {
    const head = await services.snapshots.detail(L3);
    assert.equal(head.chain_depth, 3);
    assert.deepEqual(head.ancestors, [base, L1, L2]);
    assert.deepEqual([head.dependents, head.all_dependents], [[], []]);
    assert.equal(head.parent_content_hash, await manifestDigest(await store.get(L2)));
    assert.equal(head.chain_error, null);
    const root = await services.snapshots.detail(base);
    assert.deepEqual([root.chain_depth, root.dependents, root.all_dependents], [0, [L1], [L1, L2, L3]]);
    assert.deepEqual(
      head.layers.map((l) => [l.tag, l.memory.format]),
      [
        [base, "flat"],
        [L1, "layer"],
        [L2, "layer"],
        [L3, "layer"],
      ],
    );
    for (const layer of head.layers) {
      assert.equal(layer.memory.logical_bytes, 512 * 1024 * 1024);
      assert.equal(layer.disk.logical_bytes, 2 * 1024 ** 3);
      assert.ok(layer.vmstate_bytes > 1000);
      if (layer.memory.format === "flat") continue;
      // A diff layer holds its changed pages and an index: within 10% (plus one block) of what it changed.
      const changed = layer.memory.pages * 4096;
      assert.ok(changed > 300_000, `${layer.tag}: ${layer.memory.pages} pages`);
      assert.ok(
        layer.memory.physical_bytes >= changed,
        `${layer.tag} physical ${layer.memory.physical_bytes}`,
      );
      assert.ok(layer.memory.physical_bytes <= changed * 1.1 + 8192, `${layer.tag} physical too large`);
      assert.ok(
        layer.disk.physical_bytes < 64 * 1024 * 1024,
        `${layer.tag} disk ${layer.disk.physical_bytes}`,
      );
    }
    assert.deepEqual(
      head.layers.map((l) => l.disk.backing),
      [
        "base.ext4",
        `../../snapshots/${base}/disk.qcow2`,
        `../../snapshots/${L1}/disk.qcow2`,
        `../../snapshots/${L2}/disk.qcow2`,
      ],
    );
    assert.equal(
      head.chain_bytes.memory_physical,
      head.layers.reduce((n, l) => n + l.memory.physical_bytes, 0),
    );
  });

  it("compact: one flat snapshot whose children behave exactly like the head's", async () => {
    const compacted = await services.snapshots.compact({ from: L3, to: FLAT });
    assert.deepEqual([compacted.tag, compacted.parent_tag, compacted.status], [FLAT, null, "ready"]);
    const flat = await store.get(FLAT);
    assert.equal(flat.manifest.memory.format, "flat");
    assert.deepEqual(flat.manifest.origin.compactedFrom, {
      tag: L3,
      manifestSha256: await manifestDigest(await store.get(L3)),
    });
    const header = await readQcow2Header(path.join(flat.dir, "disk.qcow2"));
    assert.deepEqual([header.backingFile, header.backingFormat], ["base.ext4", "raw"]);
    const detail = await services.snapshots.detail(FLAT);
    assert.deepEqual([detail.chain_depth, detail.ancestors], [0, []]);
    await assert.rejects(services.snapshots.compact({ from: L3, to: FLAT }), isError("conflict", /exists/));

    const [fromHead, fromFlat] = [
      ...(await services.sandboxes.spawn({ snapshotTag: L3, n: 1 })),
      ...(await services.sandboxes.spawn({ snapshotTag: FLAT, n: 1 })),
    ] as { id: string }[];
    const headState = await childState(services, (fromHead as { id: string }).id);
    const flatState = await childState(services, (fromFlat as { id: string }).id);
    assert.equal(headState.memory, "(3, 3, 900000, b'\\x03')");
    assert.match(headState.disk, /step 1\nstep 2\nstep 3\n$/);
    assert.deepEqual(flatState, headState);
    // The compacted snapshot is a parent like any other: branch its child twice (used by the rmi test below).
    const flatChild = (fromFlat as { id: string }).id;
    await services.sandboxes.eval(flatChild, "STEP = 4");
    await services.sandboxes.branch(flatChild, { tag: "flat-b1", mode: "diff" });
    await services.sandboxes.branch(flatChild, { tag: "flat-b2", mode: "diff" });
    const [grandchild] = await services.sandboxes.spawn({ snapshotTag: "flat-b2", n: 1 });
    assert.equal(
      (await services.sandboxes.eval((grandchild as { id: string }).id, STATE_PROBE)).result,
      "(4, 3, 900000, b'\\x03')",
    );
    await services.sandboxes.killAll({ snapshotTag: "flat-b2" });
    await services.sandboxes.kill((fromHead as { id: string }).id);
    await services.sandboxes.kill(flatChild);
  });

  it("a flipped byte in any layer is refused (422 naming the layer) before a child runs on it", async () => {
    // The base's files are hard links shared with other test homes: give this home its own memory.bin first.
    const baseMemory = path.join(store.dirOf(base), "memory.bin");
    await run("cp", ["--sparse=always", baseMemory, `${baseMemory}.own`]);
    await chmod(`${baseMemory}.own`, 0o444);
    await rename(`${baseMemory}.own`, baseMemory);
    const victims: [string, string, number][] = [
      [base, "memory.bin", 1234567],
      [L1, "memory.layer", 100],
      [L3, "vmstate", 200],
      [L2, "disk.qcow2", 70000],
    ];
    for (const [tag, name, offset] of victims) {
      const file = path.join(store.dirOf(tag), name);
      await flipByte(file, offset);
      const qemusBefore = (await qemusMentioning(home.home)).length;
      await assert.rejects(
        services.sandboxes.spawn({ snapshotTag: L3, n: 1 }),
        isError("unprocessable", new RegExp(`snapshot ${tag}: ${name.replace(".", "\\.")} is corrupted`)),
        `${tag}/${name}`,
      );
      assert.equal((await qemusMentioning(home.home)).length, qemusBefore, "no child was started");
      assert.equal(services.sandboxes.list({ snapshotTag: L3 }).length, 0);
      await flipByte(file, offset);
    }
    const [healthy] = await services.sandboxes.spawn({ snapshotTag: L3, n: 1 });
    assert.equal((await services.sandboxes.eval((healthy as { id: string }).id, "STEP")).result, "3");
    await services.sandboxes.kill((healthy as { id: string }).id);
  });

  it("rmi: dependents need --cascade or --force, and nothing goes while a VM maps it", async () => {
    const snapshots = services.snapshots;
    // The source still runs on top of l3's frozen layers (it was branched three times).
    await assert.rejects(snapshots.delete(L3), isError("conflict", new RegExp(`in use.*${sourceId}`)));
    await services.sandboxes.kill(sourceId);
    const [child] = await services.sandboxes.spawn({ snapshotTag: L2, n: 1 });
    const childId = (child as { id: string }).id;

    await assert.rejects(
      snapshots.delete(L1),
      isError("conflict", new RegExp(`has dependents: ${L2}, ${L3}`)),
    );
    await assert.rejects(snapshots.delete(L1, { cascade: true }), isError("conflict", new RegExp(childId)));
    await assert.rejects(snapshots.delete(L1, { force: true }), isError("conflict", new RegExp(childId)));
    // Without the daemon's records (the CLI's local path), the scan of QEMU processes finds the child.
    await assert.rejects(
      removeSnapshot(home, L1, { cascade: true }),
      isError("conflict", new RegExp(`${L2} by QEMU process`)),
    );

    // l3 is not under the child: it goes, with its assembled RAM image.
    const imageOfL3 = `${L3}-${(await manifestDigest(await store.get(L3))).slice(0, 32)}.bin`;
    const memoryCache = path.join(home.home, "cache", "memory");
    assert.ok((await readdir(memoryCache)).includes(imageOfL3));
    assert.deepEqual(await snapshots.delete(L3), [L3]);
    assert.ok(!(await readdir(memoryCache)).includes(imageOfL3), "assembled image removed");

    await services.sandboxes.kill(childId);
    assert.deepEqual(await snapshots.delete(L1, { force: true }), [L1]);
    // l2 is orphaned: it says so, and cannot be restored.
    assert.match(
      (await snapshots.detail(L2)).chain_error ?? "",
      new RegExp(`layer ${L2} depends on ${L1}, which is missing`),
    );
    await assert.rejects(
      services.sandboxes.spawn({ snapshotTag: L2, n: 1 }),
      isError("conflict", new RegExp(`layer ${L2} depends on ${L1}, which is missing`)),
    );
    assert.deepEqual(await snapshots.delete(L2), [L2]);

    // --cascade takes the subtree, leaves first: flat <- flat-b1 <- flat-b2.
    assert.deepEqual(await snapshots.delete(FLAT, { cascade: true }), ["flat-b2", "flat-b1", FLAT]);
    assert.deepEqual(
      (await readdir(home.snapshots)).filter((n) => !n.startsWith(".")),
      [base],
      "only the base is left",
    );
  });
});
