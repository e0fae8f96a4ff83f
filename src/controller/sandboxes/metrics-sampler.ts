/**
 * Point-in-time usage of a sandbox: CPU from the host's view of its QEMU process (utime + stime between two
 * samples), memory and disk as the guest sees them (the agent's `stats`: /proc/meminfo and statfs of `/`). An
 * agent older than that op is read for memory only (its /proc/meminfo), disk then 0.
 */
import type { GuestStats } from "../../agent/host/types.js";
import { sleep } from "../../common/deadline.js";
import { ForkdError } from "../../common/errors.js";
import { procStatFields } from "../host/processes.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";
import type { SandboxMetrics } from "../sandbox-service.js";

/** Linux reports /proc times in USER_HZ, which is 100 on every architecture forkd runs on. */
const TICKS_PER_SECOND = 100;
/** A sample older than this is not a useful window; a fresh one is taken over FIRST_WINDOW_MS instead. */
const MAX_WINDOW_MS = 30_000;
const FIRST_WINDOW_MS = 500;

interface CpuSample {
  ticks: number;
  atMs: number;
}

/** What a sample reads of the guest. */
export interface GuestReader {
  stats(): Promise<GuestStats>;
  /** A guest file (its /proc/meminfo, for an agent without `stats`). */
  readFile(path: string): Promise<{ data: Buffer }>;
}

export class MetricsSampler {
  private readonly lastCpu = new Map<string, CpuSample>();

  /**
   * `windowMs`: how old the previous CPU sample may be to measure from (a series measures from its previous
   * sample, however far back; a one-off sample from one of the last MAX_WINDOW_MS, else a fresh window).
   */
  async sample(
    handle: SandboxHandle,
    context: { vcpus: number; guest: GuestReader; windowMs?: number },
  ): Promise<SandboxMetrics> {
    const [cpuPct, guest] = await Promise.all([
      this.cpuPercent(handle, context.windowMs ?? MAX_WINDOW_MS),
      guestStats(context.guest),
    ]);
    return {
      timestamp_unix_ms: Date.now(),
      cpu_count: context.vcpus,
      cpu_used_pct: Math.round((cpuPct / context.vcpus) * 100) / 100,
      mem_total_bytes: guest.memTotalBytes,
      mem_used_bytes: guest.memTotalBytes - guest.memAvailableBytes,
      mem_cache_bytes: guest.memCacheBytes,
      disk_total_bytes: guest.diskTotalBytes,
      disk_used_bytes: guest.diskUsedBytes,
    };
  }

  forget(id: string): void {
    this.lastCpu.delete(id);
  }

  /** CPU seconds per second used by the VM since the previous sample (x100), all vCPUs together. */
  private async cpuPercent(handle: SandboxHandle, windowMs: number): Promise<number> {
    let previous = this.lastCpu.get(handle.id);
    if (previous === undefined || Date.now() - previous.atMs > windowMs) {
      previous = await cpuSample(handle.pid);
      await sleep(FIRST_WINDOW_MS);
    }
    const current = await cpuSample(handle.pid);
    this.lastCpu.set(handle.id, current);
    const seconds = (current.atMs - previous.atMs) / 1000;
    if (seconds <= 0) return 0;
    return (((current.ticks - previous.ticks) / TICKS_PER_SECOND) * 100) / seconds;
  }
}

async function guestStats(guest: GuestReader): Promise<GuestStats> {
  try {
    return await guest.stats();
  } catch (err) {
    if (!(err instanceof ForkdError && err.code === "not_implemented")) throw err;
    const memory = parseMeminfo((await guest.readFile("/proc/meminfo")).data.toString("utf8"));
    return {
      memTotalBytes: memory.total,
      memAvailableBytes: memory.available,
      memCacheBytes: memory.cache,
      diskTotalBytes: 0,
      diskUsedBytes: 0,
    };
  }
}

async function cpuSample(pid: number): Promise<CpuSample> {
  const fields = await procStatFields(pid);
  const ticks = fields ? Number(fields[11]) + Number(fields[12]) : 0;
  return { ticks: Number.isFinite(ticks) ? ticks : 0, atMs: Date.now() };
}

/** MemTotal, MemAvailable and page cache (Cached + Buffers) in bytes; absent fields count as 0. */
export function parseMeminfo(text: string): { total: number; available: number; cache: number } {
  const kib = (name: string) => {
    const match = new RegExp(`^${name}:\\s+(\\d+) kB$`, "m").exec(text);
    return match ? Number(match[1]) * 1024 : 0;
  };
  return { total: kib("MemTotal"), available: kib("MemAvailable"), cache: kib("Cached") + kib("Buffers") };
}
