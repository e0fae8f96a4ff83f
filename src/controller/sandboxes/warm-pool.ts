/**
 * Warm pool: QEMU processes started ahead of demand for hot snapshots. Each is a child launched with
 * `-incoming defer` (process started, devices realised, agent chardev connected, device-state file open) that
 * waits for a spawn; taking one leaves only the device-state load, the guest's resume and the restore fix-up
 * to the spawn. Under KVM and TCG alike this hides QEMU's process start (~20-25 ms of CPU and 100-200 ms of
 * wall time per child on a loaded 2-core host) from a spawn.
 *
 * Children are taken synchronously (so a burst of spawns never gets the same VM twice) and refilled in the
 * background, one at a time. Pooled VMs count as sandboxes for admission (the `admit` callback reserves host
 * memory for each before it starts) and are killed on `drain` (snapshot delete) and `close` (daemon stop).
 * A pooled VM is an ordinary child of the host program until taken: if the program dies, so does it.
 *
 * On a daemon with sandbox cgroups, a pooled VM starts in the cgroups of the sandbox it will become (its id is
 * that sandbox's), under the limits a spawn of its snapshot gets by default, and confined like any sandbox: it
 * never runs unlimited. A spawn that asks for other limits is not served from the pool (it starts cold).
 * Cgroups a crashed daemon left behind are swept at its restart (they hold no process: the VM died with it).
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import { errorMessage } from "../../common/errors.js";
import { TAG_PATTERN } from "../../common/limits.js";
import { unanchored } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { type CgroupLayout, createSandboxCgroups, removeCgroups } from "../../isolation/cgroup.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import type { VmHandle } from "../../vmm/launch.js";
import { newSandboxId } from "../machines/ids.js";
import { prepareRestore, type RestorePlan } from "../machines/restore-plan.js";
import { launchChild, type PrestartedChild } from "../machines/sandbox-vm.js";
import { cgroupLimits, NO_LIMITS, type SandboxLimits } from "./limits.js";

/** Upper bound of one snapshot's pool: each VM holds QEMU's own memory (~10-15 MiB before it runs). */
export const MAX_WARM_POOL_SIZE = 256;

/**
 * After a take, refilling waits until no take came for this long: a burst that empties the pool should not
 * compete for CPU with the QEMUs started to replace what it took.
 */
export const REFILL_IDLE_MS = 500;

/** A pooled VM that cannot start is retried after this long (a missing snapshot, a host out of memory). */
export const REFILL_RETRY_MS = 5_000;

export interface WarmPoolTarget {
  tag: string;
  size: number;
}

export interface WarmPoolOptions {
  /** Reserves room for one more pooled VM or throws (admission); released when the VM leaves the pool. */
  admit?: () => { release(): void };
  log?: { warn(obj: object, msg?: string): void };
  /** How pooled QEMUs are launched: the daemon's confinement. */
  confinement?: ConfinementConfig;
  /** Where sandbox cgroups go (null or absent: pooled VMs get none, like the daemon's sandboxes). */
  cgroups?: CgroupLayout | null;
  /** The limits a spawn of `snapshot` gets when it asks for none: what pooled VMs start under. */
  defaultLimits?: (snapshot: StoredSnapshot) => SandboxLimits;
}

interface PooledChild extends PrestartedChild {
  /** Its limits (JSON): a spawn takes it only if they are the spawn's. */
  limits: string;
  release(): void;
}

interface SnapshotPool {
  size: number;
  plan: Promise<RestorePlan> | undefined;
  ready: PooledChild[];
  starting: number;
  /** Ends the wait after a failed start early (drain). */
  wake: (() => void) | undefined;
  idleTimer: NodeJS.Timeout | undefined;
  /** Set by drain: no more refills; the plan is disposed once nothing still starts. */
  closed: boolean;
}

export interface WarmPoolStats {
  tag: string;
  size: number;
  ready: number;
  starting: number;
}

/** Parses `TAG:N` (the daemon's `--warm-pool`). */
export function parseWarmPoolTarget(text: string): WarmPoolTarget {
  const match = new RegExp(`^(${unanchored(TAG_PATTERN)}):(\\d{1,4})$`).exec(text);
  const size = Number(match?.[2]);
  if (!match || size < 1 || size > MAX_WARM_POOL_SIZE) {
    throw new Error(`a warm pool is TAG:N with N in 1..${MAX_WARM_POOL_SIZE}, got ${JSON.stringify(text)}`);
  }
  return { tag: match[1] as string, size };
}

export class WarmPool {
  private readonly pools = new Map<string, SnapshotPool>();
  private closing = false;
  private takenTotal = 0;

  constructor(
    private readonly paths: ForkdPaths,
    private readonly options: WarmPoolOptions = {},
  ) {}

  /** Keeps `size` VMs of `tag` ready from now on (starting them in the background). */
  warm(tag: string, size: number): void {
    if (!Number.isInteger(size) || size < 1 || size > MAX_WARM_POOL_SIZE) {
      throw new Error(`warm pool size must be an integer in 1..${MAX_WARM_POOL_SIZE}`);
    }
    if (this.closing) return;
    const existing = this.pools.get(tag);
    if (existing && !existing.closed) {
      existing.size = size;
    } else {
      this.pools.set(tag, {
        size,
        plan: undefined,
        ready: [],
        starting: 0,
        wake: undefined,
        idleTimer: undefined,
        closed: false,
      });
    }
    this.refill(tag);
  }

  /** Tags with a pool. */
  tags(): string[] {
    return [...this.pools.keys()];
  }

  /** Pooled VMs alive now (ready or starting): they count as sandboxes for admission. */
  count(): number {
    let n = 0;
    for (const pool of this.pools.values()) n += pool.ready.length + pool.starting;
    return n;
  }

  /** VMs handed out by `take` since this pool was made. */
  taken(): number {
    return this.takenTotal;
  }

  /** Pids of the ready VMs (benchmarks read their CPU time). */
  pids(): number[] {
    return [...this.pools.values()].flatMap((p) => p.ready.map((c) => c.vm.pid));
  }

  stats(): WarmPoolStats[] {
    return [...this.pools.entries()].map(([tag, p]) => ({
      tag,
      size: p.size,
      ready: p.ready.length,
      starting: p.starting,
    }));
  }

  /**
   * Up to `n` ready VMs of `tag` with the plan they were started on (the caller restores them with it), or
   * none. Synchronous, so concurrent spawns never share a VM. Triggers a refill.
   */
  take(
    tag: string,
    n: number,
    limits: SandboxLimits,
  ): { plan: RestorePlan; children: PrestartedChild[] } | undefined {
    const pool = this.pools.get(tag);
    if (!pool || pool.closed || pool.ready.length === 0 || !pool.plan) return undefined;
    const plan = settledPlans.get(pool.plan);
    if (!plan) return undefined;
    // Pooled VMs run under their snapshot's default limits; a spawn asking for others starts cold.
    if (pool.ready[0]?.limits !== JSON.stringify(limits)) return undefined;
    const taken = pool.ready.splice(0, n);
    for (const child of taken) child.release();
    this.takenTotal += taken.length;
    clearTimeout(pool.idleTimer);
    pool.idleTimer = setTimeout(() => this.refill(tag), REFILL_IDLE_MS);
    pool.idleTimer.unref();
    return { plan, children: taken.map(({ id, runDir, vm, cgroups }) => ({ id, runDir, vm, cgroups })) };
  }

  /** Resolves once `tag`'s pool holds `size` ready VMs (benchmarks, tests); rejects after `timeoutMs`. */
  async waitFull(tag: string, timeoutMs = 120_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const pool = this.pools.get(tag);
      if (!pool || pool.closed) throw new Error(`no warm pool for ${tag}`);
      if (pool.ready.length >= pool.size) return;
      if (Date.now() > deadline) throw new Error(`warm pool ${tag}: ${pool.ready.length}/${pool.size} ready`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /**
   * Kills every pooled VM of `tag` and of every snapshot whose chain contains it, and stops refilling them.
   * Resolves with a function that warms the drained pools again (a delete that was refused).
   */
  async drain(tag: string): Promise<() => void> {
    const drained: Promise<void>[] = [];
    const targets: WarmPoolTarget[] = [];
    for (const [poolTag, pool] of this.pools) {
      const plan = pool.plan ? settledPlans.get(pool.plan) : undefined;
      const inChain = plan?.chain.some((s) => s.tag === tag) ?? false;
      if (poolTag !== tag && !inChain) continue;
      targets.push({ tag: poolTag, size: pool.size });
      drained.push(this.drainPool(poolTag, pool));
    }
    await Promise.all(drained);
    return () => {
      for (const target of targets) this.warm(target.tag, target.size);
    };
  }

  /** Drains every pool (daemon stop). */
  async close(): Promise<void> {
    this.closing = true;
    await Promise.all([...this.pools.entries()].map(([tag, pool]) => this.drainPool(tag, pool)));
  }

  private async drainPool(tag: string, pool: SnapshotPool): Promise<void> {
    pool.closed = true;
    if (this.pools.get(tag) === pool) this.pools.delete(tag);
    pool.wake?.();
    clearTimeout(pool.idleTimer);
    const ready = pool.ready.splice(0);
    await Promise.all(ready.map((child) => discard(child)));
    // VMs still starting are discarded by their refill once it sees `closed`; the plan goes with the last.
    if (pool.starting === 0) await disposePlan(pool);
  }

  private refill(tag: string): void {
    const pool = this.pools.get(tag);
    if (pool) clearTimeout(pool.idleTimer);
    if (!pool || pool.closed || pool.starting > 0 || pool.ready.length >= pool.size) return;
    pool.starting++;
    void this.startOne(tag, pool).finally(async () => {
      pool.starting--;
      if (pool.closed) {
        if (pool.starting === 0) await disposePlan(pool);
        return;
      }
      this.refill(tag);
    });
  }

  /** The limits pooled VMs of `plan` start under (none without cgroups). */
  private limitsOf(plan: RestorePlan): SandboxLimits {
    return this.options.defaultLimits?.(plan.snapshot) ?? { ...NO_LIMITS };
  }

  private async startOne(tag: string, pool: SnapshotPool): Promise<void> {
    let reservation: { release(): void } | undefined;
    let cgroups: string[] = [];
    let launched: VmHandle | undefined;
    try {
      reservation = this.options.admit?.();
      pool.plan ??= trackPlan(prepareRestore(this.paths, tag));
      const plan = await pool.plan;
      const id = newSandboxId();
      const runDir = path.join(this.paths.run, id);
      // A plan with pages to write before its device state (a paused sandbox's layers) is never pooled.
      if (plan.pageLayers.length > 0) {
        reservation?.release();
        return;
      }
      const limits = this.limitsOf(plan);
      const { cgroups: layout } = this.options;
      // Made before QEMU starts, as for a cold spawn: the launcher joins them before it execs QEMU.
      cgroups = layout ? await createSandboxCgroups(layout, id, cgroupLimits(limits)) : [];
      const { vm } = await launchChild(plan, {
        runDir,
        deferred: true,
        confinement: this.options.confinement,
        cgroups: cgroups.length > 0 ? cgroups : undefined,
        diskLimitBytes: limits.disk_mib === null ? undefined : limits.disk_mib * 2 ** 20,
      });
      launched = vm;
      // Ready means QEMU is up: its agent chardev connected and QMP answering.
      await vm.agentConnection;
      await vm.qmp();
      const child: PooledChild = {
        id,
        runDir,
        vm,
        cgroups,
        limits: JSON.stringify(limits),
        release: once(() => reservation?.release()),
      };
      if (pool.closed) {
        await discard(child);
        return;
      }
      pool.ready.push(child);
      // A pooled VM that dies (killed from outside, out of memory) leaves the pool.
      void vm.exited.then(() => {
        const at = pool.ready.indexOf(child);
        if (at < 0) return;
        pool.ready.splice(at, 1);
        void discard(child).then(() => this.refill(tag));
      });
    } catch (err) {
      reservation?.release();
      // A VM that started but never became ready goes, and then its cgroups.
      await launched?.kill({ graceMs: 0 }).catch(() => {});
      await removeCgroups(cgroups).catch(() => {});
      if (pool.plan && !settledPlans.has(pool.plan)) pool.plan = undefined;
      this.options.log?.warn({ tag, err: errorMessage(err) }, "warm pool: could not start a VM");
      if (!pool.closed) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, REFILL_RETRY_MS);
          timer.unref();
          pool.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        pool.wake = undefined;
      }
    }
  }
}

/** Plans that resolved, so `take` can hand one out synchronously. */
const settledPlans = new WeakMap<Promise<RestorePlan>, RestorePlan>();

function trackPlan(plan: Promise<RestorePlan>): Promise<RestorePlan> {
  void plan.then(
    (p) => settledPlans.set(plan, p),
    () => {},
  );
  return plan;
}

async function disposePlan(pool: SnapshotPool): Promise<void> {
  const plan = pool.plan;
  pool.plan = undefined;
  await plan?.then((p) => p.dispose()).catch(() => {});
}

/** Kills a prestarted VM that was taken but will not become a sandbox, and removes its run directory. */
export async function discardPrestarted(child: PrestartedChild): Promise<void> {
  await child.vm.kill({ graceMs: 0 }).catch(() => {});
  await rm(child.runDir, { recursive: true, force: true });
  await removeCgroups(child.cgroups).catch(() => {});
}

async function discard(child: PooledChild): Promise<void> {
  child.release();
  await discardPrestarted(child);
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
