/**
 * Warm pool: sandboxes restored ahead of demand for hot snapshots. Each is a child launched with `-incoming
 * defer` and then restored under the id of the sandbox it will become (device state loaded, the guest running,
 * the restore fix-up done); taking one leaves only a fresh fix-up (the clock, new entropy) to the spawn. Under
 * TCG that hides most of what a child costs (the guest's code translated afresh by its new QEMU) besides QEMU's
 * process start; a pooled guest idles until taken (~1.5 ms/s of host CPU each).
 *
 * Children are taken synchronously (so a burst of spawns never gets the same VM twice) and refilled in the
 * background, one at a time; with cgroups, refills after a take run at the least CPU weight, so they use only
 * CPU the running sandboxes leave. Pooled VMs count as sandboxes for admission (the `admit` callback reserves host
 * memory for each before it starts) and are killed on `drain` (snapshot delete) and `close` (daemon stop).
 * A pooled VM is an ordinary child of the host program until taken: if the program dies, so does it.
 *
 * On a daemon with sandbox cgroups, a pooled VM starts in the cgroups of the sandbox it will become (its id is
 * that sandbox's), under the limits a spawn of its snapshot gets by default, and confined like any sandbox: it
 * never runs unlimited. A spawn that asks for other limits is not served from the pool (it starts cold).
 * Cgroups a crashed daemon left behind are swept at its restart (they hold no process: the VM died with it).
 *
 * On a daemon whose sandboxes get networks of their own (netns mode), a pooled VM of a snapshot with a NIC starts
 * in a network prepared for it (SandboxNetworks.prepare: its namespace, veth and rules under its id, recorded
 * before they are made, egress denied); a spawn with a network of its own takes it and gives it its policy in
 * one nft transaction (SandboxNetworks.claim). A spawn with network "none" is not served by such a pool, nor a
 * spawn with a network by a pool without. A pooled VM's network goes with it (drain, close, a failed start, a VM
 * that died); one a crashed daemon left is removed at its restart (a network record of no sandbox) and by
 * `forkd teardown`.
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import { errorMessage } from "../../common/errors.js";
import { TAG_PATTERN } from "../../common/limits.js";
import { unanchored } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import {
  type CgroupLayout,
  createSandboxCgroups,
  removeCgroups,
  setCpuWeight,
} from "../../isolation/cgroup.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import type { VmHandle } from "../../vmm/launch.js";
import { newSandboxId } from "../machines/ids.js";
import { prepareRestore, type RestorePlan } from "../machines/restore-plan.js";
import { launchChild, type PrestartedChild, Sandbox } from "../machines/sandbox-vm.js";
import type { NicAttachment, SandboxNetworks } from "../networks/sandbox-networks.js";
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
  /** The daemon's sandbox networks: in netns mode, pooled VMs with a NIC get one prepared (absent: none do). */
  networks?: PoolNetworks;
}

/** What the pool uses of the daemon's sandbox networks (and a discarded pooled VM of a spawn). */
export type PoolNetworks = Pick<SandboxNetworks, "mode" | "prepare" | "detach">;

interface PooledChild extends PrestartedChild {
  /** Its limits (JSON): a spawn takes it only if they are the spawn's. */
  limits: string;
  /** Whether it has a network of its own (prepared): it serves only spawns that have one, and they only it. */
  networked: boolean;
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
  /** VMs taken from this pool so far (refills after the first take start at the background CPU weight). */
  taken: number;
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
        taken: 0,
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
    /** Whether the spawn's sandboxes have networks of their own (netns). */
    networked = false,
  ): { plan: RestorePlan; children: PrestartedChild[] } | undefined {
    const pool = this.pools.get(tag);
    if (!pool || pool.closed || pool.ready.length === 0 || !pool.plan) return undefined;
    const plan = settledPlans.get(pool.plan);
    if (!plan) return undefined;
    // Pooled VMs run under their snapshot's default limits; a spawn asking for others starts cold.
    if (pool.ready[0]?.limits !== JSON.stringify(limits)) return undefined;
    if (pool.ready[0]?.networked !== networked) return undefined;
    const taken = pool.ready.splice(0, n);
    pool.taken += taken.length;
    for (const child of taken) child.release();
    this.takenTotal += taken.length;
    clearTimeout(pool.idleTimer);
    pool.idleTimer = setTimeout(() => this.refill(tag), REFILL_IDLE_MS);
    pool.idleTimer.unref();
    return {
      plan,
      children: taken.map(({ id, runDir, vm, cgroups, restored }) => ({ id, runDir, vm, cgroups, restored })),
    };
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
    await Promise.all(ready.map((child) => this.discard(child)));
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

  /** A network of its own for a pooled VM of `plan` (netns mode, a snapshot with a NIC); else none. */
  private async prepareNetwork(id: string, plan: RestorePlan): Promise<NicAttachment | undefined> {
    const { networks } = this.options;
    const nic = plan.snapshot.manifest.machine.nic;
    if (networks?.mode !== "netns" || !nic) return undefined;
    return networks.prepare(id, nic);
  }

  private discard(child: PooledChild): Promise<void> {
    child.release();
    return discardPrestarted(child, this.options.networks);
  }

  /** A ready VM joins its pool (or goes, if the pool closed meanwhile); one that dies later leaves it. */
  private async addReady(tag: string, pool: SnapshotPool, child: PooledChild): Promise<void> {
    if (pool.closed) {
      await this.discard(child);
      return;
    }
    pool.ready.push(child);
    // A pooled VM that dies (killed from outside, out of memory) leaves the pool.
    void child.vm.exited.then(() => {
      const at = pool.ready.indexOf(child);
      if (at < 0) return;
      pool.ready.splice(at, 1);
      void this.discard(child).then(() => this.refill(tag));
    });
  }

  private async startOne(tag: string, pool: SnapshotPool): Promise<void> {
    let reservation: { release(): void } | undefined;
    let cgroups: string[] = [];
    let launched: VmHandle | undefined;
    let networkOf: string | undefined;
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
      // A refill after a take runs beside the sandboxes that took: it gets only CPU they leave (a spawn's take
      // gives its VM the normal weight back). The first fill, before any spawn, runs at the normal weight.
      if (layout && pool.taken > 0) await setCpuWeight(layout, id, "background");
      networkOf = id;
      const nic = await this.prepareNetwork(id, plan);
      const { vm } = await launchChild(plan, {
        runDir,
        deferred: true,
        nic,
        confinement: this.options.confinement,
        cgroups: cgroups.length > 0 ? cgroups : undefined,
        diskLimitBytes: limits.disk_mib === null ? undefined : limits.disk_mib * 2 ** 20,
      });
      launched = vm;
      // Ready means restored: device state loaded, the guest running, the fix-up done under its id. Under TCG
      // that is most of what a child costs (the guest's code translated afresh), now paid before any spawn.
      const restored = await Sandbox.restore(this.paths, plan, {
        prestarted: { id, runDir, vm, cgroups },
        confinement: this.options.confinement,
      });
      const child: PooledChild = {
        id,
        runDir,
        vm,
        cgroups,
        restored,
        limits: JSON.stringify(limits),
        networked: nic !== undefined,
        release: once(() => reservation?.release()),
      };
      await this.addReady(tag, pool, child);
    } catch (err) {
      reservation?.release();
      // A VM that started but never became ready goes, and then its cgroups.
      await launched?.kill({ graceMs: 0 }).catch(() => {});
      await removeCgroups(cgroups).catch(() => {});
      if (networkOf !== undefined) await this.options.networks?.detach(networkOf).catch(() => {});
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

/**
 * Kills a prestarted VM that will not become a sandbox, and removes its run directory, its cgroups and the
 * network prepared for it (a no-op without one).
 */
export async function discardPrestarted(
  child: PrestartedChild,
  networks: Pick<SandboxNetworks, "detach"> | undefined,
): Promise<void> {
  await child.restored?.destroy();
  await child.vm.kill({ graceMs: 0 }).catch(() => {});
  await rm(child.runDir, { recursive: true, force: true });
  await removeCgroups(child.cgroups).catch(() => {});
  await networks?.detach(child.id).catch(() => {});
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
