/**
 * Named crash points: `FORKD_CRASH_AT=<point>[@<n>][,<point>[@<n>]...]` makes the process SIGKILL itself the
 * n-th time (default: the first) it reaches that point. Crash-safety tests use it to kill the daemon at an exact
 * step of an operation, then check that a restarted daemon finds every sandbox in one of its states and nothing
 * leaked. Every point is declared here, once, so a misspelt name in the environment is refused at start-up
 * instead of silently never firing.
 *
 * SIGKILL, not an exception or exit(): nothing may run after the point (no finally blocks, no exit handlers, no
 * flushes), exactly as when the host's OOM killer or an operator's `kill -9` strikes.
 */

/** Every crash point, with the step it marks. Add new operations' points here. */
export const CRASH_POINTS = {
  "spawn.recorded": "spawn: the sandboxes are recorded (starting), nothing created yet",
  "spawn.planned": "spawn: the restore plan (overlay template, memory image) is ready, no network or VM yet",
  "spawn.limited": "spawn: a sandbox's cgroups exist (recorded with its row), no QEMU yet",
  "spawn.launched": "spawn: a QEMU is running (in its cgroups) and its identity recorded, not yet answering",
  "spawn.restored": "spawn: a child answered its restore, the database still says starting",
  "spawn.running": "spawn: the database says running, the call not yet answered",
  "net.recorded": "network setup: the namespace is recorded (creating), nothing created yet",
  "net.linked": "network setup: the namespace and its veth exist, nothing configured inside",
  "net.configured": "network setup: addresses, tap and routes are set, no nft rules yet",
  "net.ruled": "network setup: the nft rules are loaded, the database still says creating",
  "snapshot.claimed": "snapshot: the job row says writing, nothing staged",
  "snapshot.staged": "snapshot: the staging directory exists, no parent VM yet",
  "snapshot.booted": "snapshot: the parent VM booted and ran its warm-up, no device state saved",
  "snapshot.saved": "snapshot: the device state is saved, the parent VM not yet killed",
  "snapshot.committed": "snapshot: the snapshot is published, the job row still says writing",
  "branch.claimed": "BRANCH: the job row says writing, nothing staged",
  "branch.prepared":
    "BRANCH: the staging directory and the source's next overlay exist, the source not yet marked",
  "branch.marked": "BRANCH: the source is marked as branching, its VM still running",
  "branch.stopped": "BRANCH: the source's VM is stopped and its disk switched to the new overlay",
  "branch.captured": "BRANCH: the source runs again, the captured pages are held in memory only",
  "branch.written": "BRANCH: the layer's files are in the staging directory, not committed",
  "branch.committed": "BRANCH: the snapshot is published, the source's record not yet updated",
  "diff.spawned": "snapshot-diff: its sandbox runs, the command not yet run",
  "diff.ran": "snapshot-diff: the command ran, the sandbox not yet branched",
  "diff.branched": "snapshot-diff: the layer is committed, its sandbox not yet killed",
  "compact.claimed": "compact: the job row says writing, nothing staged",
  "compact.staged": "compact: the staging directory exists, nothing written",
  "compact.written": "compact: the flat files are in the staging directory, not committed",
  "compact.committed": "compact: the snapshot is published, the job row still says writing",
  "pack.verified": "pack: every file is verified, no archive written",
  "pack.writing": "pack: the partial archive file is open, nothing renamed into place",
  "pack.written": "pack: the archive is in place, the call not yet answered",
  "unpack.received": "unpack: the pack file is received, nothing staged",
  "unpack.read": "unpack: every entry is staged and verified, nothing published",
  "unpack.image": "unpack: the guest image is published, no layer yet",
  "unpack.layer": "unpack: a layer is renamed into place (the ones above it not yet)",
  "unpack.published": "unpack: every layer is published, displaced ones not yet removed",
  "pause.stopped": "pause: the VM is stopped, nothing of its state written yet",
  "pause.captured": "pause: the memory layer and device state are staged, the snapshot not yet published",
  "pause.published": "pause: the snapshot layer is published, the database still says pausing",
  "pause.recorded": "pause: the database says paused, the VM not yet killed",
  "pause.merged": "pause: a merged layer is published, the sandbox not yet switched onto it",
  "resume.started": "resume: the database says resuming, no VM started yet",
  "resume.launched": "resume: the VM is started, its pages not yet written",
  "resume.restored": "resume: the guest answered its restore, the database still says resuming",
  "resume.recorded": "resume: the database says running, the call not yet answered",
} as const;

export type CrashPoint = keyof typeof CRASH_POINTS;

export const CRASH_AT_ENV = "FORKD_CRASH_AT";

interface Armed {
  point: CrashPoint;
  /** Crash on this hit (1 = the first). */
  hit: number;
}

let armed: Armed[] | undefined;
const hits = new Map<CrashPoint, number>();

/** Parses `FORKD_CRASH_AT`; throws naming the bad entry (an unknown point, a bad count). */
export function parseCrashPoints(value: string | undefined): Armed[] {
  if (value === undefined || value.trim() === "") return [];
  return value.split(",").map((entry) => {
    const match = /^([a-z]+\.[a-z-]+)(?:@([1-9]\d{0,5}))?$/.exec(entry.trim());
    const point = match?.[1];
    if (!match || point === undefined || !Object.hasOwn(CRASH_POINTS, point)) {
      throw new Error(
        `${CRASH_AT_ENV}: ${JSON.stringify(entry)} is not a crash point (known: ${Object.keys(CRASH_POINTS).join(", ")}; optionally @<n>)`,
      );
    }
    return { point: point as CrashPoint, hit: match[2] === undefined ? 1 : Number(match[2]) };
  });
}

/** Checks the environment once at start-up (the daemon calls it), so a typo fails loudly. */
export function armCrashPoints(env: NodeJS.ProcessEnv = process.env): readonly Armed[] {
  armed = parseCrashPoints(env[CRASH_AT_ENV]);
  return armed;
}

/** SIGKILLs this process if `point` is armed for this hit. A no-op (one map lookup) otherwise. */
export function crashPoint(point: CrashPoint): void {
  armed ??= parseCrashPoints(process.env[CRASH_AT_ENV]);
  if (armed.length === 0) return;
  const hit = (hits.get(point) ?? 0) + 1;
  hits.set(point, hit);
  if (armed.some((a) => a.point === point && a.hit === hit)) process.kill(process.pid, "SIGKILL");
}
