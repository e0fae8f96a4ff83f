/**
 * Boot -> save device state -> restore round trips with the counter guest (test/fixtures/guest.ts), which keeps
 * a counter in a shell variable and counts how often it had to reopen its agent port.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { detectHostTsc } from "../../src/vmm/host-tsc.js";
import { launchVm, type VmHandle } from "../../src/vmm/launch.js";
import { type MachineSpec, restoreCompatibilityKey } from "../../src/vmm/qemu-args.js";
import { liveQemuProcesses } from "../../src/vmm/qemu-process.js";
import { saveDeviceState } from "../../src/vmm/snapshot.js";
import { loadGuestFixture } from "../fixtures/guest.js";
import { counterSpec, LineChannel, processAlive } from "./helpers.js";

/** A TCG boot takes ~5 s on an idle 2-core host and several times that when other VMs compete. */
const BOOT_TIMEOUT_MS = 180_000;

const guest = await loadGuestFixture();
const skip = guest.skip ?? guest.counterSkip;

describe("snapshot and restore", { skip }, () => {
  // Guest RAM on tmpfs when there is one, as the product does.
  const base = fs.existsSync("/dev/shm") ? "/dev/shm" : os.tmpdir();
  let dir = "";
  let deviceState = "";
  let parentSpec: MachineSpec | undefined;
  const vms: VmHandle[] = [];
  const parentFacts = { spawnToQmpMs: 0, bootMs: 0, save: { ms: 0, bytes: 0 }, transcript: [] as string[] };

  function spec(name: string, shared: boolean): MachineSpec {
    if (guest.skip !== undefined || !guest.counterInitrd) throw new Error("no guest");
    return counterSpec({
      kernel: guest.kernel,
      initrd: guest.counterInitrd,
      kernelCmdline: guest.kernelCmdline,
      runDir: dir,
      memoryFile: path.join(dir, "memory.bin"),
      shared,
      tscKhz: detectHostTsc()?.khz,
      name,
    });
  }

  async function launch(s: MachineSpec): Promise<VmHandle> {
    const vm = await launchVm(s);
    vms.push(vm);
    return vm;
  }

  async function restoreChild(name: string, extra: Partial<MachineSpec> = {}) {
    const started = performance.now();
    const childSpec: MachineSpec = {
      ...spec(name, false),
      restore: { deviceStatePath: deviceState },
      ...extra,
    };
    assert.equal(restoreCompatibilityKey(childSpec), restoreCompatibilityKey(parentSpec as MachineSpec));
    const vm = await launch(childSpec);
    const channel = new LineChannel(await vm.agentConnection);
    return { vm, channel, started };
  }

  before(async () => {
    dir = fs.mkdtempSync(path.join(base, "forkd-vmm-snap-"));
    deviceState = path.join(dir, "devices.state");
    parentSpec = spec("parent", true);
    const started = performance.now();
    const parent = await launch(parentSpec);
    const qmp = await parent.qmp();
    parentFacts.spawnToQmpMs = performance.now() - started;
    const channel = new LineChannel(await parent.agentConnection);
    assert.equal(await channel.next(BOOT_TIMEOUT_MS), "ready opens=1 n=0", await parent.consoleTail());
    parentFacts.bootMs = performance.now() - started;
    for (const n of [1, 2, 3]) assert.equal(await channel.request("count"), `count ${n} opens=1`);
    assert.match(await channel.request("rng"), /^rng [0-9a-f]{16}$/);
    parentFacts.save = await saveDeviceState(qmp, deviceState);
    assert.equal((await qmp.execute<{ status: string }>("query-status")).status, "paused");
    await parent.kill();
    parentFacts.transcript = channel.transcript;
  });

  after(async () => {
    await Promise.all(vms.map((vm) => vm.kill({ graceMs: 0 })));
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(liveQemuProcesses(), [], "every QEMU of these tests was killed");
  });

  test("the parent boots, counts, saves its device state atomically and leaves no socket behind", (t) => {
    t.diagnostic(
      `parent: spawn->QMP ready ${parentFacts.spawnToQmpMs.toFixed(1)} ms, spawn->guest agent ready ` +
        `${parentFacts.bootMs.toFixed(0)} ms, stop+save ${parentFacts.save.ms.toFixed(1)} ms ` +
        `(${parentFacts.save.bytes} bytes)`,
    );
    assert.ok(parentFacts.save.bytes > 0);
    const names = fs.readdirSync(dir);
    assert.ok(names.includes("devices.state"));
    assert.deepEqual(
      names.filter((n) => n.endsWith(".partial") || (n.startsWith("parent.") && n.endsWith(".sock"))),
      [],
    );
    const parent = vms[0] as VmHandle;
    assert.equal(processAlive(parent.pid), false);
  });

  test("children continue the parent's state without seeing the agent channel disconnect", async (t) => {
    // Two children from one snapshot, started together: each continues from 3, independently.
    const [a, b] = await Promise.all([restoreChild("child-a"), restoreChild("child-b")]);
    const replyA = await a.channel.request("count", BOOT_TIMEOUT_MS);
    const restoreToReplyMs = performance.now() - a.started;
    // opens=1: the guest never saw its port's host side go away across the restore (the chardev was
    // connected before the device state was loaded).
    assert.equal(replyA, "count 4 opens=1", a.channel.transcript.join(" | "));
    assert.equal(await b.channel.request("count"), "count 4 opens=1");
    assert.equal(await a.channel.request("count"), "count 5 opens=1");
    assert.equal(await b.channel.request("count"), "count 5 opens=1");
    assert.equal(await a.channel.request("count"), "count 6 opens=1");
    // virtio-rng survives the restore.
    assert.match(await a.channel.request("rng"), /^rng [0-9a-f]{16}$/);

    const qmp = await a.vm.qmp();
    assert.equal((await qmp.execute<{ status: string }>("query-status")).status, "running");
    t.diagnostic(`child: spawn->first agent reply ${restoreToReplyMs.toFixed(1)} ms`);
    await Promise.all([a.vm.kill(), b.vm.kill()]);
    assert.equal(processAlive(a.vm.pid), false);
  });

  test("a child started paused (-S) loads the state and runs only after cont", async (t) => {
    const child = await restoreChild("child-paused", { startPaused: true });
    const qmp = await child.vm.qmp();
    const loadedAt = performance.now();
    // While the incoming load runs the status is "inmigrate"; then "paused" until cont.
    for (;;) {
      const { status } = await qmp.execute<{ status: string }>("query-status");
      if (status === "paused") break;
      assert.equal(status, "inmigrate");
      assert.ok(performance.now() - loadedAt < 30_000, "device state load never completed");
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const spawnToLoaded = performance.now() - child.started;
    const resumed = qmp.waitEvent("RESUME");
    await qmp.execute("cont");
    await resumed;
    const spawnToRunning = performance.now() - child.started;
    assert.equal(await child.channel.request("count", BOOT_TIMEOUT_MS), "count 4 opens=1");
    t.diagnostic(
      `paused child: spawn->state loaded ${spawnToLoaded.toFixed(1)} ms, spawn->running (after cont) ` +
        `${spawnToRunning.toFixed(1)} ms`,
    );
    await child.vm.kill();
  });

  test("reattachAgent points the agent chardev at a fresh listener (a daemon restart)", async (t) => {
    const child = await restoreChild("child-reattach");
    assert.equal(await child.channel.request("count", BOOT_TIMEOUT_MS), "count 4 opens=1");

    // 1. Reattach while the old connection is still up: the guest notices nothing (no EOF, no reopen).
    const started = performance.now();
    const socket = await child.vm.reattachAgent();
    t.diagnostic(`reattach (connection up): ${(performance.now() - started).toFixed(1)} ms`);
    let channel = new LineChannel(socket);
    const reply = await channel.request("count", 20_000).catch(async (err: Error) => {
      const chardevs = await (await child.vm.qmp()).execute("query-chardev");
      throw new Error(
        `${err.message}; old channel: ${child.channel.transcript.join(" | ")}; chardevs: ${JSON.stringify(chardevs)}`,
      );
    });
    assert.equal(reply, "count 5 opens=1");

    // 2. The host's end dies first (daemon crash): the guest reads EOF and reopens its port; once a new
    //    daemon reattaches (here on a new path) the guest announces itself again.
    socket.destroy();
    await new Promise((resolve) => setTimeout(resolve, 500));
    const newPath = path.join(dir, "child-reattach.agent2.sock");
    channel = new LineChannel(await child.vm.reattachAgent({ socketPath: newPath }));
    const readyLine = await channel.next(20_000).catch(async (err: Error) => {
      const chardevs = await (await child.vm.qmp()).execute("query-chardev");
      throw new Error(
        `${err.message}; chardevs: ${JSON.stringify(chardevs)}; console: ${await child.vm.consoleTail()}`,
      );
    });
    const ready = /^ready opens=(\d+) n=5$/.exec(readyLine);
    assert.ok(ready && Number(ready[1]) >= 2, channel.transcript.join(" | "));
    assert.equal(await channel.request("count"), `count 6 opens=${ready[1]}`);
    await child.vm.kill();
    assert.equal(fs.existsSync(newPath), false, "the listener's socket file is gone");
  });
});
