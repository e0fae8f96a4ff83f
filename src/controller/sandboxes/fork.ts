/**
 * Fork of a sandbox (SandboxService.fork): BRANCH it once (live when it was spawned with live_fork, else diff;
 * a paused one from its paused state), mark that snapshot as the daemon's own fork point, and restore `count`
 * children from it, each succeeding or failing on its own, with the source's settings, network and owner.
 */

import { randomBytes } from "node:crypto";
import type { ForkOutcome } from "../sandbox-service.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { Admission } from "./admission.js";
import type { Branching } from "./branching.js";
import { validateChildCount } from "./fork-children.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import type { NetworkCalls } from "./network-calls.js";
import { parseInbound, parseStringMap } from "./settings.js";
import type { SnapshotCollection } from "./snapshot-collection.js";
import type { Spawner } from "./spawn.js";

export interface ForkContext {
  live: Pick<LiveSandboxes, "row" | "running">;
  admission: Pick<Admission, "reserveSpawn">;
  branching: Pick<Branching, "branch">;
  snapshots: Pick<DaemonSnapshots, "markEphemeral">;
  spawner: Pick<Spawner, "children">;
  networkCalls: Pick<NetworkCalls, "networkOf">;
  collection: Pick<SnapshotCollection, "request">;
}

export interface ForkRequest {
  count: number;
  timeoutMs?: number;
  signal?: AbortSignal;
}

export async function forkSandbox(ctx: ForkContext, id: string, request: ForkRequest): Promise<ForkOutcome> {
  const count = validateChildCount(request.count);
  const row = ctx.live.row(id);
  // A paused sandbox forks from its paused state (no VM to capture).
  const paused = row.status === "paused";
  if (!paused) ctx.live.running(id);
  // Refused before anything is attempted when the host cannot take that many more (the children's own spawn
  // reserves them again when it starts).
  ctx.admission.reserveSpawn(count).release();
  const branched = await ctx.branching.branch(id, {
    tag: `fork-${randomBytes(6).toString("hex")}`,
    mode: row.live_fork === 1 && !paused ? "live" : "diff",
    signal: request.signal,
  });
  ctx.snapshots.markEphemeral(branched.tag, `fork of ${id}`);
  const children = await ctx.spawner.children(
    {
      snapshotTag: branched.tag,
      n: count,
      timeoutMs: request.timeoutMs,
      metadata: parseStringMap(row.metadata),
      env: parseStringMap(row.env_vars),
      templateAlias: row.template_alias ?? undefined,
      // Forks keep the source's egress policy (as it is now) and inbound settings: a fork is never less
      // confined than what it was forked from.
      network: ctx.networkCalls.networkOf(row),
      inbound: parseInbound(row.inbound),
      owner: row.owner,
      signal: request.signal,
    },
    "each",
  );
  ctx.collection.request();
  return { tag: branched.tag, mode: branched.mode, pause_ms: branched.pause_ms, children };
}
