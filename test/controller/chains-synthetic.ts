/**
 * A small synthetic chain for tests that need no VM: t0 (flat, 64 MiB of RAM, mostly zeros) and layers t1..tN
 * (a few changed pages each, and a disk layer with a few MiB written by qemu-io), on the real pyagent image so
 * the disk layers read through to its root filesystem. Written with the store's own staging and commit, like
 * real snapshots; nobody can boot them (the device state is random), but every chain operation works on them.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { open, symlink, writeFile } from "node:fs/promises";
import { promisify } from "node:util";
import type { ForkdPaths } from "../../src/common/paths.js";
import { childSpec } from "../../src/controller/machines/machine.js";
import { buildImage, loadTemplate } from "../../src/image/index.js";
import { manifestDigest } from "../../src/store/chain.js";
import type { SnapshotManifest } from "../../src/store/manifest.js";
import { writeMemoryLayer } from "../../src/store/memory-layer.js";
import { type ManifestDraft, SnapshotStore } from "../../src/store/snapshot-store.js";
import { restoreCompatibilityKey } from "../../src/vmm/qemu-args.js";
import { createOverlay, qemuVersion } from "../../src/vmm/qemu-tools.js";

const run = promisify(execFile);
export const SYNTHETIC_RAM = 64 * 1024 * 1024;

/**
 * Writes `${prefix}0`..`${prefix}${layers}` (t0..t{layers} by default) into `paths.snapshots`; returns their
 * tags, root first.
 */
export async function syntheticChain(paths: ForkdPaths, layers = 1, prefix = "t"): Promise<string[]> {
  const image = await buildImage(await loadTemplate("pyagent"), {});
  const store = new SnapshotStore(paths.snapshots);
  const base: Omit<ManifestDraft, "parent" | "memory" | "origin"> = {
    template: { name: "pyagent", interpreter: "python" },
    image: {
      hash: image.hash,
      buildId: image.manifest.buildId,
      rootfs: image.rootfs,
      kernel: image.kernel,
      initrd: image.initrd,
    },
    machine: {
      accel: "tcg",
      cpu: "max",
      memoryMiB: SYNTHETIC_RAM / 2 ** 20,
      vcpus: 1,
      cmdline: "console=ttyS0",
      tscKhz: null,
      compatKey: "",
      qemuVersion: (await qemuVersion()).version,
    },
    timings: { bootMs: 0, warmupMs: 0, saveMs: 0 },
  };
  // The key a real parent would record: what this forkd builds for children of such a manifest.
  base.machine.compatKey = restoreCompatibilityKey(
    childSpec(base as SnapshotManifest, { runDir: "/run", memoryFile: "/m", shared: false, disk: "/d" }),
  );
  const root = `${prefix}0`;
  const t0 = await store.beginWrite(root);
  await symlink(image.rootfs, t0.file("base.ext4"));
  await createOverlay({ backing: "base.ext4", backingFormat: "raw", overlay: t0.file("disk.qcow2") });
  const memory = await open(t0.file("memory.bin"), "wx");
  await memory.truncate(SYNTHETIC_RAM);
  await memory.write(randomBytes(8192), 0, 8192, 4096 * 100);
  await memory.close();
  await writeFile(t0.file("vmstate"), randomBytes(4096));
  await t0.commit(
    {
      ...base,
      parent: null,
      memory: { format: "flat", ramBytes: SYNTHETIC_RAM, pages: SYNTHETIC_RAM / 4096 },
      origin: { kind: "template", mode: null, sourceSandbox: null, pauseMs: null },
    },
    ["memory.bin", "vmstate", "disk.qcow2"],
  );
  const tags = [root];
  for (let n = 1; n <= layers; n++) {
    await syntheticLayer(paths, `${prefix}${n}`, tags[n - 1] as string, n);
    tags.push(`${prefix}${n}`);
  }
  return tags;
}

/**
 * Writes one more layer `tag` on snapshot `parent` (of a synthetic chain): a few changed pages and 3 MiB of
 * disk at an offset `n` chooses (layer n of a chain uses n; a sibling layer takes a number of its own).
 */
export async function syntheticLayer(
  paths: ForkdPaths,
  tag: string,
  parent: string,
  n: number,
): Promise<void> {
  const store = new SnapshotStore(paths.snapshots);
  const { manifest } = await store.get(parent);
  const writer = await store.beginWrite(tag);
  await createOverlay({
    backing: `../../snapshots/${parent}/disk.qcow2`,
    backingFormat: "qcow2",
    overlay: writer.file("disk.qcow2"),
  });
  // Blocks somewhere in the (unused) upper half of the 2 GiB disk, one run per layer, overlapping the next.
  await run("qemu-io", ["-c", `write -P ${0x10 + n} ${1024 + n}M 3M`, writer.file("disk.qcow2")]);
  await writeMemoryLayer(
    writer.file("memory.layer"),
    SYNTHETIC_RAM,
    Uint32Array.from([3 * n, 7 * n, 100 + n]),
    randomBytes(3 * 4096),
  );
  await writeFile(writer.file("vmstate"), randomBytes(4096));
  await writer.commit(
    {
      template: manifest.template,
      image: manifest.image,
      machine: manifest.machine,
      timings: { bootMs: 0, warmupMs: 0, saveMs: 0 },
      parent: { tag: parent, manifestSha256: await manifestDigest(await store.get(parent)) },
      memory: { format: "layer", ramBytes: SYNTHETIC_RAM, pages: 3 },
      origin: { kind: "branch", mode: "diff", sourceSandbox: null, pauseMs: 1 },
    },
    ["memory.layer", "vmstate", "disk.qcow2"],
  );
}
