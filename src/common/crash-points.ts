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
