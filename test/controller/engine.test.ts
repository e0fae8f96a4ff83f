/**
 * The engine on real VMs: a pyagent snapshot, children that continue its warm state, are isolated from each
 * other in memory and on disk, and differ where they must (RNG, clock, hostname). Boots real QEMU guests under
 * whatever accelerator the host probe picks (TCG on our CI machines).
 */
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { SNAPSHOT_FILES } from "../../src/controller/machines/machine.js";
import { prepareRestore } from "../../src/controller/machines/restore-plan.js";
import { Sandbox } from "../../src/controller/machines/sandbox-vm.js";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { digestFile } from "../../src/store/hash.js";
import { SnapshotStore, type StoredSnapshot } from "../../src/store/snapshot-store.js";
import { entries, qemusMentioning, tempHome } from "../support/host.js";

const TAG = "engine-py";

describe("engine on real VMs (pyagent)", { timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let snapshot: StoredSnapshot;

  before(async () => {
    home = await tempHome("forkd-engine-");
    await createSnapshot(home, { tag: TAG, template: "pyagent" });
    snapshot = await new SnapshotStore(home.snapshots).get(TAG);
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("commits a complete, read-only snapshot and leaves no parent or staging behind", async () => {
    const m = snapshot.manifest;
    assert.equal(m.template.name, "pyagent");
    assert.ok(m.machine.accel === "tcg" || m.machine.accel === "kvm");
    const dataFiles = [SNAPSHOT_FILES.memory, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk];
    assert.deepEqual(
      Object.keys(m.files).sort(),
      [...dataFiles].sort(),
      "a template snapshot stores these files",
    );
    assert.equal(m.memory.format, "flat");
    assert.equal(m.files[SNAPSHOT_FILES.memory]?.size, 512 * 1024 * 1024);
    assert.ok(m.timings.saveMs < 1000, `pause+save took ${m.timings.saveMs} ms`);
    assert.deepEqual(
      (await entries(home.snapshots)).filter((n) => n.startsWith(".")),
      [],
    );
    assert.deepEqual(await entries(home.run), []);
  });

  it("every child continues the parent's warm interpreter", async () => {
    const result = await forkChildren(home, {
      tag: TAG,
      n: 3,
      eval: "(FORKD_WARM_MARKER, 'numpy' in dir())",
    });
    for (const child of result.children) {
      assert.equal(child.error, null);
      assert.equal(child.result, "('warm', True)");
    }
  });

  it("children differ where they must: RNG, uuid4, hostname; and have the host's clock", async () => {
    const n = 100;
    const forkStartedUnixMs = Date.now();
    const result = await forkChildren(home, {
      tag: TAG,
      n,
      eval:
        "import uuid, time, socket\n" +
        "(open('/proc/sys/kernel/random/uuid').read().strip(), str(uuid.uuid4()), time.time(), socket.gethostname())",
    });
    const rows = result.children.map((c) => {
      assert.equal(c.error, null, `child ${c.index}: ${c.error}`);
      const parsed = /^\('([0-9a-f-]{36})', '([0-9a-f-]{36})', ([0-9.]+), '([^']+)'\)$/.exec(c.result ?? "");
      assert.ok(parsed, `child ${c.index} answered ${c.result}`);
      return { kernelUuid: parsed[1], pyUuid: parsed[2], time: Number(parsed[3]) * 1000, host: parsed[4], c };
    });
    assert.equal(new Set(rows.map((r) => r.kernelUuid)).size, n, "kernel uuids distinct");
    assert.equal(new Set(rows.map((r) => r.pyUuid)).size, n, "uuid4 distinct");
    assert.equal(new Set(rows.map((r) => r.host)).size, n, "hostnames distinct");
    for (const r of rows) {
      assert.equal(r.host, r.c.id, "hostname is the sandbox id");
      // The guest read its clock between the fork's start and the moment its answer arrived.
      assert.ok(r.time >= forkStartedUnixMs - 1000, `child ${r.c.index} clock ${r.time} behind host`);
      assert.ok(r.time <= forkStartedUnixMs + r.c.done_ms + 1000, `child ${r.c.index} clock ahead of host`);
    }
  });

  it("children are isolated in memory and on disk, and never write through to the snapshot", async () => {
    const plan = await prepareRestore(home, snapshot);
    const a = await Sandbox.restore(home, plan);
    const b = await Sandbox.restore(home, plan);
    try {
      assert.equal(
        (await a.agent.eval("SECRET = 'only-in-a'\nSECRET", { timeoutMs: 60_000 })).result,
        "'only-in-a'",
      );
      const inB = await b.agent.eval("SECRET", { timeoutMs: 60_000 });
      assert.equal(inB.error?.type, "NameError", "a's variable is not in b");

      await a.agent.files.write("/root/from-a.txt", Buffer.from("written by a"));
      // Make sure the guest page cache reaches a's overlay, so isolation is tested at the disk layer too.
      await a.agent.exec(["sync"], { timeoutMs: 60_000 });
      assert.equal((await a.agent.files.read("/root/from-a.txt")).data.toString(), "written by a");
      await assert.rejects(b.agent.files.stat("/root/from-a.txt"), /ENOENT|not found|no such file/i);
    } finally {
      await a.destroy();
      await b.destroy();
    }
    const later = await Sandbox.restore(home, plan);
    try {
      await assert.rejects(later.agent.files.stat("/root/from-a.txt"), /ENOENT|not found|no such file/i);
      assert.equal((await later.agent.eval("'SECRET' in dir()", { timeoutMs: 60_000 })).result, "False");
    } finally {
      await later.destroy();
    }
    await plan.dispose();
    for (const name of [SNAPSHOT_FILES.memory, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk]) {
      const now = await digestFile(path.join(snapshot.dir, name));
      assert.equal(now.sha256, snapshot.manifest.files[name]?.sha256, `${name} unchanged by children`);
    }
  });

  it("idle children are quiet (PIT stopped, no lockup watchdog) and their timers still keep time", async () => {
    const plan = await prepareRestore(home, snapshot);
    const child = await Sandbox.restore(home, plan);
    try {
      const probe = await child.agent.eval(
        [
          "import time",
          "def irq0():",
          "    for line in open('/proc/interrupts'):",
          "        if line.strip().startswith('0:'):",
          "            return sum(int(f) for f in line.split()[1:] if f.isdigit())",
          "    return 0",
          "def sysctl(name):",
          "    return open('/proc/sys/' + name).read().strip()",
          "before, t0 = irq0(), time.monotonic()",
          "time.sleep(1.0)",
          "slept = time.monotonic() - t0",
          "(irq0() - before, round(slept, 2), sysctl('kernel/watchdog'), sysctl('vm/stat_interval'),",
          " 'nowatchdog' in open('/proc/cmdline').read())",
        ].join("\n"),
        { timeoutMs: 60_000 },
      );
      assert.equal(probe.error, null, probe.error?.traceback);
      const parsed = /^\((\d+), ([0-9.]+), '(\d+)', '(\d+)', (True|False)\)$/.exec(probe.result ?? "");
      assert.ok(parsed, `probe answered ${probe.result}`);
      assert.equal(Number(parsed[1]), 0, "no PIT (IRQ 0) interrupts in a restored child");
      const slept = Number(parsed[2]);
      assert.ok(slept >= 1 && slept < 1.5, `a 1 s sleep took ${slept} s of guest monotonic time`);
      assert.equal(parsed[3], "0", "lockup watchdog off");
      assert.equal(parsed[4], "60", "vm/stat_interval set by /init");
      assert.equal(parsed[5], "True");
      // The guest's clock stays with the host's across the sleep.
      const skew = await child.agent.eval("import time\ntime.time()", { timeoutMs: 60_000 });
      assert.ok(Math.abs(Number(skew.result) * 1000 - Date.now()) < 1500, `guest clock ${skew.result}`);
    } finally {
      await child.destroy();
      await plan.dispose();
    }
  });

  it("rejects bad input with clear errors before starting anything", async () => {
    const isCode = (code: string) => (err: unknown) => err instanceof ForkdError && err.code === code;
    await assert.rejects(forkChildren(home, { tag: "nope", n: 1 }), isCode("not_found"));
    await assert.rejects(forkChildren(home, { tag: "../etc", n: 1 }), isCode("invalid_argument"));
    await assert.rejects(forkChildren(home, { tag: "a/b", n: 1 }), isCode("invalid_argument"));
    for (const n of [0, 1001, 1.5, -1]) {
      await assert.rejects(forkChildren(home, { tag: TAG, n }), isCode("invalid_argument"), `n=${n}`);
    }
    await assert.rejects(createSnapshot(home, { tag: TAG, template: "pyagent" }), isCode("conflict"));
    await assert.rejects(
      createSnapshot(home, { tag: "x", template: "no-such-template" }),
      isCode("not_found"),
    );
    assert.deepEqual(await entries(home.run), []);
  });

  it("a child whose QEMU dies mid-spawn fails clearly and leaves nothing behind", async () => {
    const plan = await prepareRestore(home, snapshot);
    // Killed as soon as it exists (onSpawned runs before the agent connects): polling /proc for it raced a
    // restore that, on a loaded host, could finish before the poll saw the process.
    const pending = Sandbox.restore(home, plan, {
      onSpawned: async (pid) => void process.kill(pid, "SIGKILL"),
    });
    await assert.rejects(pending, /QEMU was killed by SIGKILL/);
    await plan.dispose();
    assert.deepEqual(await qemusMentioning(home.run), []);
    assert.deepEqual(await entries(home.run), []);
  });

  it("a guest that never becomes ready hits the deadline and is killed", async () => {
    const plan = await prepareRestore(home, snapshot);
    const pending = Sandbox.restore(home, plan, {
      readyTimeoutMs: 3000,
      onSpawned: async (pid) => void process.kill(pid, "SIGSTOP"),
    });
    await assert.rejects(pending, (err: unknown) => err instanceof ForkdError && err.code === "timeout");
    await plan.dispose();
    assert.deepEqual(await qemusMentioning(home.run), []);
    assert.deepEqual(await entries(home.run), []);
  });
});
