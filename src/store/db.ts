/**
 * The daemon's state in SQLite (WAL): sandboxes, the snapshots being written, template aliases and the snapshots
 * the daemon made for itself (fork points). Snapshot contents stay on disk (snapshot-store.ts); the database
 * records what the daemon is doing, so a restart can re-attach to running VMs or clean up after dead ones.
 */
import { mkdirSync } from "node:fs";
import path from "node:path";
import Database from "better-sqlite3";
import { currentBootId, isAlive, selfIdentity } from "../common/processes.js";

/** Bump when the schema changes; `migrate` brings older databases forward. */
export const SCHEMA_VERSION = 5;

export interface SandboxRow {
  id: string;
  snapshot_tag: string;
  status: "starting" | "running" | "stopping" | "dead";
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
  cgroup: string | null;
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
  /** JSON InboundSettings (controller/sandbox-service.ts): how its ports are reached through the daemon. */
  inbound: string;
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
    if (version < 1) {
      this.db.exec(`
        CREATE TABLE sandboxes (
          id TEXT PRIMARY KEY,
          snapshot_tag TEXT NOT NULL,
          status TEXT NOT NULL CHECK (status IN ('starting','running','stopping','dead')),
          pid INTEGER,
          pid_start_time INTEGER,
          run_dir TEXT NOT NULL,
          accelerator TEXT NOT NULL,
          created_at_unix INTEGER NOT NULL,
          expires_at_unix_ms INTEGER,
          memory_limit_mib INTEGER,
          memory_image TEXT,
          layer_tags TEXT NOT NULL DEFAULT '[]',
          last_branch_tag TEXT,
          branch_blocked TEXT,
          live_fork INTEGER NOT NULL DEFAULT 0,
          cgroup TEXT,
          ready_ms REAL,
          error TEXT
        );
        CREATE INDEX sandboxes_by_tag ON sandboxes (snapshot_tag);
        CREATE TABLE snapshot_jobs (
          tag TEXT PRIMARY KEY,
          status TEXT NOT NULL CHECK (status IN ('writing','failed')),
          kind TEXT NOT NULL,
          started_at_unix INTEGER NOT NULL,
          writer_pid INTEGER NOT NULL,
          error TEXT
        );
      `);
    }
    if (version < 2) {
      // meta: facts about the state as a whole (the boot the recorded process identities belong to).
      this.db.exec(`
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        ALTER TABLE snapshot_jobs ADD COLUMN writer_start_time INTEGER;
      `);
    }
    if (version < 3) {
      this.db.exec(`
        ALTER TABLE sandboxes ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE sandboxes ADD COLUMN env_vars TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE sandboxes ADD COLUMN access_token TEXT;
        ALTER TABLE sandboxes ADD COLUMN traffic_token TEXT;
        ALTER TABLE sandboxes ADD COLUMN template_alias TEXT;
        CREATE TABLE template_aliases (
          alias TEXT PRIMARY KEY,
          tag TEXT NOT NULL,
          created_at_unix INTEGER NOT NULL
        );
        CREATE TABLE ephemeral_snapshots (
          tag TEXT PRIMARY KEY,
          reason TEXT NOT NULL,
          created_at_unix INTEGER NOT NULL
        );
      `);
    }
    if (version < 4) {
      this.db.exec(`
        ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT 'none';
        CREATE TABLE sandbox_networks (
          sandbox_id TEXT PRIMARY KEY,
          state TEXT NOT NULL CHECK (state IN ('creating','ready','removing')),
          netns TEXT NOT NULL UNIQUE,
          veth TEXT NOT NULL UNIQUE,
          address TEXT NOT NULL UNIQUE,
          policy TEXT NOT NULL,
          generation INTEGER NOT NULL
        );
      `);
    }
    if (version < 5) {
      // Rows from before keep E2B's defaults: public traffic, the request's own Host, plain HTTP.
      this.db.exec(`ALTER TABLE sandboxes ADD COLUMN inbound TEXT NOT NULL DEFAULT '{}';`);
    }
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
           metadata, env_vars, access_token, traffic_token, template_alias, network, inbound)
         VALUES (@id, @snapshot_tag, @status, @pid, @pid_start_time, @run_dir, @accelerator, @created_at_unix,
           @expires_at_unix_ms, @memory_limit_mib, @memory_image, @layer_tags, @last_branch_tag, @branch_blocked, @live_fork, @cgroup, @ready_ms, @error,
           @metadata, @env_vars, @access_token, @traffic_token, @template_alias, @network, @inbound)`,
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
    this.db.prepare("DELETE FROM sandboxes WHERE id = ?").run(id);
  }

  sandboxes(): SandboxRow[] {
    return this.db.prepare("SELECT * FROM sandboxes ORDER BY created_at_unix, id").all() as SandboxRow[];
  }

  sandbox(id: string): SandboxRow | undefined {
    return this.db.prepare("SELECT * FROM sandboxes WHERE id = ?").get(id) as SandboxRow | undefined;
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

  /** Inserts a "writing" job unless one exists for the tag; false when the tag is already being written. */
  claimSnapshotJob(row: SnapshotJobInput): boolean {
    const tx = this.db.transaction(() => {
      const existing = this.snapshotJob(row.tag);
      if (existing?.status === "writing") return false;
      this.upsertSnapshotJob(row);
      return true;
    });
    return tx();
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
        `INSERT INTO template_aliases (alias, tag, created_at_unix) VALUES (@alias, @tag, @created_at_unix)
         ON CONFLICT(alias) DO UPDATE SET tag = excluded.tag, created_at_unix = excluded.created_at_unix`,
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
