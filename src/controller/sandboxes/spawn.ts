/**
 * Spawning sandboxes as the service does: the request resolved (spawn-request.ts), prestarted VMs taken from the
 * warm pool when it may serve it, the children's rows built, and the children started (spawn-children.ts).
 */

import type { ForkChild, SandboxInfo, SpawnRequest } from "../sandbox-service.js";
import { type SpawnContext, type SpawnPolicy, startChildren } from "./spawn-children.js";
import { resolveSpawn, type SpawnRequestContext, spawnRows } from "./spawn-request.js";
import type { WarmPool } from "./warm-pool.js";

export type SpawnerContext = SpawnRequestContext & SpawnContext & { warmPool: Pick<WarmPool, "take"> };

export class Spawner {
  constructor(private readonly ctx: SpawnerContext) {}

  /** All or nothing: every child ready, or none left behind. */
  async spawn(request: SpawnRequest): Promise<SandboxInfo[]> {
    const children = await this.children(request, "all-or-nothing");
    return children.map((child) => child.sandbox as SandboxInfo);
  }

  /** Restores `request.n` children under `policy` (see SpawnPolicy): spawn-request.ts, then spawn-children.ts. */
  async children(
    request: SpawnRequest,
    policy: SpawnPolicy,
    /** The daemon's own call that needs these sandboxes only while it runs (see StateDb.markTransientSandbox). */
    transientFor?: string,
  ): Promise<ForkChild[]> {
    const { ctx } = this;
    const spawn = await resolveSpawn(ctx, request);
    // Taken synchronously, before the first await below, so concurrent spawns never share one.
    const networked = spawn.shared.network === "netns";
    const pooled = spawn.poolable
      ? ctx.warmPool.take(spawn.tag, spawn.n, spawn.limits, networked)
      : undefined;
    const pooledIds = (pooled?.children ?? []).map((child) => child.id);
    const rows = spawnRows(spawn, pooledIds, { runDir: ctx.paths.run, cgroups: ctx.cgroups });
    return startChildren(ctx, spawn, rows, { policy, pooled, transientFor });
  }
}
