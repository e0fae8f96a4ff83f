/**
 * Live capture (live-capture.ts) on real VMs: a running child on a tmpfs memory file is captured with its disk
 * frozen in the same pause; children restored from the capture continue exactly where the source was (shell
 * state, a file in guest RAM, a running background process, the disk), while the source goes on unaffected.
 * On an ext4 memory file QEMU refuses, and the source keeps running.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { freezeDisk, prepareDiskFreeze } from "../../src/vmm/disk-layers.js";
import { PAGE_SIZE, writePages, writePagesFromFile } from "../../src/vmm/guest-memory.js";
import type { VmHandle } from "../../src/vmm/launch.js";
import {
  captureLive,
  type LiveCaptureResult,
  MemoryPageSink,
  PageFileSink,
  type PageSink,
} from "../../src/vmm/live-capture.js";
import { readGlobalRunState } from "../../src/vmm/migration-stream.js";
import { deferredDeviceState, loadPagesThenState } from "../../src/vmm/page-restore.js";
import { liveQemuProcesses } from "../../src/vmm/qemu-process.js";
import { BranchLab, loadBranchGuest } from "../fixtures/branch-guest.js";
import type { LineChannel } from "./helpers.js";

const guest = await loadBranchGuest();
const TMPFS_MAGIC = 0x01021994;
const isTmpfs = (dir: string) => fs.statfsSync(dir).type === TMPFS_MAGIC;
const skip =
  "skip" in guest
    ? guest.skip
    : !fs.existsSync("/dev/shm") || !isTmpfs("/dev/shm")
      ? "no tmpfs at /dev/shm (live capture needs guest RAM on tmpfs)"
      : undefined;
const MIB = 1024 * 1024;

describe("live capture of a running child", { skip }, () => {
  let lab: BranchLab;
  let source: { vm: VmHandle; channel: LineChannel };
  let fillSum = "";
  let branches = 0;

  before(async () => {
    if ("skip" in guest) return;
    lab = await BranchLab.create(guest, { parentDir: "/dev/shm" });
    await lab.bootParent(async (channel) => {
      assert.equal(await channel.request("count"), "count 1 opens=1");
      assert.equal(await channel.request("dwrite 9 parent"), "dwrite ok");
    });
    source = await lab.child("source");
    assert.equal(await source.channel.request("count", 120_000), "count 2 opens=1");
    fillSum = (await source.channel.request("fill 24", 300_000)).replace("fill ", "");
    assert.equal(await source.channel.request("bgstart"), "bg started");
    assert.equal(await source.channel.request("dwrite 10 source-before"), "dwrite ok");
  });

  after(async () => {
    await lab?.cleanup();
    assert.deepEqual(liveQemuProcesses(), [], "every QEMU of these tests was killed");
  });

  /** One BRANCH of the source: disk frozen and memory captured in one pause, into snapshot directory `name`. */
  async function branch(
    name: string,
    sink: PageSink,
    extra: { childRunState?: "running" | "paused" | "as-saved" } = {},
  ): Promise<{ result: LiveCaptureResult; snapshotDir: string; freezeMs: number }> {
    const qmp = await source.vm.qmp();
    const snapshotDir = path.join(lab.dir, name);
    fs.mkdirSync(snapshotDir);
    const frozenPath = path.join(snapshotDir, "disk.qcow2");
    const prepared = await prepareDiskFreeze(qmp, {
      overlayFile: path.join(lab.dir, `source-top-${++branches}.qcow2`),
      backingPath: frozenPath,
    });
    let freezeMs = 0;
    const result = await captureLive({
      qmp,
      pid: source.vm.pid,
      memoryFile: lab.memoryFile,
      memoryBytes: lab.memoryMiB * MIB,
      socketDir: lab.dir,
      deviceStatePath: path.join(snapshotDir, "devices.state"),
      sink,
      whileStopped: async () => {
        const frozen = await freezeDisk(qmp, prepared);
        fs.linkSync(frozen.frozenFile, frozenPath);
        freezeMs = frozen.ms;
      },
      ...extra,
    });
    return { result, snapshotDir, freezeMs };
  }

  function describeCapture(r: LiveCaptureResult, freezeMs: number): string {
    return (
      `pause ${r.pauseMs.toFixed(1)} ms (as seen by the caller ${r.pauseWallMs.toFixed(1)}; QEMU setup ` +
      `${r.qemu.setupMs} ms, downtime ${r.qemu.downtimeMs} ms; freeze ${freezeMs.toFixed(1)} ms), total ` +
      `${r.totalMs.toFixed(0)} ms, stream ${(r.stream.streamBytes / MIB).toFixed(1)} MiB, ${r.pagesCaptured} ` +
      `private pages captured (${((r.pagesCaptured * PAGE_SIZE) / MIB).toFixed(1)} MiB; scan ` +
      `${r.scanMs?.toFixed(1)} ms, touch before the pause ${r.touchMs?.toFixed(0)} ms), device state ` +
      `${r.deviceStateBytes} bytes`
    );
  }

  test("children restored from a live capture continue the source; the source goes on unaffected", async (t) => {
    const bgBefore = Number((await source.channel.request("bg")).replace("bg ", ""));
    const sink = new MemoryPageSink();
    const { result, snapshotDir, freezeMs } = await branch("branch-1", sink);
    t.diagnostic(describeCapture(result, freezeMs));
    assert.equal(result.savedRunState, "paused", "QEMU saved the state of a VM we had stopped");
    assert.equal(result.childStartsRunning, true, "rewritten to running");
    assert.ok(result.pagesCaptured >= (24 * MIB) / PAGE_SIZE);
    assert.ok(sink.count > 0 && sink.count <= result.pagesCaptured);
    const state = fs.readFileSync(path.join(snapshotDir, "devices.state"));
    assert.equal(readGlobalRunState(state).runState, "running");
    assert.deepEqual(
      fs.readdirSync(snapshotDir).sort(),
      ["devices.state", "disk.qcow2"],
      "no partial file or socket left",
    );
    assert.deepEqual(
      fs.readdirSync(lab.dir).filter((n) => n.startsWith("migrate-") || n.endsWith(".partial")),
      [],
    );

    // The source keeps running and changes things after the branch point.
    assert.equal(await source.channel.request("count"), "count 3 opens=1");
    assert.equal(await source.channel.request("dwrite 10 source-after"), "dwrite ok");
    assert.equal(await source.channel.request("dwrite 11 source-only"), "dwrite ok");

    const { pages, data } = sink.take();
    // Child A: memory = a copy of the memory file with the captured pages applied; an ordinary restore.
    const flatMemory = path.join(snapshotDir, "memory.bin");
    fs.copyFileSync(lab.memoryFile, flatMemory);
    const fd = fs.openSync(flatMemory, "r+");
    for (let k = 0; k < pages.length; k++) {
      fs.writeSync(fd, data, k * PAGE_SIZE, PAGE_SIZE, (pages[k] as number) * PAGE_SIZE);
    }
    fs.closeSync(fd);
    const childA = await lab.launch(
      lab.spec("child-a", {
        shared: false,
        memoryPath: flatMemory,
        diskFile: lab.overlay("child-a", path.join(snapshotDir, "disk.qcow2")),
        restore: { deviceStatePath: path.join(snapshotDir, "devices.state") },
      }),
    );

    // Child B: the source's memory file + pages written into its MAP_PRIVATE RAM before the state loads.
    const deferred = deferredDeviceState(lab.dir);
    const childB = await lab.launch(
      lab.spec("child-b", {
        shared: false,
        diskFile: lab.overlay("child-b", path.join(snapshotDir, "disk.qcow2")),
        restore: { deviceStatePath: deferred.path },
      }),
    );
    const loaded = await loadPagesThenState(childB.vm, deferred, state, (mapping) => {
      writePages(mapping, pages, data);
    });
    assert.equal(loaded.status, "running");

    for (const [name, child] of [
      ["A", childA],
      ["B", childB],
    ] as const) {
      assert.equal(await child.channel.request("count", 120_000), "count 3 opens=1", `child ${name}`);
      assert.equal(await child.channel.request("sum", 120_000), `sum ${fillSum}`, `child ${name}`);
      const bg = Number((await child.channel.request("bg")).replace("bg ", ""));
      assert.ok(bg >= bgBefore, `child ${name}: background process continued (${bg} >= ${bgBefore})`);
      assert.equal(await child.channel.request("dread 9"), "dread parent", `child ${name}`);
      assert.equal(await child.channel.request("dread 10"), "dread source-before", `child ${name}`);
      assert.equal(
        await child.channel.request("dread 11"),
        "dread ",
        `child ${name}: the source's later write`,
      );
    }
    // The children diverge from each other and from the source.
    assert.equal(await childA.channel.request("dwrite 11 child-a"), "dwrite ok");
    assert.equal(await childB.channel.request("count"), "count 4 opens=1");
    assert.equal(await childB.channel.request("dread 11"), "dread ");
    assert.equal(await source.channel.request("dread 11"), "dread source-only");
    assert.equal(await source.channel.request("count"), "count 4 opens=1");
    assert.equal(await source.channel.request("sum", 120_000), `sum ${fillSum}`);
    await Promise.all([childA.vm.kill(), childB.vm.kill()]);
  });

  test("a device state kept as saved (paused) needs cont; pages from a page file", async (t) => {
    const pageFile = path.join(lab.dir, "branch-2.pages");
    const sink = new PageFileSink(pageFile);
    const { result, snapshotDir, freezeMs } = await branch("branch-2", sink, { childRunState: "as-saved" });
    const pages = sink.finish();
    t.diagnostic(describeCapture(result, freezeMs));
    assert.equal(result.childStartsRunning, false);
    assert.equal(fs.statSync(pageFile).size, pages.length * PAGE_SIZE);
    assert.equal(await source.channel.request("count"), "count 5 opens=1");

    const deferred = deferredDeviceState(lab.dir);
    const child = await lab.launch(
      lab.spec("child-c", {
        shared: false,
        diskFile: lab.overlay("child-c", path.join(snapshotDir, "disk.qcow2")),
        restore: { deviceStatePath: deferred.path },
      }),
    );
    const state = fs.readFileSync(path.join(snapshotDir, "devices.state"));
    let written = { ms: 0, bytes: 0 };
    const loaded = await loadPagesThenState(child.vm, deferred, state, (mapping) => {
      const fd = fs.openSync(pageFile, "r");
      try {
        written = writePagesFromFile(mapping, pages, fd, 0, { batchPages: 1000 });
      } finally {
        fs.closeSync(fd);
      }
    });
    assert.equal(loaded.status, "paused", "a state saved as paused stays paused after the load");
    const qmp = await child.vm.qmp();
    await qmp.execute("cont");
    assert.equal(await child.channel.request("count", 120_000), "count 5 opens=1");
    assert.equal(await child.channel.request("sum", 120_000), `sum ${fillSum}`);
    t.diagnostic(
      `child from a page file: ${(written.bytes / MIB).toFixed(1)} MiB written in ${written.ms.toFixed(1)} ms, ` +
        `state loaded in ${loaded.loadMs.toFixed(1)} ms`,
    );
    await child.vm.kill();
  });

  test("a capture that fails midway (sink error, abort) leaves no files and the source running", async () => {
    for (const failure of ["sink", "abort"] as const) {
      const controller = new AbortController();
      let seen = 0;
      const sink: PageSink = {
        page() {
          seen++;
          if (seen < 100) return;
          if (failure === "sink") throw new Error("disk full (injected)");
          controller.abort(new Error("cancelled by the caller (injected)"));
        },
      };
      const snapshotDir = path.join(lab.dir, `failed-${failure}`);
      fs.mkdirSync(snapshotDir);
      await assert.rejects(
        captureLive({
          qmp: await source.vm.qmp(),
          pid: source.vm.pid,
          memoryFile: lab.memoryFile,
          memoryBytes: lab.memoryMiB * MIB,
          socketDir: lab.dir,
          deviceStatePath: path.join(snapshotDir, "devices.state"),
          sink,
          signal: controller.signal,
        }),
        failure === "sink" ? /disk full/ : /cancelled by the caller/,
      );
      assert.deepEqual(fs.readdirSync(snapshotDir), [], `${failure}: nothing written`);
      assert.deepEqual(
        fs.readdirSync(lab.dir).filter((n) => n.startsWith("migrate-") || n.endsWith(".partial")),
        [],
      );
      const qmp = await source.vm.qmp();
      assert.equal((await qmp.execute<{ status: string }>("query-status")).status, "running", failure);
      assert.match(await source.channel.request("count", 60_000), /^count \d+ opens=1$/, failure);
      assert.equal(await source.channel.request("sum", 120_000), `sum ${fillSum}`, failure);
    }
    // And the next capture works.
    const sink = new MemoryPageSink();
    const { result } = await branch("after-failures", sink);
    assert.ok(result.pagesCaptured > 0);
  });

  test("repeated branches of one source: the pause does not grow", async (t) => {
    const pauses: number[] = [];
    for (let i = 0; i < 6; i++) {
      const sink = new MemoryPageSink();
      const { result } = await branch(`repeat-${i}`, sink);
      pauses.push(result.pauseMs);
      assert.ok(sink.count > 0);
      assert.match(await source.channel.request("count"), /^count \d+ opens=1$/);
    }
    t.diagnostic(`pauses (ms): ${pauses.map((p) => p.toFixed(1)).join(", ")}`);
    const first = Math.min(...pauses.slice(0, 2));
    const last = Math.max(...pauses.slice(-2));
    // Generous: the host is shared with other VMs; a pause that grows with every branch would be far beyond it.
    assert.ok(last < Math.max(10 * first, 500), `pause grew from ${first} to ${last} ms`);
  });
});

const diskDir = [os.tmpdir(), "/var/tmp"].find((d) => fs.existsSync(d) && !isTmpfs(d));

describe("live capture refused", {
  skip: "skip" in guest ? guest.skip : diskDir ? undefined : "no non-tmpfs temp dir",
}, () => {
  test("QEMU refuses background-snapshot on a memory file on disk; the VM is left as it was", async () => {
    if ("skip" in guest) return;
    const lab = await BranchLab.create(guest, { parentDir: diskDir });
    try {
      const { vm } = await lab.launch(
        lab.spec("vm", { shared: false, diskFile: lab.overlay("vm", lab.baseDisk), startPaused: true }),
      );
      const qmp = await vm.qmp();
      await assert.rejects(
        captureLive({
          qmp,
          pid: vm.pid,
          memoryFile: lab.memoryFile,
          memoryBytes: lab.memoryMiB * MIB,
          socketDir: lab.dir,
          deviceStatePath: path.join(lab.dir, "devices.state"),
          sink: new MemoryPageSink(),
          touchFirst: false,
        }),
        (err: unknown) =>
          err instanceof ForkdError && err.code === "unavailable" && /tmpfs/.test(err.message),
      );
      assert.equal((await qmp.execute<{ status: string }>("query-status")).status, "prelaunch");
      assert.equal(fs.existsSync(path.join(lab.dir, "devices.state")), false);
      assert.deepEqual(
        fs.readdirSync(lab.dir).filter((n) => n.startsWith("migrate-") || n.includes(".partial")),
        [],
      );
    } finally {
      await lab.cleanup();
    }
  });
});
