/**
 * The daemon's warm pool on real VMs: a spawn takes a prestarted QEMU (the sandbox runs in a process that
 * existed before the spawn) and it answers; the pool is drained on daemon stop and on snapshot delete, a
 * refused delete warms it again, and no QEMU is left behind.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { parseWarmPoolTarget } from "../../src/controller/sandboxes/warm-pool.js";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

describe("warm pool (real VMs)", { timeout: 15 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;

  before(async () => {
    home = await tempHome("forkd-pool-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("parses --warm-pool TAG:N and refuses anything else", () => {
    assert.deepEqual(parseWarmPoolTarget("pyagent:3"), { tag: "pyagent", size: 3 });
    for (const bad of ["pyagent", "pyagent:0", "../x:1", "a:-1", "a:99999", ":2"]) {
      assert.throws(() => parseWarmPoolTarget(bad), /TAG:N/, bad);
    }
  });

  it("a spawn takes a prestarted VM that answers; stopping the daemon drains the pool", async () => {
    const services = await openServices(home, { warmPools: [{ tag, size: 2 }], confinement: "off" });
    try {
      const full = () => services.sandboxes.warmPoolStats().find((s) => s.tag === tag);
      await waitFor("a full pool", 180_000, async () => ((full()?.ready ?? 0) >= 2 ? true : undefined));
      const prestarted = new Set(await qemusMentioning(home.home));
      assert.equal(prestarted.size, 2, "two pooled QEMUs before any spawn");
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, network: "none" });
      assert.ok(info?.pid && prestarted.has(info.pid), "the sandbox runs in a QEMU started before its spawn");
      assert.equal((await services.sandboxes.eval(info.id, "numpy.arange(4).sum()")).result, "6");
      assert.equal((await services.sandboxes.exec(info.id, ["hostname"])).stdout.toString().trim(), info.id);
      // Refilled in the background: back to two pooled VMs plus the sandbox.
      await waitFor("the pool refilled", 180_000, async () => ((full()?.ready ?? 0) >= 2 ? true : undefined));
    } finally {
      await services.close({ killSandboxes: true });
    }
    assert.deepEqual(await qemusMentioning(home.home), [], "close drained the pool and killed the sandbox");
    assert.deepEqual(await entries(home.run), [], "no run directory left");
  });

  it("a refused snapshot delete keeps the pool; a delete drains it", async () => {
    const services = await openServices(home, { warmPools: [{ tag, size: 1 }], confinement: "off" });
    try {
      const ready = () => services.sandboxes.warmPoolStats().find((s) => s.tag === tag)?.ready ?? 0;
      await waitFor("a full pool", 180_000, async () => (ready() >= 1 ? true : undefined));
      // A sandbox keeps the snapshot in use: its delete is refused, and the pool is warmed again.
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, network: "none" });
      await waitFor("the pool refilled", 180_000, async () => (ready() >= 1 ? true : undefined));
      await assert.rejects(services.snapshots.delete(tag));
      await waitFor("the pool warmed again", 180_000, async () => (ready() >= 1 ? true : undefined));
      await services.sandboxes.kill(info?.id as string);
      await services.snapshots.delete(tag);
      assert.deepEqual(services.sandboxes.warmPoolStats(), [], "no pool for a deleted snapshot");
      assert.deepEqual(await qemusMentioning(home.home), [], "its pooled VMs were killed");
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
  it("is refused, naming why, on a daemon whose sandboxes have cgroups", async (t) => {
    const refused = await openServices(home, { warmPools: [{ tag, size: 1 }], confinement: "on" }).then(
      async (services) => {
        await services.close({ killSandboxes: true });
        return null;
      },
      (err: unknown) => err as Error,
    );
    if (refused === null) {
      t.skip("this host gives sandboxes no cgroups (not root or no controllers): nothing to refuse");
      return;
    }
    assert.match(refused.message, /--warm-pool needs sandboxes without cgroups/);
  });
});
