/**
 * Per-sandbox memory limits. A sandbox's QEMU process goes into its own cgroup under `forkd/`, with the limit
 * covering QEMU's own memory and the guest pages the child has copied on write (pages it still shares with the
 * snapshot's memory file are charged to whoever first read them). Works on cgroup v2 and, on hybrid hosts
 * where the memory controller is still on v1 (as on our build machines), on the v1 memory hierarchy.
 */
import { access, mkdir, readFile, rmdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { assertSandboxId } from "../common/names.js";

export interface MemoryCgroupRoot {
  version: 1 | 2;
  /** forkd's parent cgroup, e.g. /sys/fs/cgroup/forkd or /sys/fs/cgroup/memory/forkd. */
  dir: string;
}

const V2_ROOT = "/sys/fs/cgroup";
const V1_MEMORY_ROOT = "/sys/fs/cgroup/memory";
/** A cgroup can only be removed once its processes are gone; QEMU's exit takes a moment to be accounted. */
const REMOVE_RETRIES = 50;
const REMOVE_RETRY_MS = 20;

/** Where forkd can create memory cgroups on this host, or null when no memory controller is usable. */
export async function detectMemoryCgroupRoot(): Promise<MemoryCgroupRoot | null> {
  const controllers = await readFile(path.join(V2_ROOT, "cgroup.controllers"), "utf8").catch(() => null);
  if (controllers?.split(/\s+/).includes("memory")) return { version: 2, dir: path.join(V2_ROOT, "forkd") };
  if (await exists(path.join(V1_MEMORY_ROOT, "memory.limit_in_bytes"))) {
    return { version: 1, dir: path.join(V1_MEMORY_ROOT, "forkd") };
  }
  return null;
}

/** Where sandbox `sandboxId`'s cgroup lives under `root` (known before it exists, so it can be recorded first). */
export function sandboxCgroupDir(root: MemoryCgroupRoot, sandboxId: string): string {
  return path.join(root.dir, assertSandboxId(sandboxId));
}

/** Creates the sandbox's cgroup with `limitMiB` and moves `pid` into it. Returns the cgroup's directory. */
export async function limitMemory(
  root: MemoryCgroupRoot,
  sandboxId: string,
  limitMiB: number,
  pid: number,
): Promise<string> {
  assertSandboxId(sandboxId);
  await mkdir(root.dir, { recursive: true });
  if (root.version === 2) {
    // Children of forkd/ only get a memory.max file if forkd/ delegates the controller to them.
    await writeFile(path.join(path.dirname(root.dir), "cgroup.subtree_control"), "+memory").catch(() => {});
    await writeFile(path.join(root.dir, "cgroup.subtree_control"), "+memory");
  }
  const dir = sandboxCgroupDir(root, sandboxId);
  await mkdir(dir, { recursive: true });
  const bytes = String(limitMiB * 1024 * 1024);
  try {
    if (root.version === 2) {
      await writeFile(path.join(dir, "memory.max"), bytes);
      await writeFile(path.join(dir, "memory.swap.max"), "0").catch(() => {});
    } else {
      await writeFile(path.join(dir, "memory.limit_in_bytes"), bytes);
    }
    await writeFile(path.join(dir, "cgroup.procs"), String(pid));
  } catch (err) {
    await rmdir(dir).catch(() => {});
    throw new ForkdError(
      "unavailable",
      `cannot apply a ${limitMiB} MiB memory limit: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  return dir;
}

/** Removes a sandbox cgroup once its processes have exited (a no-op if it is already gone). */
export async function removeCgroup(dir: string): Promise<void> {
  for (let attempt = 0; attempt < REMOVE_RETRIES; attempt++) {
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return;
      if (code !== "EBUSY") throw err;
      await new Promise((r) => setTimeout(r, REMOVE_RETRY_MS));
    }
  }
  throw new ForkdError("internal", `cgroup ${dir} still busy after its sandbox exited`);
}

/** The memory limit currently set on a sandbox cgroup, in bytes (for tests and `forkd doctor`). */
export async function readMemoryLimit(root: MemoryCgroupRoot, dir: string): Promise<number> {
  const file = root.version === 2 ? "memory.max" : "memory.limit_in_bytes";
  return Number((await readFile(path.join(dir, file), "utf8")).trim());
}

async function exists(file: string): Promise<boolean> {
  return access(file).then(
    () => true,
    () => false,
  );
}
