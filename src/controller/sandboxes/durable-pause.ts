/**
 * The daemon's side of a durable pause (docs/kubernetes.md, "The durable pause"): the record of a sandbox paused
 * with its memory — what another node needs to insert it — and the insert of such a record from another node,
 * as a paused sandbox under the same id whose chain (pulled before) ends with its pause layer. Its network is
 * recorded "creating" with its policy and a free address here, so its resume builds it, as after a crash. The
 * caller (the cluster node) has checked the record's seal and every field's pattern; this module checks again
 * what it relies on: the id is free, the pause layer is here.
 */
import path from "node:path";
import { conflict, ForkdError } from "../../common/errors.js";
import { isValidSandboxId } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { SnapshotStore } from "../../store/snapshot-store.js";
import type { SandboxNetworks } from "../networks/sandbox-networks.js";
import type { PausedSandboxRecord } from "../sandbox-service.js";

/** The record of paused sandbox `id` (paused with memory: a filesystem-only pause keeps a local disk only). */
export function pausedRecordOf(db: StateDb, id: string): PausedSandboxRecord {
  const row = db.sandbox(id);
  if (!row) throw new ForkdError("not_found", `sandbox ${id} not found`);
  if (row.status !== "paused") throw conflict(`sandbox ${id} is ${row.status}, not paused`);
  if (row.kept_disk !== null) {
    throw conflict(`sandbox ${id} was paused without memory: its disk is kept on this node only`);
  }
  const pauseTag = (JSON.parse(row.pause_tags) as string[]).at(-1);
  if (!pauseTag) throw conflict(`sandbox ${id} has no pause layer of its own`);
  const chain = JSON.parse(row.layer_tags) as string[];
  return {
    id,
    owner: row.owner,
    snapshot_tag: row.snapshot_tag,
    layer_tags: chain.at(-1) === pauseTag ? chain : [...chain, pauseTag],
    pause_tag: pauseTag,
    last_branch_tag: row.last_branch_tag,
    memory_tag: row.memory_tag,
    template_alias: row.template_alias,
    accelerator: row.accelerator,
    live_fork: row.live_fork,
    created_at_unix: row.created_at_unix,
    memory_limit_mib: row.memory_limit_mib,
    limits: row.limits,
    metadata: row.metadata,
    env_vars: row.env_vars,
    inbound: row.inbound,
    network: row.network,
    network_policy: row.network === "netns" ? (db.network(id)?.policy ?? null) : null,
    access_token: row.access_token,
    traffic_token: row.traffic_token,
    timeout_ms: row.timeout_ms,
    on_timeout: row.on_timeout,
    auto_resume: row.auto_resume,
    auto_pause_memory: row.auto_pause_memory,
    paused_at_unix_ms: row.paused_at_unix_ms ?? Date.now(),
  };
}

export interface AdoptContext {
  paths: ForkdPaths;
  db: StateDb;
  store: Pick<SnapshotStore, "get">;
  networks: Pick<SandboxNetworks, "recordAdopted">;
}

/** Inserts `record` (another node's paused sandbox) as paused here; its pause layer must be installed. */
export async function insertAdopted(ctx: AdoptContext, record: PausedSandboxRecord): Promise<void> {
  if (!isValidSandboxId(record.id)) throw new ForkdError("invalid_argument", "not a sandbox id");
  if (ctx.db.sandbox(record.id)) throw conflict(`sandbox ${record.id} is already on this node`);
  await ctx.store.get(record.pause_tag); // not_found unless the chain was pulled
  const { pause_tag: pauseTag, network_policy: policy, ...fields } = record;
  const row: SandboxRow = {
    ...fields,
    status: "paused",
    pid: null,
    pid_start_time: null,
    run_dir: path.join(ctx.paths.run, record.id),
    expires_at_unix_ms: null,
    memory_image: null,
    layer_tags: JSON.stringify(record.layer_tags),
    branch_blocked: null,
    cgroup: null,
    ready_ms: null,
    error: null,
    pause_tags: JSON.stringify([pauseTag]),
    pending_pause_tag: null,
    kept_disk: null,
    cold_booted: 0,
  };
  // The network first: a sandbox row is never without the record its resume needs.
  if (record.network === "netns") {
    if (policy === null) throw conflict(`sandbox ${record.id} has no network policy recorded`);
    ctx.networks.recordAdopted(record.id, policy);
  }
  try {
    ctx.db.insertSandbox(row);
  } catch (err) {
    if (record.network === "netns") ctx.db.deleteNetwork(record.id);
    throw err;
  }
}
