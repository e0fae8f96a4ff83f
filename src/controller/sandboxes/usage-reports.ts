/**
 * What running sandboxes use, as the service reports it: one sandbox's metrics (CPU from the host, memory from
 * its guest), every VM's cost to the host (no guest call), and the host with its sandboxes counted by state.
 */

import type { StateDb } from "../../store/db.js";
import { UsageSampler } from "../host/usage.js";
import type { HostStatus, SandboxMetrics, SandboxService, SandboxUsage } from "../sandbox-service.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import { MetricsSampler } from "./metrics-sampler.js";

export interface UsageReportsContext {
  db: Pick<StateDb, "sandboxes">;
  live: LiveSandboxes;
  snapshots: Pick<DaemonSnapshots, "get">;
  /** Reads a file in the sandbox's guest (its /proc/meminfo). */
  files: Pick<SandboxService["files"], "read">;
}

export class UsageReports {
  private readonly metricsSampler = new MetricsSampler();
  private readonly usageSampler = new UsageSampler();

  constructor(private readonly ctx: UsageReportsContext) {}

  async metrics(id: string, options: { signal?: AbortSignal } = {}): Promise<SandboxMetrics> {
    const live = this.ctx.live.running(id);
    const snapshot = await this.ctx.snapshots.get(this.ctx.live.row(id).snapshot_tag).catch(() => null);
    return this.metricsSampler.sample(live.handle, {
      vcpus: snapshot?.vcpus ?? 1,
      readGuestFile: (file) => this.ctx.files.read(id, file, { maxBytes: 64 * 1024, signal: options.signal }),
    });
  }

  async usage(filter: { ids?: readonly string[] } = {}): Promise<SandboxUsage[]> {
    const wanted = filter.ids === undefined ? undefined : new Set(filter.ids);
    const handles = this.ctx.live
      .all()
      .filter((l) => !l.killing && (wanted === undefined || wanted.has(l.handle.id)))
      .map((l) => l.handle);
    const samples = await Promise.all(handles.map((h) => this.usageSampler.sandbox(h.id, h.pid)));
    return samples.filter((u): u is SandboxUsage => u !== null);
  }

  async host(): Promise<HostStatus> {
    const counts: HostStatus["sandboxes"] = {
      starting: 0,
      running: 0,
      pausing: 0,
      paused: 0,
      resuming: 0,
      stopping: 0,
      dead: 0,
    };
    for (const row of this.ctx.db.sandboxes()) counts[row.status]++;
    return this.usageSampler.host(counts);
  }

  /** Forgets the CPU samples of a sandbox whose VM stopped (paused: its host usage is already gone with it). */
  forgetMetrics(id: string): void {
    this.metricsSampler.forget(id);
  }

  /** Forgets everything sampled of a sandbox that is gone. */
  forget(id: string): void {
    this.metricsSampler.forget(id);
    this.usageSampler.forget(id);
  }
}
