/**
 * The cgroup v2 side of isolation/cgroup.ts, which this build machine cannot run for real (its controllers are
 * bound to v1 hierarchies; CI's Debian 12 is v2-only). A fake at that boundary, named as such: a /proc/self of
 * the test's own (mountinfo + cgroup) pointing at a directory tree shaped like a v2 mount. What is checked is
 * our side: which controllers are taken from where, the delegation writes down the path (the kernel's EBUSY for a
 * cgroup with processes, and so the move into a `forkd-daemon` leaf, cannot be faked), the limit files a sandbox gets, and
 * the reasons given for a controller the hierarchy does not delegate.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { cgroupLimits, resolveLimits } from "../../src/controller/sandboxes/limits.js";
import {
  createSandboxCgroups,
  detectCgroupLayout,
  prepareCgroupParents,
  readCgroupLimits,
} from "../../src/isolation/cgroup.js";

const KEY = "0123456789ab";

describe("cgroup v2 layout (a v2 tree of the test's own)", () => {
  let dir: string;
  let proc: string;
  let mount: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-cgv2-"));
    proc = path.join(dir, "proc");
    mount = path.join(dir, "cgroup");
    await mkdir(proc);
    await mkdir(path.join(mount, "system.slice", "forkd.service"), { recursive: true });
    await writeFile(
      path.join(proc, "mountinfo"),
      `35 24 0:30 / ${mount} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n`,
    );
    await writeFile(path.join(proc, "cgroup"), "0::/system.slice/forkd.service\n");
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("names what the daemon's cgroup is not given, and uses what it is", async () => {
    const own = path.join(mount, "system.slice", "forkd.service");
    await writeFile(path.join(own, "cgroup.controllers"), "memory pids\n");
    const layout = await detectCgroupLayout(KEY, proc);
    assert.deepEqual(Object.keys(layout.hierarchies).sort(), ["memory", "pids"]);
    assert.equal(layout.hierarchies.memory?.version, 2);
    assert.equal(layout.hierarchies.memory?.parent, path.join(own, "forkd", KEY));
    assert.match(layout.missing.cpu ?? "", /cpu/);
    assert.match(layout.missing.cpu ?? "", /cgroup\.controllers/, layout.missing.cpu);
    // A spawn that asks for CPU is refused with 501 naming the reason; one that does not gets no CPU limit.
    const context = { layout, diskCap: true, defaultDiskMiB: 2048, ramMiB: 512, vcpus: 1 };
    assert.throws(
      () => resolveLimits({ cpuLimitMillicores: 500 }, context),
      (err: Error & { code?: string }) => err.code === "not_implemented" && /cpu/.test(err.message),
    );
    assert.equal(resolveLimits({}, context).cpu_millicores, null);
  });

  it("a process already in the daemon's forkd-daemon leaf finds the same parents (no nesting)", async () => {
    const own = path.join(mount, "system.slice", "forkd.service");
    await writeFile(path.join(own, "cgroup.controllers"), "memory cpu pids\n");
    await mkdir(path.join(own, "forkd-daemon"), { recursive: true });
    const leafProc = path.join(dir, "proc-leaf");
    await mkdir(leafProc);
    await writeFile(path.join(leafProc, "mountinfo"), await readFile(path.join(proc, "mountinfo"), "utf8"));
    await writeFile(path.join(leafProc, "cgroup"), "0::/system.slice/forkd.service/forkd-daemon\n");
    const fromLeaf = await detectCgroupLayout(KEY, leafProc);
    const fromUnit = await detectCgroupLayout(KEY, proc);
    assert.equal(fromLeaf.hierarchies.pids?.parent, path.join(own, "forkd", KEY));
    assert.deepEqual(fromLeaf, fromUnit);
  });

  it("delegates down the path and writes a sandbox's limits", async () => {
    const own = path.join(mount, "system.slice", "forkd.service");
    await writeFile(path.join(own, "cgroup.controllers"), "cpuset cpu io memory pids\n");
    await writeFile(path.join(own, "cgroup.procs"), "4242\n");
    const layout = await detectCgroupLayout(KEY, proc);
    assert.deepEqual(layout.missing, {});
    await prepareCgroupParents(layout);
    for (const at of [own, path.join(own, "forkd"), path.join(own, "forkd", KEY)]) {
      assert.equal(await readFile(path.join(at, "cgroup.subtree_control"), "utf8"), "+memory +cpu +pids");
    }
    const limits = resolveLimits(
      { memoryLimitMiB: 300, cpuLimitMillicores: 1500 },
      { layout, diskCap: true, defaultDiskMiB: 2048, ramMiB: 512, vcpus: 1 },
    );
    const [sandbox] = await createSandboxCgroups(layout, "sb-00000000abcd", cgroupLimits(limits));
    assert.equal(sandbox, path.join(own, "forkd", KEY, "sb-00000000abcd"));
    const read = (file: string) => readFile(path.join(sandbox as string, file), "utf8");
    assert.equal(await read("memory.max"), String(300 * 2 ** 20));
    assert.equal(await read("memory.swap.max"), "0");
    assert.equal(await read("cpu.max"), "150000 100000");
    assert.equal(await read("pids.max"), "128");
    assert.deepEqual(await readCgroupLimits(layout, "sb-00000000abcd"), {
      memoryBytes: 300 * 2 ** 20,
      cpu: { quotaUs: 150_000, periodUs: 100_000 },
      pids: 128,
    });
  });
});
