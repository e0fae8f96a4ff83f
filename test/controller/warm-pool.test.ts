/**
 * The daemon's warm pool on real VMs (spawns with the daemon's default network: a namespace of their own where
 * the host allows, else a private NIC, the pool's VMs alike): a spawn takes a prestarted QEMU (the sandbox runs in a process that
 * existed before the spawn) and it answers; the pool is drained on daemon stop and on snapshot delete, a
 * refused delete warms it again, and no QEMU is left behind. On a confined daemon a pooled QEMU is in its
 * sandbox's cgroups from the start, and a spawn asking for other limits starts cold. In netns mode a pooled VM
 * has its network made ahead (its veth on the bridge before any spawn); a spawn with an egress policy takes it
 * and reaches what the policy allows (the tests' own internet) and not what it denies; a spawn with network
 * "none" starts cold; close, a SIGKILLed daemon's restart and `forkd teardown` after one leave no namespace, veth
 * or network record.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { homeKey } from "../../src/controller/machines/restore-plan.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { retireHome } from "../../src/controller/sandboxes/retire-home.js";
import { parseWarmPoolTarget } from "../../src/controller/sandboxes/warm-pool.js";
import { type CgroupLayout, detectCgroupLayout, readCgroupLimits } from "../../src/isolation/cgroup.js";
import { resolveNetworkConfig } from "../../src/net/config.js";
import { sandboxNetNames } from "../../src/net/names.js";
import { StateDb } from "../../src/store/db.js";
import { FETCH_DEF } from "../support/guest-programs.js";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import { INTERNET_HOSTS, startTestInternet, type TestInternet } from "../support/test-internet.js";

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
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
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
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
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
    // The test before deleted the snapshot: linked again.
    tag = await linkSharedSnapshot(home.home, "pyagent");
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
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
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
      // Taken, it has the CPU weight of any sandbox; the refill after the take starts at the least weight.
      assert.equal(await cpuWeight(layout, info.id), "normal");
      await waitFor("the pool refilled", 180_000, async () => (ready() >= 2 ? true : undefined));
      const refilled = (await sandboxCgroupsLeft(layout))
        .map((dir) => path.basename(dir))
        .filter((id) => id !== info.id && !pooledLeaves.some((dir) => dir.endsWith(`/${id}`)));
      assert.ok(refilled.length > 0, "a refilled VM has cgroups of its own");
      if (layout.hierarchies.cpu) {
        for (const id of new Set(refilled)) assert.equal(await cpuWeight(layout, id), "background", id);
      }
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

/** A sandbox cgroup's CPU weight as setCpuWeight names it (or what the file says). */
async function cpuWeight(layout: CgroupLayout, id: string): Promise<string> {
  const cpu = layout.hierarchies.cpu;
  if (!cpu) return "normal";
  const file = cpu.version === 2 ? "cpu.weight" : "cpu.shares";
  const value = (await readFile(path.join(cpu.parent, id, file), "utf8")).trim();
  const names: Record<string, string> = {
    "100": "normal",
    "1024": "normal",
    "1": "background",
    "2": "background",
  };
  return names[value] ?? value;
}

async function sandboxCgroupsLeft(layout: CgroupLayout): Promise<string[]> {
  const left: string[] = [];
  for (const h of Object.values(layout.hierarchies)) {
    for (const name of await entries(h.parent)) if (name.startsWith("sb-")) left.push(`${h.parent}/${name}`);
  }
  return left;
}

describe("warm pool with sandbox networks (real VMs, netns mode)", {
  timeout: 15 * 60_000,
  skip: process.getuid?.() !== 0 && "needs root",
}, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let internet: TestInternet;
  let bridgePorts: () => Promise<string[]>;

  before(async () => {
    home = await tempHome("forkd-pool-net-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    internet = await startTestInternet();
    const { bridge } = resolveNetworkConfig({}, {}, home.home);
    bridgePorts = () => entries(`/sys/class/net/${bridge}/brif`);
  });

  after(async () => {
    await internet?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("a pooled VM's network is made ahead; a spawn with a policy takes it, reaching what it allows only", async () => {
    const services = await openServices(home, {
      warmPools: [{ tag, size: 1 }],
      network: { network: { dnsUpstreams: [internet.dns] }, defaultEgress: "deny" },
    });
    const ids: string[] = [];
    try {
      const ready = () => services.sandboxes.warmPoolStats().find((s) => s.tag === tag)?.ready ?? 0;
      await waitFor("a full pool", 180_000, async () => (ready() >= 1 ? true : undefined));
      const prestarted = new Set(await qemusMentioning(home.home));
      const portsBefore = await bridgePorts();
      assert.equal(portsBefore.length, 1, "the pooled VM's veth is on the bridge before any spawn");
      const [info] = await services.sandboxes.spawn({
        snapshotTag: tag,
        n: 1,
        timeoutMs: 0,
        network: { allowOut: ["allowed.test"] },
      });
      assert.ok(info?.pid && prestarted.has(info.pid), "the sandbox runs in a QEMU started before its spawn");
      ids.push(info.id);
      assert.deepEqual(portsBefore, [sandboxNetNames(info.id).veth], "its network is the one made ahead");
      assert.equal(info.network.kind, "netns");
      assert.equal(info.network.netns, `forkd-${info.id}`);
      assert.deepEqual(info.network.policy, { default: "deny", allowOut: ["allowed.test"], denyOut: [] });
      await services.sandboxes.eval(info.id, FETCH_DEF);
      const fetchIn = async (url: string, timeout = 8) => {
        const out = await services.sandboxes.eval(
          info.id,
          `print(fetch(${JSON.stringify(url)}, ${timeout}))`,
          {
            timeoutMs: (timeout + 20) * 1000,
          },
        );
        assert.equal(out.error, null, JSON.stringify(out));
        return out.stdout.trim();
      };
      assert.match(await fetchIn("http://allowed.test/a"), /^OK .*"host":"198\.51\.100\.10","path":"\/a"/);
      assert.match(await fetchIn("http://denied.test/"), /^ERR URLError/, "a name the policy denies");
      assert.match(await fetchIn(`http://${INTERNET_HOSTS.other}/`, 4), /^ERR /, "an address it denies");
      // A spawn without a network of its own is not served by a pool of networked VMs: it starts cold.
      await waitFor("the pool refilled", 180_000, async () => (ready() >= 1 ? true : undefined));
      const refilled = new Set(await qemusMentioning(home.home));
      const [bare] = await services.sandboxes.spawn({
        snapshotTag: tag,
        n: 1,
        timeoutMs: 0,
        network: "none",
      });
      assert.ok(bare?.pid && !refilled.has(bare.pid), "network none does not take a networked VM");
      ids.push(bare.id);
      assert.equal(bare.network.kind, "private");
    } finally {
      await services.close({ killSandboxes: true });
    }
    assert.deepEqual(await qemusMentioning(home.home), [], "close drained the pool");
    assert.deepEqual(await bridgePorts(), [], "no veth left on the bridge");
    const db = new StateDb(path.join(home.home, "state.db"));
    assert.deepEqual(db.networks(), [], "no network record left");
    db.close();
    const netns = await readdir("/run/netns").catch(() => [] as string[]);
    assert.deepEqual(
      netns.filter((n) => ids.some((id) => n === `forkd-${id}`)),
      [],
      "no namespace of these sandboxes left",
    );
  });

  /** Runs test/support/pool-then-hang with a pool of `size`, SIGKILLs it once full; the networks it recorded. */
  const killWithFullPool = async (size: number): Promise<string[]> => {
    const self = fileURLToPath(import.meta.url);
    const helper = path.join(path.dirname(self), "..", "support", `pool-then-hang${path.extname(self)}`);
    const child = spawn(process.execPath, [...process.execArgv, helper, tag, String(size), internet.dns], {
      env: { ...process.env, FORKD_HOME: home.home },
      stdio: ["ignore", "pipe", "inherit"],
    });
    let exitedWith: string | undefined;
    const exited = new Promise((r) =>
      child.once("exit", (code, signal) => {
        exitedWith = `code ${code}, signal ${signal}`;
        r(undefined);
      }),
    );
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
    });
    // A helper that dies before its pool is full (its daemon refused to open) fails the case at once.
    await waitFor("a full pool in the helper", 300_000, async () => {
      if (out.includes("full")) return true;
      if (exitedWith) throw new Error(`the helper exited before its pool was full (${exitedWith})`);
      return undefined;
    });
    const db = new StateDb(path.join(home.home, "state.db"));
    const recorded = db.networks().map((r) => r.sandbox_id);
    db.close();
    assert.equal(recorded.length, size, "the pooled VMs' networks were recorded");
    assert.equal((await bridgePorts()).length, size);
    child.kill("SIGKILL");
    await exited;
    await waitFor("the pooled QEMUs gone with their daemon", 30_000, async () =>
      (await qemusMentioning(home.home)).length === 0 ? true : undefined,
    );
    return recorded;
  };
  const assertNoNetworkLeft = async (recorded: string[]) => {
    assert.deepEqual(await bridgePorts(), [], "no veth on the bridge");
    const netns = await readdir("/run/netns").catch(() => [] as string[]);
    assert.deepEqual(
      netns.filter((n) => recorded.some((id) => n === `forkd-${id}`)),
      [],
      "no namespace left",
    );
    const check = new StateDb(path.join(home.home, "state.db"));
    assert.deepEqual(check.networks(), [], "no network record left");
    check.close();
  };

  it("a daemon SIGKILLed with a full networked pool leaves no namespace, veth or record after its restart", async () => {
    const recorded = await killWithFullPool(2);
    const reopened = await openServices(home, { network: { network: { dnsUpstreams: [internet.dns] } } });
    try {
      await assertNoNetworkLeft(recorded);
    } finally {
      await reopened.close({ killSandboxes: true });
    }
  });

  it("forkd teardown of a home whose daemon was SIGKILLed with a full networked pool removes its networks", async () => {
    const recorded = await killWithFullPool(1);
    await retireHome(home, { network: { dnsUpstreams: [internet.dns] } });
    await assertNoNetworkLeft(recorded);
  });
});
