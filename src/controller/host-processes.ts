/**
 * Finding and stopping QEMU processes this daemon did not start itself (they outlived a previous daemon):
 * identified by pid plus start time, so a re-used pid is never mistaken for our VM.
 */
import { readdir, readFile } from "node:fs/promises";
import { sleep } from "../common/deadline.js";

/**
 * The fields of /proc/<pid>/stat from field 3 (state) on, so `fields[n]` is field n + 3; null if the process is
 * gone. The command name (field 2) may contain spaces and parentheses: the split starts after its last ")".
 */
export async function procStatFields(pid: number): Promise<string[] | null> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return null;
  }
}

/** Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), or null if the process is gone. */
export async function processStartTime(pid: number): Promise<number | null> {
  const fields = await procStatFields(pid);
  const state = fields?.[0];
  if (!fields || state === "Z" || state === "X") return null;
  return Number(fields[19]);
}

/** True when `pid` is alive, started at `startTime`, and its command line mentions `needle`. */
export async function isOurProcess(pid: number, startTime: number, needle: string): Promise<boolean> {
  if ((await processStartTime(pid)) !== startTime) return false;
  const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
  return cmdline.replaceAll("\0", " ").includes(needle);
}

/** Pids of live processes whose command line mentions `needle` (e.g. a sandbox's run directory). */
export async function processesMentioning(needle: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    const cmdline = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    if (cmdline.replaceAll("\0", " ").includes(needle) && (await processStartTime(pid)) !== null)
      found.push(pid);
  }
  return found;
}

/** SIGKILLs `pid` and waits (bounded) until it is gone. Not our child, so we cannot wait() for it. */
export async function killAndWait(pid: number, timeoutMs = 10_000): Promise<void> {
  try {
    process.kill(pid, "SIGKILL");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ESRCH") return;
    throw err;
  }
  const deadline = Date.now() + timeoutMs;
  while ((await processStartTime(pid)) !== null) {
    if (Date.now() > deadline) return;
    await sleep(10);
  }
}
