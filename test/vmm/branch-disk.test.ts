/**
 * Disk freeze (disk-layers.ts) on a real VM: the guest continues on a fresh overlay, the frozen layer never
 * changes again and holds exactly the disk as it was, and freezing repeatedly keeps working.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { diskTop, freezeDisk, prepareDiskFreeze } from "../../src/vmm/disk-layers.js";
import type { VmHandle } from "../../src/vmm/launch.js";
import { liveQemuProcesses } from "../../src/vmm/qemu-process.js";
import type { QmpClient } from "../../src/vmm/qmp.js";
import { BOOT_TIMEOUT_MS, BranchLab, loadBranchGuest } from "../fixtures/branch-guest.js";
import type { LineChannel } from "./helpers.js";

const guest = await loadBranchGuest();
const skip = "skip" in guest ? guest.skip : undefined;

function sha256(file: string): string {
  return createHash("sha256").update(fs.readFileSync(file)).digest("hex");
}

/** The guest-visible disk of an image chain, flattened (qemu-img convert -U: QEMU holds the images open). */
function sectorsOf(lab: BranchLab, image: string, sectors: number[]): string[] {
  const flat = path.join(lab.dir, `flat-${path.basename(image)}.raw`);
  execFileSync("qemu-img", ["convert", "-U", "-O", "raw", image, flat]);
  try {
    const fd = fs.openSync(flat, "r");
    const buffer = Buffer.alloc(512);
    const out = sectors.map((sector) => {
      fs.readSync(fd, buffer, 0, 512, sector * 512);
      return buffer.toString("latin1").replace(/[\0 \n]+$/, "");
    });
    fs.closeSync(fd);
    return out;
  } finally {
    fs.rmSync(flat, { force: true });
  }
}

function backingOf(image: string): string {
  const info = JSON.parse(
    execFileSync("qemu-img", ["info", "-U", "--output=json", image], { encoding: "utf8" }),
  );
  return info["backing-filename"];
}

describe("disk freeze on a running VM", { skip }, () => {
  let lab: BranchLab;
  let vm: VmHandle;
  let channel: LineChannel;
  let qmp: QmpClient;

  before(async () => {
    if ("skip" in guest) return;
    lab = await BranchLab.create(guest, { memoryMiB: 128 });
    ({ vm, channel } = await lab.launch(
      lab.spec("vm", {
        shared: false,
        diskFile: lab.overlay("vm", lab.baseDisk),
        memoryPath: lab.memoryFile,
      }),
    ));
    qmp = await vm.qmp();
    assert.equal(await channel.next(BOOT_TIMEOUT_MS), "ready opens=1 n=0");
  });

  after(async () => {
    await lab?.cleanup();
    assert.deepEqual(liveQemuProcesses(), [], "every QEMU of these tests was killed");
  });

  test("writes after the freeze land only in the new overlay; the frozen layer is the disk as it was", async (t) => {
    assert.equal(await channel.request("dwrite 10 before"), "dwrite ok");
    const top = await diskTop(qmp);
    assert.equal(top.nodeName, "disk0");
    assert.equal(top.file, path.join(lab.dir, "vm.qcow2"));
    assert.equal(top.depth, 1);

    const snapshotDir = path.join(lab.dir, "snap1");
    fs.mkdirSync(snapshotDir);
    const frozenLink = path.join(snapshotDir, "disk.qcow2");
    const prepared = await prepareDiskFreeze(qmp, {
      overlayFile: path.join(lab.dir, "vm-1.qcow2"),
      backingPath: frozenLink,
    });
    assert.equal(prepared.frozenFile, top.file);
    const started = performance.now();
    await qmp.execute("stop");
    const frozen = await freezeDisk(qmp, prepared);
    await qmp.execute("cont");
    const pauseMs = performance.now() - started;
    fs.linkSync(frozen.frozenFile, frozenLink);
    const frozenHash = sha256(frozenLink);

    assert.equal(await channel.request("dwrite 10 after"), "dwrite ok");
    assert.equal(await channel.request("dwrite 20 new"), "dwrite ok");
    assert.equal(await channel.request("dread 10"), "dread after");
    assert.equal(sha256(frozenLink), frozenHash, "the frozen layer did not change");
    assert.deepEqual(sectorsOf(lab, frozenLink, [10, 20]), ["before", ""]);
    assert.deepEqual(sectorsOf(lab, frozen.topFile, [10, 20]), ["after", "new"]);

    // What QEMU wrote where: the new overlay's header names exactly the path we gave (absolute), and QEMU
    // reopened the frozen layer read-only.
    assert.equal(backingOf(frozen.topFile), frozenLink);
    const now = await diskTop(qmp);
    assert.equal(now.nodeName, prepared.overlayNode);
    assert.equal(now.file, frozen.topFile);
    assert.equal(now.depth, 2);
    const fds = fs.readdirSync(`/proc/${vm.pid}/fd`).filter((fd) => {
      try {
        return fs.readlinkSync(`/proc/${vm.pid}/fd/${fd}`) === frozen.frozenFile;
      } catch {
        return false;
      }
    });
    assert.ok(fds.length > 0);
    for (const fd of fds) {
      const flags = /flags:\s+([0-7]+)/.exec(fs.readFileSync(`/proc/${vm.pid}/fdinfo/${fd}`, "utf8"));
      assert.equal(Number.parseInt(flags?.[1] ?? "", 8) & 3, 0, "frozen layer open O_RDONLY");
    }
    t.diagnostic(
      `freeze: pause (stop + blockdev-snapshot + cont) ${pauseMs.toFixed(1)} ms, blockdev-snapshot ${frozen.ms.toFixed(1)} ms`,
    );
  });

  test("repeated freezes keep working; the chain grows by one per freeze", async (t) => {
    const rows: string[] = [];
    const links: string[] = [];
    for (let i = 2; i <= 9; i++) {
      const link = path.join(lab.dir, `layer-${i - 1}.qcow2`);
      // Relative to the overlay's directory (the same directory here), as the controller's overlays are.
      const prepared = await prepareDiskFreeze(qmp, {
        overlayFile: path.join(lab.dir, `vm-${i}.qcow2`),
        backingPath: path.basename(link),
      });
      const started = performance.now();
      await qmp.execute("stop");
      const frozen = await freezeDisk(qmp, prepared);
      await qmp.execute("cont");
      const pauseMs = performance.now() - started;
      fs.linkSync(frozen.frozenFile, link);
      links.push(link);
      assert.equal(backingOf(frozen.topFile), path.basename(link));
      const writeStarted = performance.now();
      assert.equal(await channel.request(`dwrite ${30 + i} layer${i}`), "dwrite ok");
      const writeMs = performance.now() - writeStarted;
      const readStarted = performance.now();
      assert.equal(await channel.request("dread 10"), "dread after");
      const readMs = performance.now() - readStarted;
      const top = await diskTop(qmp);
      assert.equal(top.depth, i + 1);
      rows.push(
        `#${i}: pause ${pauseMs.toFixed(1)} ms (blockdev-snapshot ${frozen.ms.toFixed(1)}), guest write ` +
          `${writeMs.toFixed(0)} ms, read ${readMs.toFixed(0)} ms`,
      );
    }
    t.diagnostic(rows.join("; "));
    // links[3] froze vm-4 at the fifth freeze: it holds layer2..layer4, not layer5 (written after).
    assert.deepEqual(sectorsOf(lab, links[3] as string, [32, 33, 34, 35, 10]), [
      "layer2",
      "layer3",
      "layer4",
      "",
      "after",
    ]);
  });

  test("an abandoned freeze removes its node and file; bad arguments are refused", async () => {
    const overlayFile = path.join(lab.dir, "abandoned.qcow2");
    const prepared = await prepareDiskFreeze(qmp, {
      overlayFile,
      backingPath: path.join(lab.dir, "nowhere.qcow2"),
    });
    const names = async () =>
      (await qmp.execute<{ "node-name": string }[]>("query-named-block-nodes")).map((n) => n["node-name"]);
    assert.ok((await names()).includes(prepared.overlayNode));
    await prepared.abandon();
    await prepared.abandon();
    assert.ok(!(await names()).includes(prepared.overlayNode));
    assert.equal(fs.existsSync(overlayFile), false);

    await assert.rejects(
      prepareDiskFreeze(qmp, { overlayFile: "relative.qcow2", backingPath: "/x" }),
      (err: unknown) => err instanceof ForkdError && err.code === "invalid_argument",
    );
    const existing = path.join(lab.dir, "vm-2.qcow2");
    await assert.rejects(
      prepareDiskFreeze(qmp, { overlayFile: existing, backingPath: "/x" }),
      (err: unknown) => err instanceof ForkdError && err.code === "conflict",
    );
    await assert.rejects(
      prepareDiskFreeze(qmp, {
        overlayFile: path.join(lab.dir, "n.qcow2"),
        backingPath: "/x",
        overlayNode: "1bad",
      }),
      /invalid QMP node name/,
    );
    assert.equal(await channel.request("dread 10"), "dread after", "the guest still works");
  });
});
