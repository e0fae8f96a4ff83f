/**
 * The daemon's warm pool on real VMs: a spawn takes a prestarted QEMU (the sandbox runs in a process that
 * existed before the spawn) and it answers; the pool is drained on daemon stop and on snapshot delete, a
 * refused delete warms it again, and no QEMU is left behind. On a confined daemon a pooled QEMU is in its
 * sandbox's cgroups from the start, and a spawn asking for other limits starts cold.
 */
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { after, before, describe, it } from "node:test";
import { homeKey } from "../../src/controller/machines/restore-plan.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { parseWarmPoolTarget } from "../../src/controller/sandboxes/warm-pool.js";
import { type CgroupLayout, detectCgroupLayout, readCgroupLimits } from "../../src/isolation/cgroup.js";
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
  it("on a confined daemon, a pooled VM runs in its sandbox's cgroups under the default limits", async (t) => {
    if (process.getuid?.() !== 0) {
      t.skip("needs root (sandbox cgroups)");
      return;
    }
    // Read before any daemon runs: on cgroup v2 the daemon may move its cgroup's processes into a leaf.
    const layout = await detectCgroupLayout(homeKey(home.home));
    const services = await openServices(home, { warmPools: [{ tag, size: 2 }], confinement: "on" });
    try {
      const ready = () => services.sandboxes.warmPoolStats().find((s) => s.tag === tag)?.ready ?? 0;
      await waitFor("a full pool", 180_000, async () => (ready() >= 2 ? true : undefined));
      const prestarted = new Set(await qemusMentioning(home.home));
      assert.equal(prestarted.size, 2);
      // Confined from the start, before any spawn: each pooled QEMU is in cgroups of its own, limited.
      const pooledLeaves = await sandboxCgroupsLeft(layout);
      assert.equal(pooledLeaves.length, 2 * Object.keys(layout.hierarchies).length, pooledLeaves.join(", "));
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, network: "none" });
      assert.ok(info?.pid && prestarted.has(info.pid), "the sandbox runs in a QEMU started before its spawn");
      const procCgroup = await readFile(`/proc/${info.pid}/cgroup`, "utf8");
      assert.ok(
        procCgroup.includes(`/${info.id}`),
        `the pooled QEMU is in its sandbox's cgroups: ${procCgroup}`,
      );
      // The limits a spawn that asks for none gets (RAM + 256 MiB, one CPU per vCPU, 128 pids), in place.
      const limits = await readCgroupLimits(layout, info.id);
      if (layout.hierarchies.memory) assert.equal(limits.memoryBytes, 768 * 2 ** 20);
      if (layout.hierarchies.pids) assert.equal(limits.pids, 128);
      assert.equal(info.limits?.memory_mib, layout.hierarchies.memory ? 768 : null);
      assert.equal((await services.sandboxes.eval(info.id, "numpy.arange(4).sum()")).result, "6");
      // Other limits than the pool's: started cold, under what it asked for.
      const [limited] = await services.sandboxes.spawn({
        snapshotTag: tag,
        n: 1,
        network: "none",
        pidsLimit: 100,
      });
      assert.ok(limited?.pid && !prestarted.has(limited.pid), "a spawn with other limits does not take one");
      assert.equal((await readCgroupLimits(layout, limited.id)).pids, 100);
      await services.sandboxes.kill(info.id);
      await services.sandboxes.kill(limited.id);
    } finally {
      await services.close({ killSandboxes: true });
    }
    assert.deepEqual(await qemusMentioning(home.home), [], "close drained the pool");
    assert.deepEqual(await sandboxCgroupsLeft(layout), [], "and removed the pooled VMs' cgroups");
  });
});

async function sandboxCgroupsLeft(layout: CgroupLayout): Promise<string[]> {
  const left: string[] = [];
  for (const h of Object.values(layout.hierarchies)) {
    for (const name of await entries(h.parent)) if (name.startsWith("sb-")) left.push(`${h.parent}/${name}`);
  }
  return left;
}
