/**
 * The local cluster's processes: started detached (they outlive `up`), their output in a log file each, and
 * known afterwards by pid and start time (field 22 of /proc/<pid>/stat), so `down` and the fault helpers signal
 * only a process proven to be the one they started, never a later process that reused its pid.
 */
import { spawn } from "node:child_process";
import { open, readdir, readFile } from "node:fs/promises";

export interface ProcessRecord {
  name: string;
  pid: number;
  /** Clock ticks since boot when it started (/proc/<pid>/stat field 22). */
  startTicks: number;
  log: string;
  command: string[];
}

export async function startTicksOf(pid: number): Promise<number | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const ticks = Number(fields[19]);
    return Number.isFinite(ticks) ? ticks : undefined;
  } catch {
    return undefined;
  }
}

/** Whether `record`'s process is still the one that was started (same pid, same start time, not a zombie). */
export async function isRunning(record: ProcessRecord): Promise<boolean> {
  const ticks = await startTicksOf(record.pid);
  if (ticks !== record.startTicks) return false;
  const stat = await readFile(`/proc/${record.pid}/stat`, "utf8").catch(() => "");
  return !/\) Z /.test(stat);
}

export async function startDetached(
  name: string,
  command: string[],
  options: { log: string; env?: NodeJS.ProcessEnv; cwd?: string },
): Promise<ProcessRecord> {
  const out = await open(options.log, "a", 0o600);
  try {
    const [file, ...args] = command as [string, ...string[]];
    const child = spawn(file, args, {
      detached: true,
      stdio: ["ignore", out.fd, out.fd],
      env: options.env ?? process.env,
      cwd: options.cwd,
    });
    await new Promise<void>((resolve, reject) => {
      child.once("spawn", resolve);
      child.once("error", (err) => reject(new Error(`cannot start ${name} (${file}): ${err.message}`)));
    });
    child.unref();
    const pid = child.pid as number;
    const startTicks = await startTicksOf(pid);
    if (startTicks === undefined) throw new Error(`${name} exited at once; see ${options.log}`);
    return { name, pid, startTicks, log: options.log, command };
  } finally {
    await out.close();
  }
}

/** Sends `signal` if the process is still the one recorded; true if it was. */
export async function signalRecorded(record: ProcessRecord, signal: NodeJS.Signals): Promise<boolean> {
  if (!(await isRunning(record))) return false;
  try {
    process.kill(record.pid, signal);
    return true;
  } catch {
    return false;
  }
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves once it is gone. */
export async function stopRecorded(record: ProcessRecord, graceMs = 10_000): Promise<void> {
  if (!(await signalRecorded(record, "SIGTERM"))) return;
  const deadline = Date.now() + graceMs;
  while (await isRunning(record)) {
    if (Date.now() > deadline) {
      await signalRecorded(record, "SIGKILL");
      await waitGone(record, 5_000);
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

export async function waitGone(record: ProcessRecord, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (await isRunning(record)) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return true;
}

/** The last lines of a process's log, for an error message. */
export async function logTail(record: Pick<ProcessRecord, "log">, lines = 20): Promise<string> {
  const text = await readFile(record.log, "utf8").catch(() => "");
  return text.trim().split("\n").slice(-lines).join("\n");
}

/** Processes whose command line names a path under `dir` (down checks none of the cluster's VMs is left). */
export async function processesUnder(dir: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    const cmdline = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    if (cmdline.split("\0").some((arg) => arg.includes(`${dir}/`))) found.push(Number(entry));
  }
  return found;
}
