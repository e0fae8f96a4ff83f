import assert from "node:assert/strict";
import { mkdir, mkdtemp, readdir, readFile, rename, rm, stat, statfs, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { selfOwnerToken } from "../../src/common/processes.js";
import type { ManifestDraft } from "../../src/store/snapshot-store.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";

const draft: ManifestDraft = {
  template: { name: "minimal", interpreter: "none" },
  image: { hash: "h", buildId: "b", rootfs: "/r", kernel: "/k", initrd: "/i" },
  machine: {
    accel: "tcg",
    cpu: "max",
    memoryMiB: 256,
    tscKhz: null,
    compatKey: "k",
    vcpus: 1,
    cmdline: "console=ttyS0",
    qemuVersion: "7.2",
  },
  timings: { bootMs: 1, warmupMs: 2, saveMs: 3 },
  parent: null,
  memory: { format: "flat", ramBytes: 256 * 1024 * 1024, pages: 65536 },
  origin: { kind: "template", mode: null, sourceSandbox: null, pauseMs: null },
};

describe("SnapshotStore", () => {
  let root: string;
  let store: SnapshotStore;
  before(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), "forkd-store-"));
    store = new SnapshotStore(path.join(root, "snapshots"));
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it("publishes a snapshot only when committed, with hashes and read-only files", async () => {
    const writer = await store.beginWrite("alpha");
    await writeFile(writer.file("vmstate"), "device state");
    assert.equal(await store.exists("alpha"), false, "staging must be invisible");
    assert.deepEqual(await store.list(), []);
    const manifest = await writer.commit(draft, ["vmstate"]);
    assert.equal(manifest.files.vmstate?.size, 12);
    assert.equal(
      manifest.files.vmstate?.sha256,
      "8a17c1e90d39736cebab1dc4237fab6e7d4a3f13cf58439d6d4a8f178b258137",
    );
    const got = await store.get("alpha");
    assert.equal(got.manifest.tag, "alpha");
    assert.equal((await stat(path.join(got.dir, "vmstate"))).mode & 0o222, 0, "data files are read-only");
    assert.deepEqual(
      (await store.list()).map((s) => s.tag),
      ["alpha"],
    );
  });

  it("refuses to overwrite an existing tag unless replacing", async () => {
    await assert.rejects(
      store.beginWrite("alpha"),
      (err: unknown) => err instanceof ForkdError && err.code === "conflict",
    );
    const writer = await store.beginWrite("alpha", { replace: true });
    await writeFile(writer.file("vmstate"), "newer state");
    await writer.commit(draft, ["vmstate"]);
    const text = await readFile(path.join(store.dirOf("alpha"), "vmstate"), "utf8");
    assert.equal(text, "newer state");
    assert.deepEqual(
      (await readdir(store.root)).filter((n) => n.startsWith(".")),
      [],
      "no leftovers",
    );
  });

  it("abort removes the staging directory", async () => {
    const writer = await store.beginWrite("beta");
    await writeFile(writer.file("vmstate"), "x");
    await writer.abort();
    assert.deepEqual((await readdir(store.root)).sort(), ["alpha"]);
  });

  it("rejects traversal and invalid tags before touching the disk", async () => {
    for (const bad of ["../x", "a/b", "..", ".hidden", "", "x".repeat(65), "-dash"]) {
      await assert.rejects(
        store.beginWrite(bad),
        (err: unknown) => err instanceof ForkdError && err.code === "invalid_argument",
        bad,
      );
    }
  });

  it("sweeps staging directories of dead writers but not live ones", async () => {
    const deadDir = path.join(store.root, ".staging-gamma-999999999-abcd1234");
    await mkdir(deadDir);
    const live = await store.beginWrite("delta");
    const stopped: string[] = [];
    const removed = await store.sweepStale(async (dir) => {
      stopped.push(dir);
    });
    assert.deepEqual(removed, [path.basename(deadDir)]);
    assert.deepEqual(
      stopped,
      [deadDir],
      "whatever runs on a stale staging directory is stopped before it goes",
    );
    assert.ok((await readdir(store.root)).includes(path.basename(live.dir)));
    await live.abort();
  });

  it("judges a writer by pid, start time and boot: a reused pid does not keep a dead writer's files", async () => {
    // Our own pid with another start time: what a dead writer's name looks like once its pid was reused.
    const self = selfOwnerToken();
    const [pid, startTime, boot] = self.split(".");
    const reused = path.join(store.root, `.staging-eps-${pid}.${Number(startTime) + 1}.${boot}-0badf00d`);
    const otherBoot = path.join(store.root, `.staging-eps-${pid}.${startTime}.00000000-0badf00d`);
    const ours = path.join(store.root, `.staging-eps-${self}-0badf00d`);
    for (const dir of [reused, otherBoot, ours]) await mkdir(dir);
    const removed = await store.sweepStale();
    assert.deepEqual(removed.sort(), [path.basename(otherBoot), path.basename(reused)].sort());
    assert.ok((await readdir(store.root)).includes(path.basename(ours)));
    await rm(ours, { recursive: true });
  });

  it("a replace that died halfway keeps the old snapshot: put back when the new one never arrived", async () => {
    const writer = await store.beginWrite("zeta");
    await writeFile(writer.file("vmstate"), "old");
    await writer.commit(draft, ["vmstate"]);
    // The crash point of a replace: the published snapshot moved aside, the new one still in staging.
    const aside = path.join(store.root, ".replaced-zeta-999999999.1.deadbeef-00000000");
    await rename(store.dirOf("zeta"), aside);
    const staging = path.join(store.root, ".staging-zeta-999999999.1.deadbeef-00000001");
    await mkdir(staging);
    await store.sweepStale();
    assert.equal(await readFile(path.join(store.dirOf("zeta"), "vmstate"), "utf8"), "old");
    assert.deepEqual(
      (await readdir(store.root)).filter((n) => n.startsWith(".")),
      [],
      "nothing half-written left",
    );
    // Died after the new one was published: the moved-aside old one is garbage.
    await mkdir(aside);
    await store.sweepStale();
    assert.equal(await readFile(path.join(store.dirOf("zeta"), "vmstate"), "utf8"), "old");
    assert.deepEqual(
      (await readdir(store.root)).filter((n) => n.startsWith(".")),
      [],
    );
    await store.delete("zeta");
  });

  it("delete makes the snapshot disappear and reports unknown tags", async () => {
    await store.delete("alpha");
    assert.equal(await store.exists("alpha"), false);
    await assert.rejects(
      store.delete("alpha"),
      (err: unknown) => err instanceof ForkdError && err.code === "not_found",
    );
  });

  it("names a corrupt manifest", async () => {
    const writer = await store.beginWrite("broken");
    await writeFile(writer.file("vmstate"), "x");
    await writer.commit(draft, ["vmstate"]);
    const file = path.join(store.dirOf("broken"), "manifest.json");
    await rm(file);
    await writeFile(file, '{"format":1}');
    await assert.rejects(store.get("broken"), /snapshot broken: manifest is invalid/);
  });
});

describe("disk admission", () => {
  it("refuses a write the disk cannot hold, counting writes in progress", async () => {
    const root = await mkdtemp(path.join(os.tmpdir(), "forkd-disk-"));
    const store = new SnapshotStore(path.join(root, "snapshots"));
    const previous = process.env.FORKD_DISK_RESERVE_MIB;
    try {
      await mkdir(store.root, { recursive: true });
      const free = Number((await statfs(store.root)).bavail) * Number((await statfs(store.root)).bsize);
      process.env.FORKD_DISK_RESERVE_MIB = "0";
      await assert.rejects(
        store.beginWrite("huge", { expectedBytes: free * 2 }),
        (err: unknown) =>
          err instanceof ForkdError &&
          err.code === "unavailable" &&
          /not enough disk for snapshot huge/.test(err.message),
      );
      const first = await store.beginWrite("half", { expectedBytes: Math.floor(free * 0.6) });
      await assert.rejects(
        store.beginWrite("other", { expectedBytes: Math.floor(free * 0.6) }),
        /promised to writes in progress/,
      );
      await first.abort();
      const again = await store.beginWrite("other", { expectedBytes: Math.floor(free * 0.6) });
      await again.abort();
      process.env.FORKD_DISK_RESERVE_MIB = String(Math.ceil(free / 2 ** 20) + 1);
      await assert.rejects(
        store.beginWrite("tiny", { expectedBytes: 1 }),
        /must stay free \(FORKD_DISK_RESERVE_MIB\)/,
      );
      assert.deepEqual(
        (await readdir(store.root)).filter((n) => n.startsWith(".")),
        [],
        "nothing staged",
      );
    } finally {
      if (previous === undefined) delete process.env.FORKD_DISK_RESERVE_MIB;
      else process.env.FORKD_DISK_RESERVE_MIB = previous;
      await rm(root, { recursive: true, force: true });
    }
  });
});
