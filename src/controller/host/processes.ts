/**
 * Finding and stopping QEMU processes this daemon did not start itself (they outlived a previous daemon). A
 * process is only ever signalled once it is proven ours: its identity (pid, start time, boot) must match what we
 * recorded, checked through a pidfd so the pid cannot be reused between the check and the signal.
 */
import { closeSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { constants } from "node:os";
import { sleep } from "../../common/deadline.js";
import { currentBootId, identityOf, isAlive, type ProcessIdentity } from "../../common/processes.js";

export { processStartTime, procStatFields } from "../../common/processes.js";

interface PidfdCalls {
  open(pid: number): number;
  sendSignal(pidfd: number, signal: number): number;
  errno(): number;
}

const ESRCH = 3;
let pidfdCalls: PidfdCalls | null | undefined;

/** pidfd_open/pidfd_send_signal from libc (glibc >= 2.36) through koffi; null where the kernel or libc lacks them. */
function pidfd(): PidfdCalls | null {
  if (pidfdCalls !== undefined) return pidfdCalls;
  try {
    const koffi = createRequire(import.meta.url)("koffi") as typeof import("koffi");
    const libc = koffi.load("libc.so.6");
    const open = libc.func("int pidfd_open(int pid, unsigned int flags)") as (
      pid: number,
      flags: number,
    ) => number;
    const send = libc.func("int pidfd_send_signal(int pidfd, int sig, void *info, unsigned int flags)") as (
      fd: number,
      sig: number,
      info: null,
      flags: number,
    ) => number;
    pidfdCalls = {
      open: (pid) => open(pid, 0),
      sendSignal: (fd, sig) => send(fd, sig, null, 0),
      errno: () => koffi.errno() as number,
    };
  } catch {
    pidfdCalls = null;
  }
  return pidfdCalls;
}

/**
 * Sends `signal` to the process `identity` describes, if it is still that process. Returns false (and signals
 * nothing) when it is gone, a zombie, or its pid now belongs to another process.
 */
export async function signalIfOurs(identity: ProcessIdentity, signal: NodeJS.Signals): Promise<boolean> {
  const number = constants.signals[signal];
  const calls = pidfd();
  if (calls === null) {
    // Without pidfds the check and the signal are two steps; the window is microseconds, not a daemon restart.
    if (!(await isAlive(identity))) return false;
    try {
      process.kill(identity.pid, signal);
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ESRCH") return false;
      throw err;
    }
  }
  const fd = calls.open(identity.pid);
  if (fd < 0) return false; // ESRCH: no such process
  try {
    // The pidfd pins the process: if it matches now, the signal below reaches this very process.
    if (!(await isAlive(identity))) return false;
    if (calls.sendSignal(fd, number) === 0) return true;
    if (calls.errno() === ESRCH) return false;
    throw new Error(`pidfd_send_signal(${identity.pid}, ${signal}) failed: errno ${calls.errno()}`);
  } finally {
    closeSync(fd);
  }
}

/** True when `identity` is alive and its command line mentions `needle`. */
export async function isOurProcess(identity: ProcessIdentity, needle: string): Promise<boolean> {
  if (!(await isAlive(identity))) return false;
  const cmdline = await readFile(`/proc/${identity.pid}/cmdline`, "utf8").catch(() => "");
  return cmdline.replaceAll("\0", " ").includes(needle);
}

/** Live processes whose command line mentions `needle` (e.g. a sandbox's run directory), with their identities. */
export async function processesMentioning(needle: string): Promise<ProcessIdentity[]> {
  const found: ProcessIdentity[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    const identity = await identityOf(pid);
    if (identity === null) continue;
    const cmdline = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    // Identity read before the command line: if the pid was reused in between, the signal is refused later.
    if (cmdline.replaceAll("\0", " ").includes(needle)) found.push(identity);
  }
  return found;
}

/**
 * SIGKILLs the process `identity` describes, if it is still ours, and waits (bounded) until it is gone. Not our
 * child, so we cannot wait() for it: "gone" is read from /proc, where an unreaped zombie counts as gone.
 */
export async function killAndWait(identity: ProcessIdentity, timeoutMs = 10_000): Promise<void> {
  if (!(await signalIfOurs(identity, "SIGKILL"))) return;
  const deadline = Date.now() + timeoutMs;
  while (await isAlive(identity)) {
    if (Date.now() > deadline) return;
    await sleep(10);
  }
}

/** The identity recorded for a sandbox row (pid + start time from this boot), or null if none was recorded. */
export function recordedIdentity(
  pid: number | null,
  startTime: number | null,
  bootId: string | null,
): ProcessIdentity | null {
  if (pid === null || startTime === null) return null;
  return { pid, startTime, bootId: bootId ?? currentBootId() };
}
