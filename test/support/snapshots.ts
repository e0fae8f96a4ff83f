/**
 * A warm snapshot per template, created once per machine and shared by test files: each test home gets hard
 * links to the shared files (same inodes, so the page cache is shared too), which saves a ~1 minute TCG boot
 * per test file. Keyed by the image hash and the boot parameters, so a change to either makes a new one.
 */
import { createHash } from "node:crypto";
import { link, mkdir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../../src/common/errors.js";
import { type HomeLock, lockHome } from "../../src/common/home-lock.js";
import { resolvePaths } from "../../src/common/paths.js";
import { guestRuntimeCmdline } from "../../src/controller/machines/boot.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { buildImage, loadTemplate } from "../../src/image/index.js";
import { MANIFEST_FORMAT } from "../../src/store/manifest.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { DEFAULT_TCG_CPU_MODEL } from "../../src/vmm/cpu-model.js";
import { restoreCompatibilityKey } from "../../src/vmm/qemu-args.js";

/** Changes whenever the machine children are started with changes (so stale shared snapshots are not reused). */
const MACHINE_FINGERPRINT = restoreCompatibilityKey({
  accel: "tcg",
  cpuModel: DEFAULT_TCG_CPU_MODEL,
  memoryMiB: 512,
  vcpus: 1,
  kernel: "/k",
  initrd: "/i",
  kernelCmdline: "x",
  memoryFile: { path: "/m", shared: false },
  disk: { overlayPath: "/d" },
  agent: { socketPath: "/a" },
  qmpSocketPath: "/q",
  consoleSocketPath: "/c",
  nic: { mac: "02:fd:00:00:00:02", vnetHdr: true, backend: "tap" },
});

const SHARED_ROOT = process.env.FORKD_TEST_SNAPSHOTS ?? "/var/tmp/forkd-test-snapshots";

/** Puts a ready snapshot of `template` at `<home>/snapshots/<tag>` and returns the tag. */
export async function linkSharedSnapshot(
  homeDir: string,
  template: string,
  tag = `shared-${template}`,
): Promise<string> {
  const image = await buildImage(await loadTemplate(template), {});
  const key = createHash("sha256")
    .update(
      JSON.stringify([image.hash, guestRuntimeCmdline("tcg"), MANIFEST_FORMAT, MACHINE_FINGERPRINT, tag]),
    )
    .digest("hex")
    .slice(0, 16);
  const sharedHome = path.join(SHARED_ROOT, key);
  const sharedPaths = resolvePaths({ FORKD_HOME: sharedHome });
  const store = new SnapshotStore(sharedPaths.snapshots);
  if (!(await store.exists(tag))) {
    // Test runs of several checkouts share this directory: one creates the snapshot, the others wait for it.
    const lock = await waitForLock(sharedHome);
    try {
      if (!(await store.exists(tag))) {
        await rm(sharedHome, { recursive: true, force: true });
        await createSnapshot(sharedPaths, { tag, template });
      }
    } finally {
      await lock.release();
    }
  }
  const source = store.dirOf(tag);
  const target = path.join(homeDir, "snapshots", tag);
  await mkdir(target, { recursive: true, mode: 0o700 });
  for (const name of await readdir(source)) await link(path.join(source, name), path.join(target, name));
  return tag;
}

/** The shared home's lock (the daemon's own home lock), waiting while another test process holds it. */
async function waitForLock(home: string): Promise<HomeLock> {
  for (;;) {
    try {
      return await lockHome(home);
    } catch (err) {
      if (!(err instanceof ForkdError) || err.code !== "conflict") throw err;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}
