/**
 * Starting the children of a resolved spawn (spawn-request.ts): their records first, then the restore plan,
 * their networks, their QEMUs (in their cgroups, or taken prestarted from the warm pool), and the commit of the
 * ones that answered. A failed spawn leaves nothing behind: all-or-nothing destroys what started and forgets
 * every record, "each" forgets a failed child at once.
 */

import { crashPoint } from "../../common/crash-points.js";
import { errorMessage, ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import {
  type CgroupLayout,
  createSandboxCgroups,
  removeCgroups,
  setCpuWeight,
} from "../../isolation/cgroup.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import { processStartTime } from "../host/processes.js";
import { prepareRestore, type RestorePlan } from "../machines/restore-plan.js";
import { type PrestartedChild, Sandbox } from "../machines/sandbox-vm.js";
import type { NicAttachment, SandboxNetworks } from "../networks/sandbox-networks.js";
import type { ForkChild, SandboxInfo } from "../sandbox-service.js";
import { DEFAULT_FORK_CONCURRENCY } from "./fork-children.js";
import { cgroupDirsOf, cgroupLimits } from "./limits.js";
import type { ResolvedSpawn } from "./spawn-request.js";
import { discardPrestarted } from "./warm-pool.js";

/** Children restored at once within one spawn request (see DEFAULT_FORK_CONCURRENCY for why one per core). */
export const SPAWN_CONCURRENCY = DEFAULT_FORK_CONCURRENCY;
/** Sandbox networks created at once within one spawn request. */
export const NETWORK_SETUP_CONCURRENCY = 8;

/**
 * "all-or-nothing": the first failure destroys the others and is thrown. "each": every child succeeds or fails
 * on its own (a failed one leaves nothing behind).
 */
export type SpawnPolicy = "all-or-nothing" | "each";

/** What starting children uses of the daemon. */
export interface SpawnContext {
  paths: ForkdPaths;
  db: StateDb;
  networks: Pick<SandboxNetworks, "attach" | "claim" | "detach">;
  /** Where sandbox cgroups go (null: none). */
  cgroups: CgroupLayout | null;
  confinement: ConfinementConfig;
  consoleLogBytes: number;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
  /** Takes a child that runs into the daemon's care (its calls served, its exit watched). */
  adopt(sandbox: Sandbox): void;
  /** A sandbox's record as the service returns it. */
  info(row: SandboxRow): SandboxInfo;
}

/** Prestarted VMs taken from the warm pool for a spawn, and the plan they were started from. */
export interface PooledChildren {
  plan: RestorePlan;
  children: PrestartedChild[];
}

/** One spawn under way. */
interface SpawnRun {
  spawn: ResolvedSpawn;
  rows: readonly SandboxRow[];
  policy: SpawnPolicy;
  /** Pooled VMs no child has taken yet, by the id of the child that will: what is left is discarded. */
  prestarted: Map<string, PrestartedChild>;
  pooledPlan: RestorePlan | undefined;
  started: Sandbox[];
  /** Every restore failure, in order (all-or-nothing throws the first). */
  failures: unknown[];
  failed: Map<string, ForkdError>;
}

/**
 * Records `rows` (each "starting"), then starts them under `policy`: one entry per row, in order, its sandbox
 * or its error. Releases the spawn's reservations and disposes of its plan and unused pooled VMs either way.
 */
export async function startChildren(
  ctx: SpawnContext,
  spawn: ResolvedSpawn,
  rows: readonly SandboxRow[],
  options: { policy: SpawnPolicy; pooled?: PooledChildren; transientFor?: string },
): Promise<ForkChild[]> {
  const run: SpawnRun = {
    spawn,
    rows,
    policy: options.policy,
    prestarted: new Map((options.pooled?.children ?? []).map((child) => [child.id, child])),
    pooledPlan: options.pooled?.plan,
    started: [],
    failures: [],
    failed: new Map(),
  };
  let plan: RestorePlan | undefined;
  try {
    // Recorded before any QEMU starts: if the daemon dies mid-spawn, the restart finds and kills them. Inside
    // the try: a record that cannot be written still gives back the reservations and the pooled VMs.
    for (const row of rows) {
      ctx.db.insertSandbox(row);
      if (options.transientFor !== undefined) ctx.db.markTransientSandbox(row.id, options.transientFor);
    }
    crashPoint("spawn.recorded");
    plan = await prepareRestore(ctx.paths, spawn.snapshot, { inMemory: spawn.liveFork });
    const layerTags = JSON.stringify(plan.chain.map((s) => s.tag));
    for (const row of rows) {
      row.layer_tags = layerTags;
      ctx.db.updateSandbox(row.id, { layer_tags: layerTags });
    }
    crashPoint("spawn.planned");
    const nics = await attachNetworks(ctx, run);
    await restoreChildren(ctx, run, plan, nics);
    return finishSpawn(ctx, run);
  } catch (err) {
    // All or nothing: a spawn that could not start every child starts none.
    await Promise.all(run.started.map((s) => s.destroy()));
    for (const row of rows) await forget(ctx, row);
    throw err;
  } finally {
    spawn.release();
    // Pooled VMs a failed spawn never got to: they have no sandbox to become.
    await Promise.all([...run.prestarted.values()].map((c) => discardPrestarted(c, ctx.networks)));
    await plan?.dispose();
  }
}

/**
 * Networks first, more at once than restores: creating one is mostly waiting on the kernel (namespace and
 * device setup), not CPU, so overlapping them hides that latency. A pooled VM's network was prepared with it:
 * it only gets the spawn's policy (one nft transaction). Every setup is waited for, failed or not, so the
 * cleanup never races one still creating; the first failure is thrown, whatever the policy.
 */
async function attachNetworks(
  ctx: SpawnContext,
  run: SpawnRun,
): Promise<Map<string, NicAttachment | undefined>> {
  const { spawn, rows } = run;
  const nics = new Map<string, NicAttachment | undefined>();
  const failures: unknown[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(NETWORK_SETUP_CONCURRENCY, rows.length) }, async () => {
      while (next < rows.length && failures.length === 0) {
        const row = rows[next++] as SandboxRow;
        try {
          if (!run.prestarted.has(row.id)) {
            nics.set(row.id, await ctx.networks.attach(row.id, spawn.network, spawn.snapshotNic));
          } else if (spawn.network !== "none" && spawn.snapshotNic) {
            await ctx.networks.claim(row.id, spawn.network);
          }
        } catch (err) {
          failures.push(err);
        }
      }
    }),
  );
  if (failures.length > 0) throw failures[0];
  return nics;
}

/** Restores the rows, SPAWN_CONCURRENCY at once; an all-or-nothing spawn starts no more after a failure. */
async function restoreChildren(
  ctx: SpawnContext,
  run: SpawnRun,
  plan: RestorePlan,
  nics: ReadonlyMap<string, NicAttachment | undefined>,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < run.rows.length && (run.policy === "each" || run.failures.length === 0)) {
      const row = run.rows[next++] as SandboxRow;
      try {
        const sandbox = await restoreChild(ctx, run, row, plan, nics.get(row.id));
        run.started.push(sandbox);
        crashPoint("spawn.restored");
        row.pid = sandbox.pid;
        row.memory_image = sandbox.memoryImage;
        row.ready_ms = Math.round(sandbox.readyMs * 10) / 10;
      } catch (err) {
        run.failures.push(err);
        run.failed.set(row.id, asForkdError(err));
        // A child that failed on its own leaves nothing behind; all-or-nothing cleans up in startChildren.
        if (run.policy === "each") await forget(ctx, row);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(SPAWN_CONCURRENCY, run.rows.length) }, worker));
}

async function restoreChild(
  ctx: SpawnContext,
  run: SpawnRun,
  row: SandboxRow,
  plan: RestorePlan,
  nic: NicAttachment | undefined,
): Promise<Sandbox> {
  const child = run.prestarted.get(row.id);
  run.prestarted.delete(row.id);
  const { limits } = run.spawn;
  // In place before QEMU starts: the launcher joins them, so the guest never runs unlimited (a pooled child
  // started in them: the pool made them under this id).
  const cgroups =
    ctx.cgroups && !child ? await createSandboxCgroups(ctx.cgroups, row.id, cgroupLimits(limits)) : undefined;
  // A pooled VM refilled in the background gets the CPU weight of any sandbox now.
  if (ctx.cgroups && child) await setCpuWeight(ctx.cgroups, row.id, "normal");
  crashPoint("spawn.limited");
  return Sandbox.restore(ctx.paths, child ? (run.pooledPlan ?? plan) : plan, {
    id: row.id,
    prestarted: child,
    outliveHost: true,
    signal: run.spawn.signal,
    nic,
    confinement: ctx.confinement,
    cgroups,
    diskLimitBytes: limits.disk_mib === null ? undefined : limits.disk_mib * 2 ** 20,
    consoleLogBytes: ctx.consoleLogBytes,
    onSpawned: async (pid) => {
      await recordSpawned(ctx.db, row.id, pid);
      crashPoint("spawn.launched");
    },
  });
}

/** Commits the children that started (or throws, per the policy) and answers with one entry per row. */
function finishSpawn(ctx: SpawnContext, run: SpawnRun): ForkChild[] {
  const { spawn, rows, started, failed, failures } = run;
  if (run.policy === "all-or-nothing" && failures.length > 0) throw failures[0];
  if (run.policy === "each" && started.length === 0 && spawn.signal?.aborted) throw failures[0];
  const now = Date.now();
  for (const sandbox of started) {
    const row = rows.find((r) => r.id === sandbox.id) as SandboxRow;
    row.status = "running";
    row.expires_at_unix_ms = spawn.timeoutMs === 0 ? null : now + spawn.timeoutMs;
    ctx.db.updateSandbox(row.id, {
      status: "running",
      expires_at_unix_ms: row.expires_at_unix_ms,
      ready_ms: row.ready_ms,
      memory_image: row.memory_image,
    });
    ctx.adopt(sandbox);
  }
  ctx.log.info({ tag: spawn.tag, n: spawn.n, ids: started.map((s) => s.id), failed: failed.size }, "spawned");
  crashPoint("spawn.running");
  return rows.map((r): ForkChild => {
    const error = failed.get(r.id);
    return error ? { error } : { sandbox: ctx.info(ctx.db.sandbox(r.id) as SandboxRow) };
  });
}

/** A child that will not run: its cgroups, what remains of its network, and its record go. */
async function forget(ctx: SpawnContext, row: SandboxRow): Promise<void> {
  await removeCgroups(cgroupDirsOf(row)).catch((e: unknown) =>
    ctx.log.warn({ id: row.id, err: errorMessage(e) }, "could not remove a sandbox's cgroups"),
  );
  // A restore that failed killed its QEMU; what remains of the network is the namespace and veth.
  await ctx.networks
    .detach(row.id)
    .catch((e: unknown) =>
      ctx.log.warn({ id: row.id, err: errorMessage(e) }, "could not remove a sandbox network"),
    );
  ctx.db.deleteSandbox(row.id);
}

/** Records a just-spawned QEMU, so a restart finds it (its cgroups were made before it started). */
export async function recordSpawned(db: StateDb, id: string, pid: number): Promise<void> {
  const startTime = await processStartTime(pid);
  db.updateSandbox(id, { pid, pid_start_time: startTime });
}

function asForkdError(err: unknown): ForkdError {
  return err instanceof ForkdError ? err : new ForkdError("internal", errorMessage(err), { cause: err });
}
