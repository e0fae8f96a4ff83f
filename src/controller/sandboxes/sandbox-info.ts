/** A sandbox's record as the service returns it (SandboxInfo), from its row and what the daemon knows now. */

import { existsSync } from "node:fs";
import path from "node:path";
import type { SandboxRow } from "../../store/db.js";
import type { SnapshotStore } from "../../store/snapshot-store.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import type { SandboxNetworks } from "../networks/sandbox-networks.js";
import type { SandboxInfo } from "../sandbox-service.js";
import { parseLimits } from "./limits.js";
import { parseInbound, parseStringMap } from "./settings.js";

/** What describing a sandbox reads besides its row. */
export interface SandboxInfoContext {
  networks: Pick<SandboxNetworks, "info">;
  store: Pick<SnapshotStore, "dirOf">;
}

export function sandboxInfo(ctx: SandboxInfoContext, row: SandboxRow): SandboxInfo {
  return {
    id: row.id,
    snapshot_tag: row.snapshot_tag,
    created_at_unix: row.created_at_unix,
    pid: row.pid,
    memory_limit_mib: row.memory_limit_mib,
    status: row.status,
    expires_at_unix_ms: row.expires_at_unix_ms,
    timeout_ms: row.timeout_ms,
    on_timeout: row.on_timeout,
    auto_resume: row.auto_resume === 1,
    paused_without_memory: row.kept_disk !== null,
    cold_booted: row.cold_booted === 1,
    pause_tag: (JSON.parse(row.pause_tags) as string[]).at(-1) ?? null,
    paused_at_unix_ms: row.paused_at_unix_ms,
    ready_ms: row.ready_ms,
    accelerator: row.accelerator,
    live_fork: row.live_fork === 1,
    branch_count: branchCount(row),
    last_branch_tag: row.last_branch_tag,
    last_branch_memory_path: branchMemoryPath(ctx.store, row.last_branch_tag),
    metadata: parseStringMap(row.metadata),
    template_alias: row.template_alias,
    inbound: parseInbound(row.inbound),
    owner: row.owner,
    limits: parseLimits(row),
    network:
      row.status === "dead"
        ? { kind: row.network, netns: null, address: null, guestAddress: null, policy: null }
        : ctx.networks.info(row.id, row.network !== "none"),
  };
}

/** The memory file of branch `tag` on this host: a full branch's memory.bin, else its memory.layer. */
function branchMemoryPath(store: Pick<SnapshotStore, "dirOf">, tag: string | null): string | null {
  if (tag === null) return null;
  const dir = store.dirOf(tag);
  const flat = path.join(dir, SNAPSHOT_FILES.memory);
  return existsSync(flat) ? flat : path.join(dir, SNAPSHOT_FILES.memoryLayer);
}

/**
 * Branches taken of a sandbox: `layer_tags` is the chain it was restored from (ending with its snapshot) followed
 * by one tag per branch taken of it.
 */
function branchCount(row: SandboxRow): number {
  const layers = JSON.parse(row.layer_tags) as string[];
  const restoredAt = layers.lastIndexOf(row.snapshot_tag);
  if (restoredAt < 0) return 0;
  // Its pause layers are not branches (pause-layer.ts names them pause-<id>-...).
  return layers.slice(restoredAt + 1).filter((t) => !t.startsWith(`pause-${row.id}-`)).length;
}
