/**
 * The daemon's state in SQLite (WAL): sandboxes, the snapshots being written, template aliases and the snapshots
 * the daemon made for itself (fork points). Snapshot contents stay on disk (snapshot-store.ts); the database
 * records what the daemon is doing, so a restart can re-attach to running VMs or clean up after dead ones.
 */
import { mkdirSync } from "node:fs";
import path from "node:path";
import Database from "better-sqlite3";
import { currentBootId, isAlive, selfIdentity } from "../common/processes.js";
import { MIGRATIONS } from "./migrations.js";

/** The schema this forkd writes: one version per migration (migrations.ts brings older databases forward). */
export const SCHEMA_VERSION = MIGRATIONS.length;

export interface SandboxRow {
  id: string;
  snapshot_tag: string;
  /**
   * starting → running ⇄ (pausing → paused → resuming →) running; stopping while being killed; dead when its VM
   * died under it. A paused sandbox has no VM: its state is the snapshot layer `pause_tags` ends with.
   */
  status: SandboxStatus;
  pid: number | null;
  /** /proc/<pid>/stat field 22: tells a re-used pid apart from our QEMU after a restart. */
  pid_start_time: number | null;
  run_dir: string;
  accelerator: "kvm" | "tcg";
  created_at_unix: number;
  expires_at_unix_ms: number | null;
  memory_limit_mib: number | null;
  /** The flat RAM image the sandbox's QEMU maps (needed to BRANCH it, also after a daemon restart). */
  memory_image: string | null;
  /**
   * JSON array of every snapshot tag the sandbox depends on: the chain it was restored from plus the branches
   * taken of it (its disk runs through their frozen layers). None of them may be deleted while it runs.
   */
  layer_tags: string;
  /** Tag of the latest branch taken of this sandbox (the parent of its next one). */
  last_branch_tag: string | null;
  /** Why this sandbox cannot be BRANCHed again (a failed BRANCH left a layer in its disk chain no snapshot owns). */
  branch_blocked: string | null;
  /** 1 when the sandbox maps its RAM from tmpfs (live_fork), 0 otherwise. */
  live_fork: number;
  /** JSON array of the sandbox's cgroup directories, recorded before they are created (older rows: one path). */
  cgroup: string | null;
  /** JSON SandboxLimits (controller/sandboxes/limits.ts): what it runs with; "{}" for rows older than v7. */
  limits: string;
  ready_ms: number | null;
  error: string | null;
  /** JSON object of string metadata the caller attached (E2B's sandbox metadata). */
  metadata: string;
  /** JSON object of environment variables applied to every process and cell in the sandbox. */
  env_vars: string;
  /** Secret presented on the sandbox's data plane (E2B's envd access token); null for rows older than v2. */
  access_token: string | null;
  /** Secret for the sandbox's other ports (E2B's traffic access token). */
  traffic_token: string | null;
  /** The template name the sandbox was created by when it was an alias (E2B's `alias`), else null. */
  template_alias: string | null;
  /** "netns": its own namespace (a sandbox_networks row); "private": a NIC with no uplink; "none": no NIC. */
  network: "netns" | "private" | "none";
  /**
   * JSON array of the snapshot layers this sandbox's pauses wrote that are still its own (the top of its chain,
   * bottom first; a BRANCH taken of it buries them under its snapshot). The last one holds its paused state.
   */
  pause_tags: string;
  /** The layer a pause in progress is writing (a crash leaves it here for the restart to finish or drop). */
  pending_pause_tag: string | null;
  /** The snapshot whose RAM image `memory_image` is (null: `snapshot_tag`); a resumed VM writes the rest. */
  memory_tag: string | null;
  /** The lifetime given at spawn (or resume), restarted at every resume; null: no limit. */
  timeout_ms: number | null;
  /** What the end of its lifetime does. */
  on_timeout: "kill" | "pause";
  /** 1: a data-plane request to it while paused resumes it (E2B's autoResume). */
  auto_resume: number;
  /** When it was last paused (unix ms), while paused. */
  paused_at_unix_ms: number | null;
  /** JSON InboundSettings (controller/sandbox-service.ts): how its ports are reached through the daemon. */
  inbound: string;
  /** The tenant that owns it (controller/tenancy); null: an admin's, or older than tenants (v8). */
  owner: string | null;
  /**
   * The disk a filesystem-only pause kept (E2B's memory: false), while it is paused that way: it has no memory
   * layer, and resumes by a cold boot on this disk. Null otherwise.
   */
  kept_disk: string | null;
  /** 1 once it runs from a cold boot (a filesystem-only pause's resume): its RAM is no snapshot's. */
  cold_booted: number;
  /** 0: the end of its lifetime (on_timeout "pause") pauses it without memory (E2B's autoPauseMemory false). */
  auto_pause_memory: number;
}

export type SandboxStatus = "starting" | "running" | "pausing" | "paused" | "resuming" | "stopping" | "dead";

/** A forkd v0.5 workspace: a name for a sandbox that is suspended and resumed by name. */
export interface WorkspaceRow {
  name: string;
  sandbox_id: string;
  source_snapshot_tag: string;
  created_at_unix: number;
  last_active_unix: number;
}

/**
 * A sandbox's network (its namespace, veth and address on the bridge), recorded before any of it is created
 * and deleted only after all of it is gone, so a daemon that dies at any point leaves a record of what to
 * remove, and an address is never handed out twice.
 */
export interface SandboxNetworkRow {
  sandbox_id: string;
  state: "creating" | "ready" | "removing";
  netns: string;
  veth: string;
  /** The namespace's address on the bridge (unique). */
  address: string;
  /** JSON EgressPolicy (src/net/policy.ts). */
  policy: string;
  /** Bumped at every policy change (the namespace's rules carry it). */
  generation: number;
}

/** A name that resolves to a snapshot tag (E2B template names and named snapshots). */
export interface TemplateAliasRow {
  alias: string;
  tag: string;
  created_at_unix: number;
  /** The tenant that set it; null: an admin's. */
  owner: string | null;
}

/**
 * A snapshot the daemon made for its own use (the BRANCH behind a fork, a superseded named snapshot): deleted
 * once no sandbox, alias or other snapshot needs it.
 */
export interface EphemeralSnapshotRow {
  tag: string;
  reason: string;
  created_at_unix: number;
}

export interface SnapshotJobRow {
  tag: string;
  status: "writing" | "failed";
  kind: string;
  started_at_unix: number;
  /** The daemon process writing it (pid + start time); a job whose writer is gone is failed at start-up. */
  writer_pid: number;
  writer_start_time: number | null;
  error: string | null;
}

/** A job as callers record it: the writer is always the calling process (filled in by StateDb). */
export type SnapshotJobInput = Omit<SnapshotJobRow, "writer_pid" | "writer_start_time">;

/**
 * Who a claimed snapshot belongs to: a tenant, or null for an admin. Recorded with the job, before any file of
 * the snapshot exists, so a snapshot is never for a moment (nor after a crash) anyone else's.
 */
export interface SnapshotClaim extends SnapshotJobInput {
  owner: string | null;
}

export class StateDb {
  private readonly db: Database.Database;

  constructor(file: string) {
    mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    this.db = new Database(file);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = NORMAL");
    this.db.pragma("busy_timeout = 5000");
    this.migrate();
  }

  private migrate(): void {
    const version = this.db.pragma("user_version", { simple: true }) as number;
    if (version > SCHEMA_VERSION) {
      throw new Error(`state database schema ${version} is newer than this forkd (${SCHEMA_VERSION})`);
    }
    for (const migration of MIGRATIONS.slice(version)) migration(this.db);
    if (version < SCHEMA_VERSION) this.db.pragma(`user_version = ${SCHEMA_VERSION}`);
  }

  meta(key: string): string | undefined {
    const row = this.db.prepare("SELECT value FROM meta WHERE key = ?").get(key) as
      | { value: string }
      | undefined;
    return row?.value;
  }

  setMeta(key: string, value: string): void {
    this.db
      .prepare(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
      )
      .run(key, value);
  }

  insertSandbox(row: SandboxRow): void {
    this.db
      .prepare(
        `INSERT INTO sandboxes (id, snapshot_tag, status, pid, pid_start_time, run_dir, accelerator, created_at_unix,
           expires_at_unix_ms, memory_limit_mib, memory_image, layer_tags, last_branch_tag, branch_blocked, live_fork, cgroup, ready_ms, error,
           metadata, env_vars, access_token, traffic_token, template_alias, network, inbound, pause_tags, pending_pause_tag,
           memory_tag, timeout_ms, on_timeout, auto_resume, paused_at_unix_ms, limits, owner, kept_disk, cold_booted, auto_pause_memory)
         VALUES (@id, @snapshot_tag, @status, @pid, @pid_start_time, @run_dir, @accelerator, @created_at_unix,
           @expires_at_unix_ms, @memory_limit_mib, @memory_image, @layer_tags, @last_branch_tag, @branch_blocked, @live_fork, @cgroup, @ready_ms, @error,
           @metadata, @env_vars, @access_token, @traffic_token, @template_alias, @network, @inbound, @pause_tags, @pending_pause_tag,
           @memory_tag, @timeout_ms, @on_timeout, @auto_resume, @paused_at_unix_ms, @limits, @owner, @kept_disk, @cold_booted, @auto_pause_memory)`,
      )
      .run(row);
  }

  updateSandbox(id: string, fields: Partial<Omit<SandboxRow, "id">>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    const assignments = keys.map((k) => `${k} = @${k}`).join(", ");
    this.db.prepare(`UPDATE sandboxes SET ${assignments} WHERE id = @id`).run({ ...fields, id });
  }

  deleteSandbox(id: string): void {
    this.db.transaction(() => {
      this.db.prepare("DELETE FROM sandboxes WHERE id = ?").run(id);
      this.db.prepare("DELETE FROM meta WHERE key = ?").run(transientSandboxKey(id));
    })();
  }

  /**
   * Marks sandbox `id` as the daemon's own helper for one call (`owner`, e.g. snapshot-diff): it must not outlive
   * the daemon that made it, so a restart kills it instead of re-attaching. Deleting the sandbox drops the mark.
   */
  markTransientSandbox(id: string, owner: string): void {
    this.setMeta(transientSandboxKey(id), owner);
  }

  transientSandboxOwner(id: string): string | undefined {
    return this.meta(transientSandboxKey(id));
  }

  sandboxes(): SandboxRow[] {
    return this.db.prepare("SELECT * FROM sandboxes ORDER BY created_at_unix, id").all() as SandboxRow[];
  }

  sandbox(id: string): SandboxRow | undefined {
    return this.db.prepare("SELECT * FROM sandboxes WHERE id = ?").get(id) as SandboxRow | undefined;
  }

  // ---- forkd v0.5 workspaces

  insertWorkspace(row: WorkspaceRow): boolean {
    return (
      this.db
        .prepare(
          `INSERT OR IGNORE INTO workspaces (name, sandbox_id, source_snapshot_tag, created_at_unix, last_active_unix)
           VALUES (@name, @sandbox_id, @source_snapshot_tag, @created_at_unix, @last_active_unix)`,
        )
        .run(row).changes === 1
    );
  }

  updateWorkspace(name: string, fields: Partial<Omit<WorkspaceRow, "name">>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    const assignments = keys.map((k) => `${k} = @${k}`).join(", ");
    this.db.prepare(`UPDATE workspaces SET ${assignments} WHERE name = @name`).run({ ...fields, name });
  }

  workspace(name: string): WorkspaceRow | undefined {
    return this.db.prepare("SELECT * FROM workspaces WHERE name = ?").get(name) as WorkspaceRow | undefined;
  }

  workspaceOfSandbox(sandboxId: string): WorkspaceRow | undefined {
    return this.db.prepare("SELECT * FROM workspaces WHERE sandbox_id = ?").get(sandboxId) as
      | WorkspaceRow
      | undefined;
  }

  workspaces(): WorkspaceRow[] {
    return this.db.prepare("SELECT * FROM workspaces ORDER BY name").all() as WorkspaceRow[];
  }

  deleteWorkspace(name: string): void {
    this.db.prepare("DELETE FROM workspaces WHERE name = ?").run(name);
  }

  /** Runs `fn` in one transaction (several rows changed as one step). */
  transaction<T>(fn: () => T): T {
    return this.db.transaction(fn)();
  }

  /**
   * Records a sandbox network with the first address from `candidates` that no other record holds (the
   * UNIQUE constraint decides, inside one transaction). Returns the address, or null when all were taken.
   */
  insertNetwork(row: Omit<SandboxNetworkRow, "address">, candidates: Iterable<string>): string | null {
    const insert = this.db.prepare(
      `INSERT OR IGNORE INTO sandbox_networks (sandbox_id, state, netns, veth, address, policy, generation)
       VALUES (@sandbox_id, @state, @netns, @veth, @address, @policy, @generation)`,
    );
    const tx = this.db.transaction(() => {
      for (const address of candidates) {
        if (insert.run({ ...row, address }).changes === 1) return address;
      }
      return null;
    });
    return tx();
  }

  updateNetwork(sandboxId: string, fields: Partial<Omit<SandboxNetworkRow, "sandbox_id" | "address">>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    const assignments = keys.map((k) => `${k} = @${k}`).join(", ");
    this.db
      .prepare(`UPDATE sandbox_networks SET ${assignments} WHERE sandbox_id = @sandbox_id`)
      .run({ ...fields, sandbox_id: sandboxId });
  }

  deleteNetwork(sandboxId: string): void {
    this.db.prepare("DELETE FROM sandbox_networks WHERE sandbox_id = ?").run(sandboxId);
  }

  network(sandboxId: string): SandboxNetworkRow | undefined {
    return this.db.prepare("SELECT * FROM sandbox_networks WHERE sandbox_id = ?").get(sandboxId) as
      | SandboxNetworkRow
      | undefined;
  }

  networks(): SandboxNetworkRow[] {
    return this.db.prepare("SELECT * FROM sandbox_networks ORDER BY sandbox_id").all() as SandboxNetworkRow[];
  }

  upsertSnapshotJob(job: SnapshotJobInput): void {
    const self = selfIdentity();
    const row: SnapshotJobRow = { ...job, writer_pid: self.pid, writer_start_time: self.startTime };
    this.db
      .prepare(
        `INSERT INTO snapshot_jobs (tag, status, kind, started_at_unix, writer_pid, writer_start_time, error)
         VALUES (@tag, @status, @kind, @started_at_unix, @writer_pid, @writer_start_time, @error)
         ON CONFLICT(tag) DO UPDATE SET status = excluded.status, kind = excluded.kind,
           started_at_unix = excluded.started_at_unix, writer_pid = excluded.writer_pid,
           writer_start_time = excluded.writer_start_time, error = excluded.error`,
      )
      .run(row);
  }

  /**
   * Inserts a "writing" job unless one exists for the tag, and records the snapshot's owner with it; false
   * when the tag is already being written.
   */
  claimSnapshotJob(claim: SnapshotClaim): boolean {
    const { owner, ...row } = claim;
    const tx = this.db.transaction(() => {
      const existing = this.snapshotJob(row.tag);
      if (existing?.status === "writing") return false;
      this.upsertSnapshotJob(row);
      this.setSnapshotOwner(row.tag, owner);
      return true;
    });
    return tx();
  }

  // ---- owners of snapshots (tenancy)

  /** Records the tenant a snapshot belongs to; null: an admin's (the row goes). */
  setSnapshotOwner(tag: string, owner: string | null): void {
    if (owner === null) this.db.prepare("DELETE FROM snapshot_owners WHERE tag = ?").run(tag);
    else
      this.db
        .prepare(
          "INSERT INTO snapshot_owners (tag, owner) VALUES (?, ?) ON CONFLICT(tag) DO UPDATE SET owner = excluded.owner",
        )
        .run(tag, owner);
  }

  /** Every tenant-owned snapshot's owner, by tag (admins' snapshots have none). */
  snapshotOwners(): Map<string, string> {
    const rows = this.db.prepare("SELECT tag, owner FROM snapshot_owners").all() as {
      tag: string;
      owner: string;
    }[];
    return new Map(rows.map((r) => [r.tag, r.owner]));
  }

  deleteSnapshotJob(tag: string): void {
    this.db.prepare("DELETE FROM snapshot_jobs WHERE tag = ?").run(tag);
  }

  snapshotJob(tag: string): SnapshotJobRow | undefined {
    return this.db.prepare("SELECT * FROM snapshot_jobs WHERE tag = ?").get(tag) as
      | SnapshotJobRow
      | undefined;
  }

  snapshotJobs(): SnapshotJobRow[] {
    return this.db.prepare("SELECT * FROM snapshot_jobs ORDER BY tag").all() as SnapshotJobRow[];
  }

  // ---- template aliases

  setAlias(row: TemplateAliasRow): void {
    this.db
      .prepare(
        `INSERT INTO template_aliases (alias, tag, created_at_unix, owner) VALUES (@alias, @tag, @created_at_unix, @owner)
         ON CONFLICT(alias) DO UPDATE SET tag = excluded.tag, created_at_unix = excluded.created_at_unix,
           owner = excluded.owner`,
      )
      .run(row);
  }

  alias(alias: string): TemplateAliasRow | undefined {
    return this.db.prepare("SELECT * FROM template_aliases WHERE alias = ?").get(alias) as
      | TemplateAliasRow
      | undefined;
  }

  aliases(): TemplateAliasRow[] {
    return this.db.prepare("SELECT * FROM template_aliases ORDER BY alias").all() as TemplateAliasRow[];
  }

  /** Removes the alias; false if there was none. */
  deleteAlias(alias: string): boolean {
    return this.db.prepare("DELETE FROM template_aliases WHERE alias = ?").run(alias).changes > 0;
  }

  // ---- snapshots the daemon made for itself

  markEphemeral(row: EphemeralSnapshotRow): void {
    this.db
      .prepare(
        `INSERT INTO ephemeral_snapshots (tag, reason, created_at_unix) VALUES (@tag, @reason, @created_at_unix)
         ON CONFLICT(tag) DO NOTHING`,
      )
      .run(row);
  }

  ephemeralSnapshots(): EphemeralSnapshotRow[] {
    return this.db
      .prepare("SELECT * FROM ephemeral_snapshots ORDER BY created_at_unix DESC, tag")
      .all() as EphemeralSnapshotRow[];
  }

  forgetEphemeral(tag: string): void {
    this.db.prepare("DELETE FROM ephemeral_snapshots WHERE tag = ?").run(tag);
  }

  close(): void {
    this.db.close();
  }
}

/** Whether the process that wrote `job` is still running (a job whose writer is gone will never finish). */
export async function jobWriterAlive(job: SnapshotJobRow): Promise<boolean> {
  if (job.writer_start_time === null) return job.writer_pid === process.pid;
  return isAlive({ pid: job.writer_pid, startTime: job.writer_start_time, bootId: currentBootId() });
}

function transientSandboxKey(id: string): string {
  return `transient-sandbox:${id}`;
}
