/**
 * The machine a template gives its sandboxes (vCPUs, RAM, disk size), as E2B reports per sandbox and template.
 * Snapshots never change once written, so what was read once is kept.
 */
import type { SnapshotService } from "../../controller/sandbox-service.js";

export interface MachineFacts {
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
}

const MIB = 1024 * 1024;
/** Bounds the cache; a daemon with more snapshots than this re-reads the oldest. */
const MAX_CACHED = 1024;

export class TemplateFacts {
  private readonly cache = new Map<string, MachineFacts>();

  /** The facts of snapshot `tag`, read through `snapshots` (the caller's view) unless already known. */
  async of(snapshots: Pick<SnapshotService, "detail">, tag: string): Promise<MachineFacts> {
    const cached = this.cache.get(tag);
    if (cached) return cached;
    const detail = await snapshots.detail(tag).catch(() => null);
    if (detail === null) return { cpuCount: 1, memoryMB: 0, diskSizeMB: 0 };
    const disk = detail.layers.at(-1)?.disk.logical_bytes ?? 0;
    const facts = {
      cpuCount: detail.vcpus ?? 1,
      memoryMB: detail.memory_mib ?? 0,
      diskSizeMB: Math.round(disk / MIB),
    };
    if (detail.status === "ready") {
      if (this.cache.size >= MAX_CACHED) this.cache.delete(this.cache.keys().next().value as string);
      this.cache.set(tag, facts);
    }
    return facts;
  }
}
