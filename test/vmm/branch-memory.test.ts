/**
 * Guest memory of a running child (guest-memory.ts, page-restore.ts) on real VMs: the pagemap scan against
 * the actual content, both copy methods, and a child restored from the memory file + the source's private
 * pages + its device state (pages written before the state is loaded).
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import {
  findGuestRamMapping,
  type GuestRamMapping,
  PAGE_SIZE,
  readPages,
  scanPrivatePages,
  touchPages,
  writePages,
} from "../../src/vmm/guest-memory.js";
import type { VmHandle } from "../../src/vmm/launch.js";
import { deferredDeviceState, loadPagesThenState } from "../../src/vmm/page-restore.js";
import { liveQemuProcesses } from "../../src/vmm/qemu-process.js";
import { captureStopped } from "../../src/vmm/stopped-capture.js";
import { BranchLab, loadBranchGuest } from "../fixtures/branch-guest.js";
import type { LineChannel } from "./helpers.js";

const guest = await loadBranchGuest();
const skip = "skip" in guest ? guest.skip : undefined;
const MIB = 1024 * 1024;

describe("guest memory of a running child", { skip }, () => {
  let lab: BranchLab;
  let source: { vm: VmHandle; channel: LineChannel };
  let mapping: GuestRamMapping;
  let fillSum = "";

  before(async () => {
    if ("skip" in guest) return;
    lab = await BranchLab.create(guest);
    await lab.bootParent(async (channel) => {
      assert.equal(await channel.request("count"), "count 1 opens=1");
    });
    source = await lab.child("source");
    assert.equal(await source.channel.request("count", 120_000), "count 2 opens=1");
    fillSum = (await source.channel.request("fill 24", 300_000)).replace("fill ", "");
    assert.match(fillSum, /^[0-9a-f]{32}$/);
    assert.equal(await source.channel.request("bgstart"), "bg started");
    mapping = findGuestRamMapping(source.vm.pid, lab.memoryFile, { expectedBytes: lab.memoryMiB * MIB });
  });

  after(async () => {
    await lab?.cleanup();
    assert.deepEqual(liveQemuProcesses(), [], "every QEMU of these tests was killed");
  });

  test("the mapping of the memory file is found, MAP_PRIVATE and the size of guest RAM", () => {
    assert.equal(mapping.private, true);
    assert.equal(mapping.length, lab.memoryMiB * MIB);
    assert.equal(mapping.fileOffset, 0);
    assert.throws(
      () => findGuestRamMapping(process.pid, lab.memoryFile),
      (err: unknown) => err instanceof ForkdError && err.code === "not_found",
    );
    assert.throws(
      () => findGuestRamMapping(source.vm.pid, lab.memoryFile, { expectedBytes: 1234 }),
      /expected 1234/,
    );
  });

  test("every page that differs from the memory file is in the private set (VM stopped)", async (t) => {
    const qmp = await source.vm.qmp();
    await qmp.execute("stop");
    try {
      const scan = scanPrivatePages(mapping);
      const all = Uint32Array.from({ length: mapping.length / PAGE_SIZE }, (_, i) => i);
      const ram = Buffer.alloc(mapping.length);
      readPages(mapping, all, ram, { method: "proc_mem" });
      const file = fs.readFileSync(lab.memoryFile);
      const inSet = new Uint8Array(all.length);
      for (const page of scan.pages) inSet[page] = 1;
      let differing = 0;
      let missed = 0;
      for (let i = 0; i < all.length; i++) {
        const a = ram.subarray(i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
        const b = file.subarray(i * PAGE_SIZE, (i + 1) * PAGE_SIZE);
        if (a.equals(b)) continue;
        differing++;
        if (!inSet[i]) missed++;
      }
      t.diagnostic(
        `${lab.memoryMiB} MiB RAM: ${scan.pages.length} private pages (${((scan.pages.length * PAGE_SIZE) / MIB).toFixed(1)} MiB), ` +
          `${differing} differ from the file, ${missed} missed; scan ${scan.ms.toFixed(1)} ms`,
      );
      assert.equal(missed, 0);
      // The 24 MiB of random data the guest wrote are all private.
      assert.ok(differing >= (24 * MIB) / PAGE_SIZE, `only ${differing} pages differ`);
      assert.ok(scan.pages.length >= differing);
      assert.ok(scan.pages.every((p, i) => i === 0 || p > (scan.pages[i - 1] as number)));
    } finally {
      await qmp.execute("cont");
    }
  });

  test("process_vm_readv and /proc/PID/mem read the same bytes; costs", async (t) => {
    const qmp = await source.vm.qmp();
    await qmp.execute("stop");
    try {
      const { pages } = scanPrivatePages(mapping);
      const bytes = pages.length * PAGE_SIZE;
      const reused = Buffer.alloc(bytes);
      reused.fill(1); // touched: no first-touch faults in the timed reads
      const viaProcMem = Buffer.alloc(bytes);
      const lines: string[] = [];
      const rate = (r: { bytes: number; ms: number }) => `${(r.bytes / 1e9 / (r.ms / 1000)).toFixed(2)} GB/s`;
      const fresh = readPages(mapping, pages, Buffer.allocUnsafe(bytes), { method: "process_vm" });
      lines.push(
        `process_vm_readv, fresh buffer: ${fresh.ms.toFixed(1)} ms (${rate(fresh)}, ${fresh.calls} calls)`,
      );
      const warm = readPages(mapping, pages, reused, { method: "process_vm" });
      lines.push(`process_vm_readv, reused buffer: ${warm.ms.toFixed(1)} ms (${rate(warm)})`);
      const proc = readPages(mapping, pages, viaProcMem, { method: "proc_mem" });
      lines.push(
        `/proc/PID/mem, fresh buffer: ${proc.ms.toFixed(1)} ms (${rate(proc)}, ${proc.calls} calls)`,
      );
      const procWarm = readPages(mapping, pages, viaProcMem, { method: "proc_mem" });
      lines.push(`/proc/PID/mem, reused buffer: ${procWarm.ms.toFixed(1)} ms (${rate(procWarm)})`);
      t.diagnostic(`${(bytes / MIB).toFixed(1)} MiB of private pages: ${lines.join("; ")}`);
      assert.equal(warm.method, "process_vm");
      assert.ok(reused.equals(viaProcMem), "both methods read the same bytes");
      // Spot check against /proc/PID/mem directly at one page.
      const fd = fs.openSync(`/proc/${mapping.pid}/mem`, "r");
      const one = Buffer.alloc(PAGE_SIZE);
      const k = Math.floor(pages.length / 2);
      fs.readSync(fd, one, 0, PAGE_SIZE, mapping.start + (pages[k] as number) * PAGE_SIZE);
      fs.closeSync(fd);
      assert.ok(one.equals(reused.subarray(k * PAGE_SIZE, (k + 1) * PAGE_SIZE)));
    } finally {
      await qmp.execute("cont");
    }
  });

  test("touchPages populates QEMU's page tables for all of guest RAM", (t) => {
    const result = touchPages(mapping);
    t.diagnostic(`touch ${lab.memoryMiB} MiB: ${result.ms.toFixed(1)} ms, ${result.calls} calls`);
    assert.equal(result.calls, Math.ceil(mapping.length / PAGE_SIZE / 1024));
  });

  test("bad arguments are refused before anything is copied", () => {
    const one = Uint32Array.of(mapping.length / PAGE_SIZE);
    assert.throws(() => readPages(mapping, one, Buffer.alloc(PAGE_SIZE)), /beyond guest RAM/);
    assert.throws(
      () => readPages(mapping, Uint32Array.of(0, 1), Buffer.alloc(PAGE_SIZE)),
      /cannot hold 2 pages/,
    );
    const shared = { ...mapping, private: false };
    assert.throws(() => writePages(shared, Uint32Array.of(0), Buffer.alloc(PAGE_SIZE)), /shared mapping/);
    assert.throws(() => scanPrivatePages(shared), /MAP_PRIVATE/);
    assert.throws(
      () => readPages({ ...mapping, pid: 2 ** 22 + 7 }, Uint32Array.of(0), Buffer.alloc(PAGE_SIZE)),
      (err: unknown) => err instanceof ForkdError,
    );
  });

  test("a child gets the source's private pages before its device state and continues the source", async (t) => {
    const qmp = await source.vm.qmp();
    const statePath = path.join(lab.dir, "source.state");
    // Diff capture by stop-and-copy: device state, private pages, resume.
    const capture = await captureStopped({
      qmp,
      pid: source.vm.pid,
      memoryFile: lab.memoryFile,
      memoryBytes: lab.memoryMiB * MIB,
      deviceStatePath: statePath,
    });
    const { pages, data } = capture;
    const bgAtBranch = Number((await source.channel.request("bg")).replace("bg ", ""));

    // The obvious order (load the state, then write pages) is not enough: loading virtio checks its rings in RAM.
    const early = await lab.child("early", { restore: { deviceStatePath: statePath }, startPaused: true });
    const earlyQmp = await early.vm.qmp();
    for (
      let i = 0;
      (await earlyQmp.execute<{ status: string }>("query-status")).status === "inmigrate";
      i++
    ) {
      assert.ok(i < 5000, "device state load never finished");
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await new Promise((resolve) => setTimeout(resolve, 200)); // stderr is read asynchronously
    assert.match(early.vm.process.outputTail(), /inconsistent with Host index/);
    await early.vm.kill({ graceMs: 0 });

    const deferred = deferredDeviceState(lab.dir);
    const launched = performance.now();
    const child = await lab.launch(
      lab.spec("branch-child", {
        shared: false,
        diskFile: lab.overlay("branch-child", lab.parentDisk),
        restore: { deviceStatePath: deferred.path },
      }),
    );
    let write = { ms: 0, bytes: 0 };
    const loaded = await loadPagesThenState(
      child.vm,
      deferred,
      fs.readFileSync(statePath),
      (childMapping) => {
        assert.equal(
          scanPrivatePages(childMapping).pages.length,
          0,
          "QEMU wrote nothing into guest RAM at startup",
        );
        write = writePages(childMapping, pages, data);
      },
    );
    const loadedMs = performance.now() - launched;
    assert.equal(loaded.status, "running");
    assert.equal(fs.existsSync(deferred.path), false, "the FIFO is removed");

    assert.equal(await child.channel.request("count", 120_000), "count 3 opens=1");
    assert.equal(await child.channel.request("sum", 120_000), `sum ${fillSum}`);
    const bg = Number((await child.channel.request("bg")).replace("bg ", ""));
    assert.ok(bg >= bgAtBranch - 1, `background process continued from ${bgAtBranch}, child says ${bg}`);
    // The source goes on by itself.
    assert.equal(await source.channel.request("count"), "count 3 opens=1");
    assert.equal(await source.channel.request("count"), "count 4 opens=1");
    assert.equal(await child.channel.request("count"), "count 4 opens=1");

    t.diagnostic(
      `stop-and-copy of ${(data.length / MIB).toFixed(1)} MiB: pause ${capture.pauseMs.toFixed(1)} ms (state ` +
        `${capture.stateMs.toFixed(1)} ms, scan ${capture.scanMs.toFixed(1)} ms, copy ${capture.copyMs.toFixed(1)} ms ` +
        `into a fresh buffer); child: pages written in ${write.ms.toFixed(1)} ms (${(write.ms / (write.bytes / MIB)).toFixed(2)} ms/MiB), ` +
        `state loaded in ${loaded.loadMs.toFixed(1)} ms, spawn->running ${loadedMs.toFixed(0)} ms`,
    );
  });

  test("repeated stop-and-copy with a reused buffer: the pause", async (t) => {
    const qmp = await source.vm.qmp();
    let buffer: Buffer | undefined;
    const rows: string[] = [];
    for (let i = 0; i < 5; i++) {
      const capture = await captureStopped({
        qmp,
        pid: source.vm.pid,
        memoryFile: lab.memoryFile,
        memoryBytes: lab.memoryMiB * MIB,
        deviceStatePath: path.join(lab.dir, `repeat-${i}.state`),
        buffer,
      });
      if (!buffer) capture.buffer.fill(0); // first touch outside any pause
      buffer = capture.buffer;
      rows.push(
        `${capture.pauseMs.toFixed(1)} ms (copy ${(capture.data.length / MIB).toFixed(1)} MiB in ${capture.copyMs.toFixed(1)} ms)`,
      );
      assert.match(await source.channel.request("count"), /^count \d+ opens=1$/);
    }
    t.diagnostic(`pauses: ${rows.join(", ")}`);
  });
});
