/**
 * Test support: what a forkd home owns on the host, read from the host itself (not from the daemon's view of
 * it), so crash tests can say "nothing leaked". The home's sandbox ids come from its database (rows are written
 * before anything is created, and a restart marks them dead rather than deleting them): for each id the
 * checker looks at the things named after it (QEMU by the identity the daemon recorded, network namespace,
 * veth, host nft rules naming the veth, cgroups (every controller's), run directory and its sockets); for the home as a whole
 * at the snapshot store (staging and half-deleted directories, snapshots without a manifest), the tmpfs and
 * disk RAM-image caches (partial files), the transfers directory and pack scratch directories of dead processes.
 *
 * Other helpers' daemons run on the same machine, so nothing here looks at objects it cannot attribute to
 * this home.
 */
import { execFile } from "node:child_process";
import { access, readdir, readFile, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import Database from "better-sqlite3";
import type { ForkdPaths } from "../../src/common/paths.js";
import { cacheDirs, homeKey } from "../../src/controller/machines/restore-plan.js";
import { detectCgroupLayout, sandboxCgroupDirs } from "../../src/isolation/cgroup.js";
import { sandboxNetNames } from "../../src/net/names.js";
import { processesMentioning } from "./host.js";

const execFileAsync = promisify(execFile);

interface SandboxRecord {
  id: string;
  status: string;
  pid: number | null;
  pid_start_time: number | null;
  run_dir: string;
  network: string;
  cgroup: string | null;
  memory_image: string | null;
}

export interface HomeState {
  /** Every sandbox row of the home's database. */
  sandboxes: SandboxRecord[];
  /** Problems found (empty: nothing leaked and the records agree with the host). */
  problems: string[];
}

/** Reads the home's database read-only (a daemon may hold it open; WAL readers do not block it). */
export function readSandboxRecords(paths: ForkdPaths): SandboxRecord[] {
  const db = new Database(path.join(paths.home, "state.db"), { readonly: true, fileMustExist: true });
  try {
    return db
      .prepare(
        "SELECT id, status, pid, pid_start_time, run_dir, network, cgroup, memory_image FROM sandboxes",
      )
      .all() as SandboxRecord[];
  } finally {
    db.close();
  }
}

/** The database's own view of its consistency (integrity, foreign facts that must agree). */
export function databaseProblems(paths: ForkdPaths): string[] {
  const db = new Database(path.join(paths.home, "state.db"), { readonly: true, fileMustExist: true });
  const problems: string[] = [];
  try {
    const integrity = db.pragma("integrity_check", { simple: true });
    if (integrity !== "ok") problems.push(`integrity_check: ${String(integrity)}`);
    for (const row of db
      .prepare(
        "SELECT n.sandbox_id AS id, n.state AS state, s.status AS status FROM sandbox_networks n LEFT JOIN sandboxes s ON s.id = n.sandbox_id",
      )
      .all() as { id: string; state: string; status: string | null }[]) {
      if (row.status === null || row.status === "dead")
        problems.push(
          `network record of ${row.id} (${row.state}) for a sandbox that is ${row.status ?? "gone"}`,
        );
      else if (row.state !== "ready") problems.push(`network record of ${row.id} left ${row.state}`);
    }
    for (const row of db
      .prepare("SELECT id, status, pid FROM sandboxes WHERE status NOT IN ('running','dead')")
      .all() as { id: string; status: string }[]) {
      problems.push(`sandbox ${row.id} left ${row.status}`);
    }
    for (const row of db.prepare("SELECT tag FROM snapshot_jobs WHERE status = 'writing'").all() as {
      tag: string;
    }[]) {
      problems.push(`snapshot job ${row.tag} still says writing`);
    }
  } finally {
    db.close();
  }
  return problems;
}

/**
 * Everything the home owns on the host that it should not, given its records: `knownIds` adds sandbox ids the
 * test saw that may no longer have a row (a killed sandbox's row is deleted).
 */
export async function inspectHome(
  paths: ForkdPaths,
  knownIds: Iterable<string> = [],
  scratchBefore: ReadonlySet<string> = new Set(),
): Promise<HomeState> {
  const sandboxes = readSandboxRecords(paths);
  const problems: string[] = [];
  const running = new Map(sandboxes.filter((s) => s.status === "running").map((s) => [s.id, s]));
  const ids = new Set([...knownIds, ...sandboxes.map((s) => s.id)]);

  // QEMU: exactly the recorded identity for each running sandbox, nothing else of this home.
  const qemus = await qemuIdentities(paths.home);
  for (const [pid, startTime] of qemus) {
    const owner = [...running.values()].find((s) => s.pid === pid);
    if (!owner) problems.push(`QEMU ${pid} of this home belongs to no running sandbox`);
    else if (owner.pid_start_time !== null && owner.pid_start_time !== startTime)
      problems.push(`QEMU ${pid} is not the process recorded for ${owner.id} (start time)`);
  }
  for (const s of running.values()) {
    if (s.pid === null || !qemus.has(s.pid)) problems.push(`running sandbox ${s.id} has no QEMU`);
  }

  const hostRules = await nftRuleset();
  // Where this home's sandbox cgroups go (every controller's hierarchy), as the daemon computes it.
  const cgroupLayout = await detectCgroupLayout(homeKey(paths.home));
  for (const id of ids) {
    const live = running.get(id);
    const names = sandboxNetNames(id);
    const wantsNetwork = live !== undefined && live.network === "netns";
    const hasNetns = await exists(`/run/netns/${names.netns}`);
    const hasVeth = await exists(`/sys/class/net/${names.veth}`);
    if (hasNetns !== wantsNetwork) problems.push(`netns ${names.netns}: ${hasNetns ? "leaked" : "missing"}`);
    if (hasVeth !== wantsNetwork) problems.push(`veth ${names.veth}: ${hasVeth ? "leaked" : "missing"}`);
    if (!live && hostRules.includes(names.veth)) problems.push(`host nft rules still name ${names.veth}`);
    for (const dir of sandboxCgroupDirs(cgroupLayout, id)) {
      if (!live && (await exists(dir))) problems.push(`cgroup ${dir} leaked`);
    }
  }

  // Run directories (with their QMP/agent sockets): one per running sandbox, nothing else.
  for (const name of await readdir(paths.run).catch(() => [] as string[])) {
    if (running.has(name)) continue;
    problems.push(
      `run directory ${name} leaked (${(await socketsUnder(path.join(paths.run, name))).length} sockets)`,
    );
  }

  // Snapshot store: only complete snapshots.
  for (const name of await readdir(paths.snapshots).catch(() => [] as string[])) {
    if (name.startsWith(".")) problems.push(`snapshot store: ${name} left behind`);
    else if (!(await exists(path.join(paths.snapshots, name, "manifest.json"))))
      problems.push(`snapshot ${name} has no manifest (half written)`);
  }

  const dirs = cacheDirs(paths);
  for (const dir of [dirs.tmpfsDir, dirs.cacheDir]) {
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      if (name.endsWith(".partial"))
        problems.push(`RAM image cache ${dir}: partial file ${name} left behind`);
    }
  }
  for (const name of await readdir(paths.transfers).catch(() => [] as string[])) {
    problems.push(`transfers directory: ${name} left behind`);
  }
  problems.push(...(await deadPackScratch(scratchBefore)));
  return { sandboxes, problems };
}

/** pid -> start time (clock ticks since boot) of running (not zombie) QEMUs whose command line names `home`. */
export async function qemuIdentities(home: string): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (const pid of await processesMentioning(home)) {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
    const comm = /\((.*)\)/.exec(stat)?.[1] ?? "";
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (!comm.startsWith("qemu-system") || fields[0] === "Z") continue;
    out.set(pid, Number(fields[19]));
  }
  return out;
}

/** Pack scratch directories in the temp directory (names only), to tell new ones from other tests' ones. */
export async function packScratchDirs(): Promise<Set<string>> {
  const names = await readdir(os.tmpdir()).catch(() => [] as string[]);
  return new Set(names.filter((n) => n.startsWith("forkd-pack-")));
}

/** Pack scratch directories made since `before` whose writer is gone. */
async function deadPackScratch(before: ReadonlySet<string>): Promise<string[]> {
  const problems: string[] = [];
  for (const name of await packScratchDirs()) {
    if (before.has(name)) continue;
    // forkd-pack-<pid>.<start time>.<boot>-*: other processes' scratch without a token is not ours to judge.
    const pid = /^forkd-pack-(\d+)\.\d+\.[0-9a-f]{8}-/.exec(name)?.[1];
    if (pid !== undefined && !(await exists(`/proc/${pid}`)))
      problems.push(`pack scratch ${name} left behind`);
  }
  return problems;
}

async function socketsUnder(dir: string): Promise<string[]> {
  const found: string[] = [];
  for (const name of await readdir(dir, { recursive: true }).catch(() => [] as string[])) {
    const st = await stat(path.join(dir, String(name))).catch(() => null);
    if (st?.isSocket()) found.push(String(name));
  }
  return found;
}

async function nftRuleset(): Promise<string> {
  return execFileAsync("nft", ["list", "ruleset"], { maxBuffer: 64 << 20 }).then(
    (r) => r.stdout,
    () => "",
  );
}

function exists(file: string): Promise<boolean> {
  return access(file).then(
    () => true,
    () => false,
  );
}
