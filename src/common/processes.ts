/**
 * Who a process is, from /proc: a pid names a process only until it exits and the number is reused, so every
 * layer that records a process (the daemon's sandboxes, staging directories, image builds, snapshot jobs)
 * records its identity — pid, start time (clock ticks since boot) and the boot it started in — and compares all
 * three before it believes the process is still the one it recorded. A zombie (exited, not yet reaped; this
 * host's PID 1 does not reap orphans) is not alive: its start time still matches but it will never run again.
 */
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";

export interface ProcessIdentity {
  pid: number;
  /** /proc/<pid>/stat field 22. */
  startTime: number;
  /** /proc/sys/kernel/random/boot_id of the boot it started in. */
  bootId: string;
}

let bootIdValue: string | undefined;

/** This boot's id: start times count from boot, so they only compare within one. */
export function currentBootId(): string {
  bootIdValue ??= readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
  return bootIdValue;
}

/**
 * The fields of /proc/<pid>/stat from field 3 (state) on, so `fields[n]` is field n + 3; null if the process is
 * gone. The command name (field 2) may contain spaces and parentheses: the split starts after its last ")".
 */
export async function procStatFields(pid: number): Promise<string[] | null> {
  if (!Number.isInteger(pid) || pid <= 0) return null;
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return null;
  }
}

/** Field 22 of /proc/<pid>/stat, or null when the process is gone or a zombie (it has exited). */
export async function processStartTime(pid: number): Promise<number | null> {
  const fields = await procStatFields(pid);
  const state = fields?.[0];
  if (!fields || state === "Z" || state === "X") return null;
  return Number(fields[19]);
}

/** The identity of a live process, or null if `pid` is not a running process. */
export async function identityOf(pid: number): Promise<ProcessIdentity | null> {
  const startTime = await processStartTime(pid);
  return startTime === null ? null : { pid, startTime, bootId: currentBootId() };
}

/** True while the process `identity` describes is running (not exited, not a zombie, not a reused pid). */
export async function isAlive(identity: ProcessIdentity): Promise<boolean> {
  if (identity.bootId !== currentBootId()) return false;
  return (await processStartTime(identity.pid)) === identity.startTime;
}

/**
 * Parses an identity stored as JSON; null for anything that is not one. Older forkd wrote `{pid, startTime}` with
 * the start time as a string and no boot: read as this boot's, so a live older writer is not taken for dead.
 */
export function parseIdentity(value: unknown): ProcessIdentity | null {
  if (typeof value !== "object" || value === null) return null;
  const { pid, startTime, bootId } = value as Record<string, unknown>;
  if (!Number.isInteger(pid) || (pid as number) <= 0) return null;
  const start = typeof startTime === "string" && /^\d+$/.test(startTime) ? Number(startTime) : startTime;
  if (!Number.isInteger(start)) return null;
  if (bootId !== undefined && typeof bootId !== "string") return null;
  return { pid: pid as number, startTime: start as number, bootId: bootId ?? currentBootId() };
}

/**
 * An identity as JSON, with the start time as a string: the form older forkd reads too, so processes of two
 * versions sharing a directory (the image cache) never take each other's work for a dead writer's.
 */
export function identityJson(identity: ProcessIdentity): string {
  return JSON.stringify({ ...identity, startTime: String(identity.startTime) });
}

/**
 * This process as a component of a file name ("<pid>.<start time>.<boot>"): directories and files a process
 * leaves behind while it works (staging directories, overlay templates) carry it, so a sweep can tell a live
 * writer from a dead one without trusting a bare pid.
 */
export function selfOwnerToken(): string {
  selfToken ??= `${process.pid}.${readSelfStartTime()}.${currentBootId().replaceAll("-", "").slice(0, 8)}`;
  return selfToken;
}
let selfToken: string | undefined;

/** Matches an owner token inside a name. */
export const OWNER_TOKEN_PATTERN = "(\\d+)\\.(\\d+)\\.([0-9a-f]{8})";

/** True while the process a token (from selfOwnerToken) names is alive. False for anything unparseable. */
export async function ownerTokenAlive(token: string): Promise<boolean> {
  const match = new RegExp(`^${OWNER_TOKEN_PATTERN}$`).exec(token);
  if (!match) return false;
  const [, pid, startTime, boot] = match;
  if (boot !== currentBootId().replaceAll("-", "").slice(0, 8)) return false;
  return (await processStartTime(Number(pid))) === Number(startTime);
}

/** This process's own identity. */
export function selfIdentity(): ProcessIdentity {
  return { pid: process.pid, startTime: readSelfStartTime(), bootId: currentBootId() };
}

function readSelfStartTime(): number {
  const stat = readFileSync(`/proc/${process.pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]);
}
