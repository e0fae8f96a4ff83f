/**
 * The boot and probe initramfs, built from the real Debian kernel and busybox packages the host's apt
 * resolves, listed with cpio and booted under QEMU.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { downloadPackages, hostDistro, resolveBootPackagesUncached } from "../../src/image/apt.js";
import {
  bootInitScript,
  buildBootInitramfs,
  buildProbeInitramfs,
  PROBE_MARKER,
  ROOT_MOUNT_FAILED_MARKER,
} from "../../src/image/initramfs.js";
import {
  type ExtractedKernel,
  extractKernel,
  type KernelModule,
  moduleLoadOrder,
} from "../../src/image/kernel.js";
import { run } from "../../src/image/run.js";
import { bootGuest, cpioExtract, cpioList } from "./helpers.js";

const isRoot = process.geteuid?.() === 0;

let dir: string;
let kernel: ExtractedKernel;
let busybox: string;
let modules: KernelModule[];
let initrd: string;
let probeInitrd: string;

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-initramfs-test-"));
  if (!isRoot) return;
  await fs.chmod(dir, 0o755);
  const { arch } = await hostDistro();
  const boot = await resolveBootPackagesUncached(arch);
  const debs = await downloadPackages(
    [
      { name: boot.kernelPackage, version: boot.kernelVersion },
      { name: "busybox-static", version: boot.busyboxVersion },
    ],
    dir,
  );
  kernel = await extractKernel(debs.get(boot.kernelPackage)!, path.join(dir, "kernel"));
  await run("dpkg-deb", ["-x", debs.get("busybox-static")!, path.join(dir, "busybox")]);
  busybox = path.join(dir, "busybox", "bin", "busybox");
  modules = await moduleLoadOrder(kernel);
  initrd = path.join(dir, "initrd.img");
  probeInitrd = path.join(dir, "probe-initrd.img");
  await buildBootInitramfs(initrd, path.join(dir, "work"), busybox, modules);
  await buildProbeInitramfs(probeInitrd, path.join(dir, "work"), busybox);
});

after(() => fs.rm(dir, { recursive: true, force: true }));

describe("init script", () => {
  test("loads the given modules in order and never offers a shell", () => {
    const script = bootInitScript(["virtio_ring", "virtio", "ext4"]);
    assert.match(script, /^#!\/bin\/busybox sh\n/);
    assert.match(script, /for m in virtio_ring virtio ext4; do/);
    assert.match(script, /exec \$bb switch_root \/newroot \/opt\/forkd\/forkd-agent\n/);
    assert.doesNotMatch(
      script,
      /tini|\/usr\/bin\/node/,
      "no interpreter or init between /init and the agent",
    );
    assert.match(script, /echo "\$\{kv#\*=\}" > "\/newroot\/proc\/sys\/\$\{kv%%=\*\}"/, "sets the sysctls");
    assert.ok(script.includes("vm/stat_interval=60"));
    assert.ok(script.includes(ROOT_MOUNT_FAILED_MARKER));
    const body = script.split("\n").slice(1).join("\n");
    assert.doesNotMatch(body, /\bb?sh\b\s*$|busybox sh|\$bb sh|exec sh/m, "no interactive shell fallback");
    assert.throws(() => bootInitScript(["ext4; reboot"]), /bad module name/);
  });
});

describe("kernel modules", { skip: !isRoot && "needs root (device nodes in the initramfs)" }, () => {
  test("come in dependency order, each once, including ext4's crc32c soft dependency", () => {
    const names = modules.map((m) => m.name.replaceAll("-", "_"));
    assert.equal(new Set(names).size, names.length, `duplicates in ${names}`);
    const before = (a: string, b: string) => {
      assert.ok(names.includes(a) && names.includes(b), `${a} and ${b} in ${names}`);
      assert.ok(names.indexOf(a) < names.indexOf(b), `${a} before ${b} in ${names}`);
    };
    before("virtio_ring", "virtio");
    for (const m of ["virtio_mmio", "virtio_blk", "virtio_console", "virtio_rng", "virtio_net"])
      before("virtio", m);
    for (const m of ["jbd2", "mbcache", "crc16", "crc32c_generic"]) before(m, "ext4");
  });
});

describe("initramfs images", { skip: !isRoot && "needs root (device nodes in the initramfs)" }, () => {
  test("the boot initramfs is a newc cpio with busybox, /init, /dev/console and the modules in load order", async () => {
    const magic = Buffer.alloc(6);
    const handle = await fs.open(initrd, "r");
    await handle.read(magic, 0, 6, 0);
    await handle.close();
    assert.equal(magic.toString(), "070701", "uncompressed newc");

    const entries = await cpioList(initrd);
    for (const e of ["bin/busybox", "init", "dev/console", "newroot", "proc", "sys"])
      assert.ok(entries.includes(e), e);
    const archived = entries.filter((e) => e.startsWith("lib/modules/")).map((e) => path.basename(e, ".ko"));
    assert.deepEqual([...archived].sort(), modules.map((m) => m.name).sort());

    const init = await cpioExtract(initrd, "init");
    assert.ok(init.includes(`for m in ${modules.map((m) => m.name).join(" ")}; do`), init);
    assert.equal(init, bootInitScript(modules.map((m) => m.name)));
    const busyboxInArchive = await cpioExtract(probeInitrd, "bin/busybox");
    assert.ok(busyboxInArchive.length > 500_000, "busybox is the static binary");
  });

  test("the probe initramfs holds busybox and /init only", async () => {
    const entries = await cpioList(probeInitrd);
    assert.ok(entries.includes("bin/busybox") && entries.includes("init"));
    assert.ok(!entries.some((e) => e.endsWith(".ko")));
    assert.match(await cpioExtract(probeInitrd, "init"), new RegExp(`echo ${PROBE_MARKER}\\n.*poweroff -f`));
  });

  test("building twice gives byte-identical archives", async () => {
    const again = path.join(dir, "initrd-again.img");
    await buildBootInitramfs(again, path.join(dir, "work-again"), busybox, modules);
    assert.ok((await fs.readFile(again)).equals(await fs.readFile(initrd)));
  });

  test("the probe prints its marker and powers the VM off", { timeout: 180_000 }, async () => {
    const result = await bootGuest({ workDir: dir, kernel: kernel.vmlinuz, initrd: probeInitrd });
    assert.ok(result.console.includes(PROBE_MARKER), result.console);
    assert.ok(result.exitedByItself, `QEMU did not power off:\n${result.console}`);
  });

  test("an unmountable root disk prints the marker and powers off instead of hanging", {
    timeout: 180_000,
  }, async () => {
    const disk = path.join(dir, "not-ext4.img");
    await fs.writeFile(disk, Buffer.alloc(16 * 1024 * 1024));
    const result = await bootGuest({ workDir: dir, kernel: kernel.vmlinuz, initrd, disk });
    assert.match(result.console, new RegExp(`${ROOT_MOUNT_FAILED_MARKER}: cannot mount /dev/vda`));
    assert.ok(result.exitedByItself, `QEMU did not power off:\n${result.console}`);
    assert.doesNotMatch(result.console, /cannot load module/, "every module loads");
  });
});
