/**
 * Point-in-time usage of a sandbox: CPU from the host's view of its QEMU process (utime + stime between two
 * samples), memory from the guest's /proc/meminfo. The guest reports no filesystem usage, so disk is 0.
 */
import { sleep } from "../../common/deadline.js";
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

export class MetricsSampler {
  private readonly lastCpu = new Map<string, CpuSample>();

  async sample(
    handle: SandboxHandle,
    context: { vcpus: number; readGuestFile: (path: string) => Promise<{ data: Buffer }> },
  ): Promise<SandboxMetrics> {
    const [cpuPct, memory] = await Promise.all([
      this.cpuPercent(handle),
      context.readGuestFile("/proc/meminfo").then((file) => parseMeminfo(file.data.toString("utf8"))),
    ]);
    return {
      timestamp_unix_ms: Date.now(),
      cpu_count: context.vcpus,
      cpu_used_pct: Math.round((cpuPct / context.vcpus) * 100) / 100,
      mem_total_bytes: memory.total,
      mem_used_bytes: memory.total - memory.available,
      mem_cache_bytes: memory.cache,
      disk_total_bytes: 0,
      disk_used_bytes: 0,
    };
  }

  forget(id: string): void {
    this.lastCpu.delete(id);
  }

  /** CPU seconds per second used by the VM since the previous sample (x100), all vCPUs together. */
  private async cpuPercent(handle: SandboxHandle): Promise<number> {
    let previous = this.lastCpu.get(handle.id);
    if (previous === undefined || Date.now() - previous.atMs > MAX_WINDOW_MS) {
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
