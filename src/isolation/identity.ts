/**
 * The unprivileged identities QEMU runs as. Every confined QEMU runs as uid = gid = base + its own pid (the
 * launcher computes it; QEMU keeps the launcher's pid). No two live processes share a pid, so no two QEMUs
 * ever share a uid: one sandbox's QEMU cannot signal, ptrace or open another's files even where both could
 * see them, and nothing has to be allocated, recorded or freed for it.
 *
 * The range [base, base + PID_MAX_LIMIT) is reserved for a system user `forkd-vm` in /etc/subuid and
 * /etc/subgid, so `useradd` never hands any of it out as subordinate ids (which would let that user's user
 * namespaces own our QEMUs), and is checked against every account and every other reservation before use.
 */
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { promisify } from "node:util";
import { ForkdError, invalidArgument } from "../common/errors.js";
import { MAX_UID, MIN_UID_BASE } from "./launcher.js";

const execFileAsync = promisify(execFile);

/** The account the range is reserved for (it owns no process and no file; it names the reservation). */
export const VM_USER = "forkd-vm";

/** Default first uid: above systemd's container ranges (which end at 1879048191) and below 2^31. */
export const DEFAULT_VM_UID_BASE = 2_000_000_000;

/** Linux's largest possible pid_max on 64-bit hosts: the range covers every pid a QEMU can ever have. */
export const PID_MAX_LIMIT = 4_194_304;

export interface VmUidRange {
  base: number;
  count: number;
}

/** `FORKD_VM_UID_BASE`, or the default. */
export function vmUidRange(env: NodeJS.ProcessEnv = process.env): VmUidRange {
  const raw = env.FORKD_VM_UID_BASE;
  const base = raw === undefined || raw === "" ? DEFAULT_VM_UID_BASE : Number(raw);
  if (!Number.isInteger(base) || base < MIN_UID_BASE || base + PID_MAX_LIMIT - 1 > MAX_UID) {
    throw invalidArgument(
      `FORKD_VM_UID_BASE must be an integer in ${MIN_UID_BASE}..${MAX_UID - PID_MAX_LIMIT + 1}, got ${JSON.stringify(raw)}`,
    );
  }
  return { base, count: PID_MAX_LIMIT };
}

/** The uid (and gid) a confined QEMU with pid `pid` runs as. */
export function vmUidOf(range: VmUidRange, pid: number): number {
  return range.base + pid;
}

/** The real uid of a live process (from /proc), e.g. to hand a socket over to a QEMU we re-attached to. */
export async function processUid(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const uid = /^Uid:\s+(\d+)/m.exec(status)?.[1];
  if (uid === undefined) throw new ForkdError("internal", `no Uid line in /proc/${pid}/status`);
  return Number(uid);
}

export interface IdentityStatus {
  user: string;
  range: VmUidRange;
  /** The reservation is in /etc/subuid and /etc/subgid. */
  reserved: boolean;
  /** Accounts, groups or other reservations inside the range (each one is a reason to refuse it). */
  conflicts: string[];
}

/** What /etc says about the range (read-only; for `forkd doctor` and before use). */
export function identityStatus(range: VmUidRange, etc = "/etc"): Promise<IdentityStatus> {
  return reservationStatus(VM_USER, range, etc);
}

/** What /etc says about `user`'s reservation of `range`: whether it is there, and what else uses those ids. */
export async function reservationStatus(
  user: string,
  range: VmUidRange,
  etc = "/etc",
): Promise<IdentityStatus> {
  const [passwd, group, subuid, subgid] = await Promise.all(
    ["passwd", "group", "subuid", "subgid"].map((f) => readFile(`${etc}/${f}`, "utf8").catch(() => "")),
  );
  const end = range.base + range.count;
  const inRange = (id: number) => id >= range.base && id < end;
  const conflicts: string[] = [];
  for (const [file, text] of [
    ["passwd", passwd],
    ["group", group],
  ] as const) {
    for (const line of (text ?? "").split("\n")) {
      const [name, , id] = line.split(":");
      if (name && id !== undefined && /^\d+$/.test(id) && inRange(Number(id))) {
        conflicts.push(`${file}: ${name} has id ${id}`);
      }
    }
  }
  let reserved = true;
  for (const [file, text] of [
    ["subuid", subuid],
    ["subgid", subgid],
  ] as const) {
    let ours = false;
    for (const line of (text ?? "").split("\n")) {
      const [owner, startText, countText] = line.split(":");
      if (!owner || !/^\d+$/.test(startText ?? "") || !/^\d+$/.test(countText ?? "")) continue;
      const start = Number(startText);
      const stop = start + Number(countText);
      if (owner === user && start === range.base && stop === end) ours = true;
      else if (start < end && stop > range.base) {
        conflicts.push(
          `${file}: ${owner} has ${start}..${stop - 1}, which overlaps ${range.base}..${end - 1}`,
        );
      }
    }
    reserved &&= ours;
  }
  return { user, range, reserved, conflicts };
}

/**
 * Creates the `forkd-vm` system user and reserves the range for it, idempotently (scripts/install-deps.sh does
 * the same). Refuses (`conflict`) a range some account or reservation already uses: anyone owning one of those
 * ids could signal or ptrace a QEMU. Once per process.
 */
export function ensureVmIdentity(range: VmUidRange): Promise<IdentityStatus> {
  return ensureReservation(
    VM_USER,
    range,
    "forkd reserves the uid range of sandboxed QEMUs",
    "FORKD_VM_UID_BASE",
  );
}

const ensured = new Map<string, Promise<IdentityStatus>>();

/**
 * Creates the system user `user` (no home, no shell, owning nothing) and reserves `range` for it in
 * /etc/subuid and /etc/subgid, idempotently; refuses (`conflict`) a range some account or reservation already
 * uses. Once per user and process. `setting` names the variable that moves the range, for the error.
 */
export function ensureReservation(
  user: string,
  range: VmUidRange,
  comment: string,
  setting: string,
): Promise<IdentityStatus> {
  const key = `${user}:${range.base}:${range.count}`;
  let done = ensured.get(key);
  if (done) return done;
  done = (async () => {
    const before = await reservationStatus(user, range);
    if (before.conflicts.length > 0) throw rangeConflict(user, range, before.conflicts, setting);
    if (before.reserved) return before;
    const exists = await execFileAsync("getent", ["passwd", user]).then(
      () => true,
      () => false,
    );
    if (!exists) {
      await execFileAsync("useradd", [
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        "--comment",
        comment,
        user,
      ]).catch((err: unknown) => {
        throw new ForkdError("unavailable", `cannot create the ${user} user: ${String(err)}`);
      });
    }
    const span = `${range.base}-${range.base + range.count - 1}`;
    await execFileAsync("usermod", ["--add-subuids", span, "--add-subgids", span, user]).catch(
      (err: unknown) => {
        throw new ForkdError("unavailable", `cannot reserve uids ${span} for ${user}: ${String(err)}`);
      },
    );
    const after = await reservationStatus(user, range);
    if (after.conflicts.length > 0) throw rangeConflict(user, range, after.conflicts, setting);
    return after;
  })();
  ensured.set(key, done);
  done.catch(() => ensured.delete(key));
  return done;
}

function rangeConflict(user: string, range: VmUidRange, conflicts: string[], setting: string): ForkdError {
  return new ForkdError(
    "conflict",
    `the uid range ${range.base}..${range.base + range.count - 1} reserved for ${user} is already in use ` +
      `(${conflicts.join("; ")}); choose another with ${setting}`,
  );
}
