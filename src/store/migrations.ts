/**
 * The state database's schema, one migration per version: MIGRATIONS[i] brings a database at version i to i + 1.
 * A migration is never edited once released; a change of schema is a new entry at the end.
 */
import type Database from "better-sqlite3";

type Migration = (db: Database.Database) => void;

export const MIGRATIONS: readonly Migration[] = [
  // 1: sandboxes and the snapshots being written.
  (db) => {
    db.exec(`
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
  },
  // 2: facts about the state as a whole; writers' start times.
  (db) => {
    // meta: facts about the state as a whole (the boot the recorded process identities belong to).
    db.exec(`
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    ALTER TABLE snapshot_jobs ADD COLUMN writer_start_time INTEGER;
  `);
  },
  // 3: E2B: metadata, env vars, tokens, template aliases, ephemeral snapshots.
  (db) => {
    db.exec(`
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
  },
  // 4: per-sandbox networks.
  (db) => {
    db.exec(`
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
  },
  // 5: inbound (public traffic) settings.
  (db) => {
    // Rows from before keep E2B's defaults: public traffic, the request's own Host, plain HTTP.
    db.exec(`ALTER TABLE sandboxes ADD COLUMN inbound TEXT NOT NULL DEFAULT '{}';`);
  },
  // 6: pauses and workspaces.
  migrateToPauses,
  // 7: per-sandbox limits.
  (db) => {
    db.exec(`ALTER TABLE sandboxes ADD COLUMN limits TEXT NOT NULL DEFAULT '{}';`);
  },
  // 8: tenancy.
  (db) => {
    // Tenancy: NULL owner = an admin's (every row from before). Snapshots have no table of their own (they
    // live on disk): snapshot_owners holds a row for each tenant's snapshot, none for an admin's.
    db.exec(`
    ALTER TABLE sandboxes ADD COLUMN owner TEXT;
    ALTER TABLE template_aliases ADD COLUMN owner TEXT;
    CREATE TABLE snapshot_owners (tag TEXT PRIMARY KEY, owner TEXT NOT NULL);
  `);
  },
  // 9: filesystem-only pauses (E2B's memory: false).
  (db) => {
    // kept_disk: the disk a filesystem-only pause kept (set: paused without memory, resumed by a cold boot).
    // cold_booted: 1 once it runs from such a cold boot (its RAM is no snapshot's). auto_pause_memory: 0 when
    // the end of its lifetime pauses it without memory.
    db.exec(`
    ALTER TABLE sandboxes ADD COLUMN kept_disk TEXT;
    ALTER TABLE sandboxes ADD COLUMN cold_booted INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sandboxes ADD COLUMN auto_pause_memory INTEGER NOT NULL DEFAULT 1;
  `);
  },
];

/**
 * Schema 6: sandboxes can be paused (new states, so the table is rebuilt: SQLite cannot change a CHECK), their
 * lifetime and what its end does are kept for resumes, and forkd v0.5's workspaces name sandboxes.
 */
function migrateToPauses(db: Database.Database): void {
  const columns = (db.prepare("PRAGMA table_info(sandboxes)").all() as { name: string }[])
    .map((c) => c.name)
    .join(", ");
  db.transaction(() => {
    db.exec(`
      CREATE TABLE sandboxes_v6 (
        id TEXT PRIMARY KEY,
        snapshot_tag TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN
          ('starting','running','pausing','paused','resuming','stopping','dead')),
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
        error TEXT,
        metadata TEXT NOT NULL DEFAULT '{}',
        env_vars TEXT NOT NULL DEFAULT '{}',
        access_token TEXT,
        traffic_token TEXT,
        template_alias TEXT,
        network TEXT NOT NULL DEFAULT 'none',
        inbound TEXT NOT NULL DEFAULT '{}',
        pause_tags TEXT NOT NULL DEFAULT '[]',
        pending_pause_tag TEXT,
        memory_tag TEXT,
        timeout_ms INTEGER,
        on_timeout TEXT NOT NULL DEFAULT 'kill' CHECK (on_timeout IN ('kill','pause')),
        auto_resume INTEGER NOT NULL DEFAULT 0,
        paused_at_unix_ms INTEGER
      );
      INSERT INTO sandboxes_v6 (${columns}) SELECT ${columns} FROM sandboxes;
      DROP TABLE sandboxes;
      ALTER TABLE sandboxes_v6 RENAME TO sandboxes;
      CREATE INDEX sandboxes_by_tag ON sandboxes (snapshot_tag);
      CREATE TABLE workspaces (
        name TEXT PRIMARY KEY,
        sandbox_id TEXT NOT NULL UNIQUE,
        source_snapshot_tag TEXT NOT NULL,
        created_at_unix INTEGER NOT NULL,
        last_active_unix INTEGER NOT NULL
      );
    `);
  })();
}
