/**
 * What sandboxes cost the host right now, measured from the host's side only (no guest call, so it works for a
 * busy or wedged guest and costs the guest nothing): each QEMU process's memory from /proc/<pid>/smaps_rollup
 * (RSS; PSS, which divides the copy-on-write pages a child shares with its snapshot among all sharers; private
 * pages, the ones only it holds) and its CPU from /proc/<pid>/stat; and the host's CPUs, load and memory.
 */
import { readFile } from "node:fs/promises";
import os from "node:os";
import type { HostStatus, SandboxUsage } from "../sandbox-service.js";
import { procStatFields } from "./processes.js";

/** Linux reports /proc times in USER_HZ, which is 100 on every architecture forkd runs on. */
const TICKS_PER_SECOND = 100;
/** A previous sample older than this is not a useful window: CPU is then averaged over the VM's whole life. */
const MAX_CPU_WINDOW_MS = 120_000;

interface CpuSample {
  ticks: number;
  atMs: number;
}

interface HostCpuSample {
  busy: number;
  total: number;
  atMs: number;
}

/** Samples sandboxes' and the host's use; keeps the previous sample of each so CPU is a rate over a window. */
export class UsageSampler {
  private readonly lastCpu = new Map<string, CpuSample>();
  private lastHostCpu: HostCpuSample | undefined;

  /** The usage of the VM with `pid`; null when the process is gone. */
  async sandbox(id: string, pid: number): Promise<SandboxUsage | null> {
    const [memory, fields, bootMs] = await Promise.all([smapsRollup(pid), procStatFields(pid), bootTimeMs()]);
    if (memory === null || fields === null) return null;
    const now = Date.now();
    const ticks = Number(fields[11]) + Number(fields[12]);
    const startedAtMs = bootMs + (Number(fields[19]) / TICKS_PER_SECOND) * 1000;
    const previous = this.lastCpu.get(id);
    const usable = previous !== undefined && now - previous.atMs <= MAX_CPU_WINDOW_MS && now > previous.atMs;
    const since = usable ? previous : { ticks: 0, atMs: startedAtMs };
    this.lastCpu.set(id, { ticks, atMs: now });
    const windowMs = Math.max(1, now - since.atMs);
    return {
      id,
      timestamp_unix_ms: now,
      rss_bytes: memory.rss,
      pss_bytes: memory.pss,
      private_bytes: memory.private,
      cpu_seconds: ticks / TICKS_PER_SECOND,
      cpu_used_pct: round2((((ticks - since.ticks) / TICKS_PER_SECOND) * 1000 * 100) / windowMs),
      cpu_window_ms: Math.round(windowMs),
    };
  }

  forget(id: string): void {
    this.lastCpu.delete(id);
  }

  async host(sandboxes: HostStatus["sandboxes"]): Promise<HostStatus> {
    const [meminfo, stat, loadavg] = await Promise.all([
      readFile("/proc/meminfo", "utf8"),
      readFile("/proc/stat", "utf8"),
      readFile("/proc/loadavg", "utf8"),
    ]);
    const now = Date.now();
    const cpu = parseProcStatCpu(stat);
    const previous = this.lastHostCpu ?? { busy: 0, total: 0, atMs: now - os.uptime() * 1000 };
    this.lastHostCpu = { ...cpu, atMs: now };
    const totalDelta = cpu.total - previous.total;
    const kib = (name: string) =>
      Number(new RegExp(`^${name}:\\s+(\\d+) kB$`, "m").exec(meminfo)?.[1] ?? 0) * 1024;
    const load = loadavg.split(" ").slice(0, 3).map(Number);
    return {
      timestamp_unix_ms: now,
      cpu_count: os.availableParallelism(),
      cpu_used_pct: totalDelta > 0 ? round2(((cpu.busy - previous.busy) / totalDelta) * 100) : 0,
      cpu_window_ms: Math.round(now - previous.atMs),
      load_avg: [load[0] ?? 0, load[1] ?? 0, load[2] ?? 0],
      mem_total_bytes: kib("MemTotal"),
      mem_available_bytes: kib("MemAvailable"),
      daemon_rss_bytes: process.memoryUsage.rss(),
      sandboxes,
    };
  }
}

/** Rss, Pss and private bytes of a process from /proc/<pid>/smaps_rollup; null if it is gone. */
export async function smapsRollup(
  pid: number,
): Promise<{ rss: number; pss: number; private: number } | null> {
  if (!Number.isInteger(pid) || pid <= 0) return null;
  const text = await readFile(`/proc/${pid}/smaps_rollup`, "utf8").catch(() => null);
  if (text === null) return null;
  const field = (name: string) => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB$`, "m").exec(text);
    return match ? Number(match[1]) * 1024 : 0;
  };
  return {
    rss: field("Rss"),
    pss: field("Pss"),
    private: field("Private_Clean") + field("Private_Dirty"),
  };
}

/** The aggregate `cpu` line of /proc/stat: busy jiffies (everything but idle and iowait) and the total. */
export function parseProcStatCpu(text: string): { busy: number; total: number } {
  const line = /^cpu\s+([\d ]+)$/m.exec(text)?.[1] ?? "";
  // user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
  const values = line.trim().split(/\s+/).map(Number).slice(0, 8);
  const total = values.reduce((sum, v) => sum + (Number.isFinite(v) ? v : 0), 0);
  const idle = (values[3] ?? 0) + (values[4] ?? 0);
  return { busy: total - idle, total };
}

let bootTime: Promise<number> | undefined;

/** When the host booted (unix ms), from /proc/stat's btime: process start times count from it. */
function bootTimeMs(): Promise<number> {
  bootTime ??= readFile("/proc/stat", "utf8").then(
    (text) => Number(/^btime\s+(\d+)$/m.exec(text)?.[1] ?? 0) * 1000,
  );
  return bootTime;
}

function round2(value: number): number {
  return Math.round(value * 100) / 100;
}
