/**
 * Per-sandbox cgroups: memory (with no swap), CPU bandwidth and a process/thread count limit. A sandbox's
 * cgroups are created and limited before its QEMU starts; the launcher joins them before exec, so QEMU is
 * never unlimited for a moment.
 *
 * Each controller is used from wherever the host has it: a cgroup v1 hierarchy of its own (hybrid hosts such
 * as our build machines: v1 memory, cpu and pids beside an empty v2 mount), or the unified v2 hierarchy. The
 * sandboxes' cgroups live under the daemon's own cgroup in each hierarchy (what it uses is accounted to it,
 * and a supervisor that owns the daemon's cgroup owns them too), in a directory per forkd home:
 *
 *   <mount><daemon's cgroup>/forkd/<home key>/<sandbox id>
 *
 * Memory: the limit covers QEMU's own memory and the guest pages the child has copied on write (pages still
 * shared with the snapshot's memory file are page cache, charged to whoever read them first and reclaimable).
 */
import { access, mkdir, readdir, readFile, rmdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { assertSandboxId, isValidSandboxId } from "../common/names.js";

export type CgroupController = "memory" | "cpu" | "pids";
export const CGROUP_CONTROLLERS: readonly CgroupController[] = ["memory", "cpu", "pids"];

export interface CgroupHierarchy {
  controller: CgroupController;
  version: 1 | 2;
  /** Where this home's sandbox cgroups go in this hierarchy. */
  parent: string;
}

export interface CgroupLayout {
  /** The hierarchy each usable controller is in; a controller the host lacks is absent. */
  hierarchies: Partial<Record<CgroupController, CgroupHierarchy>>;
  /** Why a controller is missing (for `forkd doctor` and error messages). */
  missing: Partial<Record<CgroupController, string>>;
  /** v1 memory: swap is accounted (memory.memsw.*), so "no swap" can be enforced. */
  swapAccounted: boolean;
}

export interface CgroupLimits {
  memoryBytes?: number;
  /** CPU bandwidth: at most `quotaUs` of CPU time per `periodUs` (200000/100000 = two CPUs). */
  cpu?: { quotaUs: number; periodUs: number };
  pids?: number;
}

/** cgroup v2: the leaf the daemon's cgroup's processes move into so that cgroup may pass controllers on. */
const DAEMON_LEAF = "forkd-daemon";

/** The CFS period the CPU quota is expressed in. */
export const CPU_PERIOD_US = 100_000;

/** A cgroup can only be removed once its processes are gone; QEMU's exit takes a moment to be accounted. */
const REMOVE_RETRIES = 100;
const REMOVE_RETRY_MS = 20;

interface Mount {
  point: string;
  /** The hierarchy path mounted there (a container's mount shows a subtree). */
  root: string;
  version: 1 | 2;
  /** v1: the controllers bound to this hierarchy. */
  controllers: string[];
}

/** The cgroup mounts in /proc/self/mountinfo (exported for tests). */
export function parseCgroupMounts(mountinfo: string): Mount[] {
  const mounts: Mount[] = [];
  for (const line of mountinfo.split("\n")) {
    const [left, right] = line.split(" - ");
    if (!left || !right) continue;
    const fields = left.split(" ");
    const [fstype, , superOptions] = right.split(" ");
    const root = unescapeMountPath(fields[3] ?? "");
    const point = unescapeMountPath(fields[4] ?? "");
    if (fstype === "cgroup2") mounts.push({ point, root, version: 2, controllers: [] });
    else if (fstype === "cgroup") {
      const controllers = (superOptions ?? "")
        .split(",")
        .filter((o) => !o.includes("=") && o !== "rw" && o !== "ro");
      mounts.push({ point, root, version: 1, controllers });
    }
  }
  return mounts;
}

/** /proc/self/cgroup: hierarchy controllers ("" for v2) -> this process's cgroup path (exported for tests). */
export function parseProcCgroup(text: string): Map<string, string> {
  const own = new Map<string, string>();
  for (const line of text.split("\n")) {
    const match = /^\d+:([^:]*):(.*)$/.exec(line);
    if (match) own.set(match[1] as string, match[2] as string);
  }
  return own;
}

function unescapeMountPath(value: string): string {
  return value.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/** The directory of this process's own cgroup in the hierarchy mounted at `mount`. */
function ownDir(mount: Mount, ownPath: string | undefined): string | null {
  if (ownPath === undefined) return null;
  const root = mount.root === "/" ? "" : mount.root;
  if (root !== "" && ownPath !== root && !ownPath.startsWith(`${root}/`)) return null;
  return path.join(mount.point, ownPath.slice(root.length));
}

/**
 * Where each controller is on this host, for the home keyed `homeKey`. Reads only; `prepareCgroupParents`
 * creates the directories.
 */
export async function detectCgroupLayout(homeKey: string, proc = "/proc/self"): Promise<CgroupLayout> {
  if (!/^[0-9a-f]{8,64}$/.test(homeKey)) throw new ForkdError("internal", `bad cgroup home key ${homeKey}`);
  const mounts = parseCgroupMounts(await readFile(`${proc}/mountinfo`, "utf8").catch(() => ""));
  const own = parseProcCgroup(await readFile(`${proc}/cgroup`, "utf8").catch(() => ""));
  const layout: CgroupLayout = { hierarchies: {}, missing: {}, swapAccounted: false };
  const unified = mounts.find((m) => m.version === 2);
  const unifiedOwn = daemonCgroupOf(unified ? ownDir(unified, own.get("")) : null);
  const unifiedControllers = unifiedOwn
    ? (await readFile(path.join(unifiedOwn, "cgroup.controllers"), "utf8").catch(() => "")).split(/\s+/)
    : [];
  for (const controller of CGROUP_CONTROLLERS) {
    const v1 = mounts.find((m) => m.version === 1 && m.controllers.includes(controller));
    if (v1) {
      const key = [...own.keys()].find((k) => k.split(",").includes(controller));
      const dir = ownDir(v1, key === undefined ? undefined : own.get(key));
      if (dir) {
        layout.hierarchies[controller] = { controller, version: 1, parent: path.join(dir, "forkd", homeKey) };
        if (controller === "memory") {
          layout.swapAccounted = await exists(path.join(v1.point, "memory.memsw.limit_in_bytes"));
        }
        continue;
      }
    }
    if (unifiedOwn && unifiedControllers.includes(controller)) {
      layout.hierarchies[controller] = {
        controller,
        version: 2,
        parent: path.join(unifiedOwn, "forkd", homeKey),
      };
      if (controller === "memory") layout.swapAccounted = true;
      continue;
    }
    layout.missing[controller] = v1
      ? `the ${controller} hierarchy does not show this process's cgroup`
      : unifiedOwn
        ? `cgroup v2 does not delegate ${controller} to this process's cgroup (${path.join(unifiedOwn, "cgroup.controllers")} lacks it: enable it in the parent's cgroup.subtree_control, or run the daemon as a systemd service with Delegate=yes)`
        : `no cgroup hierarchy has the ${controller} controller`;
  }
  return layout;
}

/**
 * The cgroup a v2 daemon delegates from: its own, or the one above when it already sits in the
 * `forkd-daemon` leaf `prepareCgroupParents` moved it (or the process that started it) into. Without this
 * every later start would nest another leaf, and processes started from a moved one would look for the
 * sandboxes' cgroups one level too deep.
 */
function daemonCgroupOf(dir: string | null): string | null {
  return dir !== null && path.basename(dir) === DAEMON_LEAF ? path.dirname(dir) : dir;
}

/** The directories sandbox `id`'s cgroups have in `layout` (one per distinct hierarchy), before they exist. */
export function sandboxCgroupDirs(layout: CgroupLayout, sandboxId: string): string[] {
  assertSandboxId(sandboxId);
  const dirs = new Set<string>();
  for (const h of Object.values(layout.hierarchies)) dirs.add(path.join(h.parent, sandboxId));
  return [...dirs];
}

/**
 * Creates this home's parent cgroups (idempotent). On v2 the controllers are enabled down the path; a daemon
 * cgroup that holds processes cannot pass controllers on (cgroup v2's no-internal-process rule), so the daemon
 * then moves itself into a leaf `forkd-daemon` beside the sandboxes first (the delegation pattern systemd
 * documents for a service with Delegate=yes).
 */
export async function prepareCgroupParents(layout: CgroupLayout): Promise<void> {
  for (const h of Object.values(layout.hierarchies)) {
    await mkdir(h.parent, { recursive: true });
  }
  const v2 = Object.values(layout.hierarchies).filter((h) => h.version === 2);
  if (v2.length === 0) return;
  const controllers = v2.map((h) => `+${h.controller}`).join(" ");
  const home = (v2[0] as CgroupHierarchy).parent;
  const forkdDir = path.dirname(home);
  const daemonCgroup = path.dirname(forkdDir);
  try {
    await writeFile(path.join(daemonCgroup, "cgroup.subtree_control"), controllers);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EBUSY") throw err;
    const leaf = path.join(daemonCgroup, DAEMON_LEAF);
    await mkdir(leaf, { recursive: true });
    for (const pid of (await readFile(path.join(daemonCgroup, "cgroup.procs"), "utf8")).split("\n")) {
      if (pid) await writeFile(path.join(leaf, "cgroup.procs"), pid).catch(() => {});
    }
    await writeFile(path.join(daemonCgroup, "cgroup.subtree_control"), controllers);
  }
  await writeFile(path.join(forkdDir, "cgroup.subtree_control"), controllers);
  await writeFile(path.join(home, "cgroup.subtree_control"), controllers);
}

/**
 * Creates sandbox `id`'s cgroups with `limits` (each limit needs its controller in `layout`: the caller checks
 * what the host can enforce). Returns the directories for the launcher to join. On failure nothing is left.
 */
export async function createSandboxCgroups(
  layout: CgroupLayout,
  sandboxId: string,
  limits: CgroupLimits,
): Promise<string[]> {
  const dirs = sandboxCgroupDirs(layout, sandboxId);
  try {
    for (const dir of dirs) await mkdir(dir);
    const { memory, cpu, pids } = layout.hierarchies;
    if (limits.memoryBytes !== undefined && memory)
      await limitMemory(memory, sandboxId, limits.memoryBytes, layout);
    if (limits.cpu !== undefined && cpu) await limitCpu(cpu, sandboxId, limits.cpu);
    if (limits.pids !== undefined && pids) await limitPids(pids, sandboxId, limits.pids);
  } catch (err) {
    await removeCgroups(dirs).catch(() => {});
    throw new ForkdError(
      "unavailable",
      `cannot set up the cgroups of ${sandboxId}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  return dirs;
}

async function limitMemory(
  h: CgroupHierarchy,
  id: string,
  bytes: number,
  layout: CgroupLayout,
): Promise<void> {
  const dir = path.join(h.parent, id);
  if (h.version === 2) {
    await writeFile(path.join(dir, "memory.max"), String(bytes));
    // No swap: a guest over its limit is OOM-killed instead of pushing the host into swapping.
    await writeFile(path.join(dir, "memory.swap.max"), "0").catch(() => {});
    return;
  }
  await writeFile(path.join(dir, "memory.limit_in_bytes"), String(bytes));
  // memory+swap equal to memory: nothing of it can go to swap.
  if (layout.swapAccounted) await writeFile(path.join(dir, "memory.memsw.limit_in_bytes"), String(bytes));
  await writeFile(path.join(dir, "memory.swappiness"), "0").catch(() => {});
}

async function limitCpu(
  h: CgroupHierarchy,
  id: string,
  cpu: NonNullable<CgroupLimits["cpu"]>,
): Promise<void> {
  const dir = path.join(h.parent, id);
  if (h.version === 2) {
    await writeFile(path.join(dir, "cpu.max"), `${cpu.quotaUs} ${cpu.periodUs}`);
    return;
  }
  await writeFile(path.join(dir, "cpu.cfs_period_us"), String(cpu.periodUs));
  await writeFile(path.join(dir, "cpu.cfs_quota_us"), String(cpu.quotaUs));
}

async function limitPids(h: CgroupHierarchy, id: string, pids: number): Promise<void> {
  await writeFile(path.join(h.parent, id, "pids.max"), String(pids));
}

/** Removes cgroups once their processes have exited (missing ones are fine). */
export async function removeCgroups(dirs: readonly string[]): Promise<void> {
  for (const dir of dirs) {
    for (let attempt = 0; ; attempt++) {
      try {
        await rmdir(dir);
        break;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === "ENOENT") break;
        if (code !== "EBUSY" || attempt >= REMOVE_RETRIES) {
          throw new ForkdError("internal", `cannot remove cgroup ${dir}: ${code ?? String(err)}`);
        }
        await new Promise((r) => setTimeout(r, REMOVE_RETRY_MS));
      }
    }
  }
}

/**
 * Cgroups of this home that no sandbox in `keep` owns and that hold no process (a daemon that died between
 * creating them and recording their removal): removed. Non-empty ones are left and returned.
 */
export async function sweepCgroups(layout: CgroupLayout, keep: ReadonlySet<string>): Promise<string[]> {
  const busy: string[] = [];
  for (const h of Object.values(layout.hierarchies)) {
    for (const name of await readdir(h.parent).catch(() => [] as string[])) {
      if (keep.has(name) || !isValidSandboxId(name)) continue;
      const dir = path.join(h.parent, name);
      const procs = await readFile(path.join(dir, "cgroup.procs"), "utf8").catch(() => "");
      if (procs.trim() !== "") {
        busy.push(dir);
        continue;
      }
      await removeCgroups([dir]).catch(() => busy.push(dir));
    }
  }
  return busy;
}

/** The CPU weight of a sandbox cgroup: the kernel's default, or the least (it runs only on CPU nothing else wants). */
export type CpuWeight = "normal" | "background";

/**
 * Sets sandbox `id`'s CPU weight (v1 `cpu.shares` 1024 or 2, v2 `cpu.weight` 100 or 1); nothing without a cpu
 * controller. The warm pool refills in the background: its VMs must not take CPU from the sandboxes running.
 */
export async function setCpuWeight(
  layout: CgroupLayout,
  sandboxId: string,
  weight: CpuWeight,
): Promise<void> {
  const cpu = layout.hierarchies.cpu;
  if (!cpu) return;
  const dir = path.join(cpu.parent, assertSandboxId(sandboxId));
  if (cpu.version === 2) await writeFile(path.join(dir, "cpu.weight"), weight === "normal" ? "100" : "1");
  else await writeFile(path.join(dir, "cpu.shares"), weight === "normal" ? "1024" : "2");
}

/** How often the OOM killer killed a process of sandbox `id` at its memory limit (0 without a memory cgroup). */
export async function readOomKills(layout: CgroupLayout, sandboxId: string): Promise<number> {
  const memory = layout.hierarchies.memory;
  if (!memory) return 0;
  const file = memory.version === 2 ? "memory.events" : "memory.oom_control";
  const text = await readFile(path.join(memory.parent, sandboxId, file), "utf8");
  return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
}

/** What a sandbox cgroup enforces, read back from the kernel's files (for tests and `forkd doctor`). */
export async function readCgroupLimits(layout: CgroupLayout, sandboxId: string): Promise<CgroupLimits> {
  const read = async (h: CgroupHierarchy | undefined, file: string) =>
    h ? (await readFile(path.join(h.parent, sandboxId, file), "utf8")).trim() : undefined;
  const { memory, cpu, pids } = layout.hierarchies;
  const limits: CgroupLimits = {};
  const mem = await read(memory, memory?.version === 2 ? "memory.max" : "memory.limit_in_bytes");
  if (mem !== undefined && mem !== "max") limits.memoryBytes = Number(mem);
  if (cpu?.version === 2) {
    const [quota, period] = ((await read(cpu, "cpu.max")) ?? "").split(" ");
    if (quota && quota !== "max") limits.cpu = { quotaUs: Number(quota), periodUs: Number(period) };
  } else if (cpu) {
    const quota = Number(await read(cpu, "cpu.cfs_quota_us"));
    if (quota > 0) limits.cpu = { quotaUs: quota, periodUs: Number(await read(cpu, "cpu.cfs_period_us")) };
  }
  const max = await read(pids, "pids.max");
  if (max !== undefined && max !== "max") limits.pids = Number(max);
  return limits;
}

async function exists(file: string): Promise<boolean> {
  return access(file).then(
    () => true,
    () => false,
  );
}
