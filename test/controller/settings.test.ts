/**
 * What a caller attaches to sandboxes (metadata, env vars, access tokens) and how template names resolve
 * (aliases over tags, E2B's default names to the default snapshot), on a real SQLite state database and a real
 * snapshot directory; and the state database's migration from schema 1.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import Database from "better-sqlite3";
import { ForkdError } from "../../src/common/errors.js";
import {
  layerEnv,
  newAccessToken,
  tokenMatches,
  validateEnvVars,
  validateMetadata,
} from "../../src/controller/sandboxes/settings.js";
import { TemplateAliases } from "../../src/controller/snapshots/template-aliases.js";
import { SCHEMA_VERSION, StateDb } from "../../src/store/db.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";

const refused = (fn: () => unknown, pattern: RegExp) =>
  assert.throws(
    fn,
    (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument" && pattern.test(e.message),
  );

describe("sandbox settings", () => {
  it("validates metadata and env vars, naming what is wrong", () => {
    assert.deepEqual(validateMetadata({ a: "1" }), { a: "1" });
    assert.deepEqual(validateMetadata(undefined), {});
    refused(() => validateMetadata({ a: 1 }), /metadata\.a must be a string/);
    refused(() => validateMetadata(["x"]), /object of strings/);
    refused(() => validateMetadata({ "": "x" }), /1\.\.128 characters/);
    refused(
      () => validateMetadata(Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"]))),
      /65 entries/,
    );
    assert.deepEqual(validateEnvVars({ PATH_EXTRA: "/x" }), { PATH_EXTRA: "/x" });
    refused(() => validateEnvVars({ "1BAD": "x" }), /must match/);
    refused(() => validateEnvVars({ A: "nul\0byte" }), /without NUL/);
    refused(() => validateEnvVars({ BIG: "x".repeat(30_000) }), /bytes as JSON/);
  });

  it("lays the sandbox's env vars under a call's (the call wins)", () => {
    assert.deepEqual(layerEnv({ A: "sandbox", B: "sandbox" }, { B: "call" }), { A: "sandbox", B: "call" });
    assert.equal(layerEnv({}, undefined), undefined);
  });

  it("makes distinct tokens and matches only the right one", () => {
    const token = newAccessToken();
    assert.notEqual(token, newAccessToken());
    assert.ok(token.length >= 32);
    assert.equal(tokenMatches(token, token), true);
    assert.equal(tokenMatches(`${token}x`, token), false);
    assert.equal(tokenMatches(undefined, token), false);
    assert.equal(tokenMatches("", token), false);
    assert.equal(tokenMatches(token, null), false);
  });
});

describe("template aliases", () => {
  let dir: string;
  let db: StateDb;
  let store: SnapshotStore;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-aliases-"));
    db = new StateDb(path.join(dir, "state.db"));
    store = new SnapshotStore(path.join(dir, "snapshots"));
    for (const tag of ["pyagent", "other", "base"]) await mkdir(store.dirOf(tag), { recursive: true });
  });
  after(async () => {
    db.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("resolves an alias before a tag of the same name, and tags as themselves", async () => {
    const aliases = new TemplateAliases(db, store);
    assert.deepEqual(await aliases.resolve("other"), { tag: "other", alias: null });
    await aliases.set("team/agent:v2", "other");
    assert.deepEqual(await aliases.resolve("team/agent:v2"), { tag: "other", alias: "team/agent:v2" });
    await aliases.set("base", "other");
    assert.equal((await aliases.resolve("base")).tag, "other", "an alias wins over the tag `base`");
    aliases.delete("base");
    assert.deepEqual(aliases.namesOf("other"), ["team/agent:v2"]);
    await assert.rejects(
      aliases.set("x", "missing"),
      (e: unknown) => e instanceof ForkdError && e.code === "not_found",
    );
    await assert.rejects(aliases.set("bad alias", "other"), /invalid template alias/);
  });

  it("maps default names to the default snapshot (configured, else pyagent), and says when there is none", async () => {
    assert.equal(
      (await new TemplateAliases(db, store).resolve("code-interpreter-v1", { orDefault: true })).tag,
      "pyagent",
    );
    assert.equal(
      (await new TemplateAliases(db, store, "other").resolve("code-interpreter-v1", { orDefault: true })).tag,
      "other",
    );
    await assert.rejects(
      new TemplateAliases(db, store, "gone").resolve("code-interpreter-v1", { orDefault: true }),
      /no default snapshot|there is none/,
    );
    await assert.rejects(new TemplateAliases(db, store).resolve("code-interpreter-v1"), /not found/);
  });
});

describe("state database", () => {
  it("migrates a schema 1 database, keeping its rows", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-migrate-"));
    try {
      const file = path.join(dir, "state.db");
      const old = new Database(file);
      old.exec(`
        CREATE TABLE sandboxes (id TEXT PRIMARY KEY, snapshot_tag TEXT NOT NULL, status TEXT NOT NULL, pid INTEGER,
          pid_start_time INTEGER, run_dir TEXT NOT NULL, accelerator TEXT NOT NULL, created_at_unix INTEGER NOT NULL,
          expires_at_unix_ms INTEGER, memory_limit_mib INTEGER, memory_image TEXT, layer_tags TEXT NOT NULL DEFAULT '[]',
          last_branch_tag TEXT, branch_blocked TEXT, live_fork INTEGER NOT NULL DEFAULT 0, cgroup TEXT, ready_ms REAL,
          error TEXT);
        CREATE TABLE snapshot_jobs (tag TEXT PRIMARY KEY, status TEXT NOT NULL, kind TEXT NOT NULL,
          started_at_unix INTEGER NOT NULL, writer_pid INTEGER NOT NULL, error TEXT);
        INSERT INTO sandboxes (id, snapshot_tag, status, run_dir, accelerator, created_at_unix)
          VALUES ('sb-0123456789ab', 'pyagent', 'running', '/r', 'tcg', 1);
        PRAGMA user_version = 1;`);
      old.close();
      const db = new StateDb(file);
      const row = db.sandbox("sb-0123456789ab");
      assert.equal(row?.metadata, "{}");
      assert.equal(row?.env_vars, "{}");
      assert.equal(row?.access_token, null);
      db.setAlias({ alias: "a", tag: "pyagent", created_at_unix: 1, owner: null });
      assert.equal(db.alias("a")?.tag, "pyagent");
      // v8: rows from before tenants are an admin's.
      assert.equal(row?.owner, null);
      db.close();
      const check = new Database(file);
      assert.equal(check.pragma("user_version", { simple: true }), SCHEMA_VERSION);
      check.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("records a snapshot's owner with its claim, and a new claim of the tag replaces it", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-owners-"));
    try {
      const db = new StateDb(path.join(dir, "state.db"));
      const claim = (tag: string, owner: string | null) =>
        db.claimSnapshotJob({
          tag,
          status: "writing",
          kind: "branch-diff",
          started_at_unix: 1,
          error: null,
          owner,
        });
      assert.equal(claim("t1", "alice"), true);
      assert.deepEqual([...db.snapshotOwners()], [["t1", "alice"]]);
      // A second claim while it is being written is refused and changes nothing.
      assert.equal(claim("t1", "bob"), false);
      assert.equal(db.snapshotOwners().get("t1"), "alice");
      // Once the tag is free again, whoever claims it next owns it (an admin: no row).
      db.deleteSnapshotJob("t1");
      assert.equal(claim("t1", null), true);
      assert.equal(db.snapshotOwners().has("t1"), false);
      db.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
