/**
 * What running sandboxes use, as the service reports it: one sandbox's metrics (CPU from the host, memory and
 * disk from its guest) now, or as the series it has kept since it started (metrics-series.ts, sampled in the
 * background when the daemon asks for it), every VM's cost to the host (no guest call), and the host with its
 * sandboxes counted by state.
 */

import { errorMessage } from "../../common/errors.js";
import type { StateDb } from "../../store/db.js";
import { UsageSampler } from "../host/usage.js";
import type { HostStatus, SandboxMetrics, SandboxService, SandboxUsage } from "../sandbox-service.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { GuestCalls } from "./guest-calls.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import { type GuestReader, MetricsSampler } from "./metrics-sampler.js";
import { MetricsSeries } from "./metrics-series.js";

export interface UsageReportsContext {
  db: Pick<StateDb, "sandboxes">;
  live: LiveSandboxes;
  snapshots: Pick<DaemonSnapshots, "get">;
  /** The sandbox's guest: its stats, and its /proc/meminfo for an agent without them. */
  guest: Pick<GuestCalls, "stats"> & { files: Pick<SandboxService["files"], "read"> };
  log: { warn(obj: object, msg?: string): void };
}

/** How long one background sample may take before it is given up (a busy or stuck guest). */
const SERIES_SAMPLE_TIMEOUT_MS = 10_000;
/** How often the background sampler looks for sandboxes due a sample. */
const SERIES_TICK_MS = 1000;

export class UsageReports {
  private readonly metricsSampler = new MetricsSampler();
  private readonly usageSampler = new UsageSampler();
  private series: MetricsSeries | undefined;
  private ticker: NodeJS.Timeout | undefined;
  private ticking = false;

  constructor(private readonly ctx: UsageReportsContext) {}

  /** A sample of running sandbox `id` now. */
  async metrics(id: string, options: { signal?: AbortSignal } = {}): Promise<SandboxMetrics> {
    return this.sample(id, options.signal);
  }

  /**
   * The series of running sandbox `id` in [startMs, endMs], oldest first (metrics-series.ts); a sample now when
   * the daemon keeps no series, or it has none yet (its first is being taken).
   */
  async history(
    id: string,
    range: { startMs?: number; endMs?: number; signal?: AbortSignal } = {},
  ): Promise<SandboxMetrics[]> {
    this.ctx.live.running(id);
    if (this.series === undefined || this.series.range(id).length === 0) {
      const now = await this.sample(id, range.signal);
      this.series?.add(id, now);
      const inRange =
        (range.startMs === undefined || now.timestamp_unix_ms >= range.startMs) &&
        (range.endMs === undefined || now.timestamp_unix_ms <= range.endMs);
      return inRange ? [now] : [];
    }
    return this.series.range(id, range.startMs, range.endMs);
  }

  /** Keeps a series of every running sandbox from now on, a sample every `intervalMs` (0: none). */
  startSeries(intervalMs: number): void {
    if (intervalMs <= 0 || this.ticker !== undefined) return;
    this.series = new MetricsSeries(intervalMs);
    this.ticker = setInterval(() => void this.sampleDue(), Math.min(SERIES_TICK_MS, intervalMs));
    this.ticker.unref();
  }

  stopSeries(): void {
    if (this.ticker !== undefined) clearInterval(this.ticker);
    this.ticker = undefined;
  }

  /** One sample of each running sandbox whose series is due, one sandbox at a time. */
  private async sampleDue(): Promise<void> {
    const series = this.series;
    if (this.ticking || series === undefined) return;
    this.ticking = true;
    try {
      for (const live of this.ctx.live.all()) {
        const id = live.handle.id;
        if (live.killing || live.pausing || !series.due(id, Date.now())) continue;
        try {
          series.add(
            id,
            await this.sample(id, AbortSignal.timeout(SERIES_SAMPLE_TIMEOUT_MS), Number.POSITIVE_INFINITY),
          );
        } catch (err) {
          // Paused, killed or busy since the loop began: its next tick tries again (or it is gone).
          if (this.ctx.live.all().some((l) => l.handle.id === id && !l.killing)) {
            this.ctx.log.warn({ id, err: errorMessage(err) }, "metrics sample failed");
          }
        }
      }
    } finally {
      this.ticking = false;
    }
  }

  private async sample(id: string, signal?: AbortSignal, windowMs?: number): Promise<SandboxMetrics> {
    const live = this.ctx.live.running(id);
    const snapshot = await this.ctx.snapshots.get(this.ctx.live.row(id).snapshot_tag).catch(() => null);
    const guest: GuestReader = {
      stats: () => this.ctx.guest.stats(id, { signal }),
      readFile: (file) => this.ctx.guest.files.read(id, file, { maxBytes: 64 * 1024, signal }),
    };
    return this.metricsSampler.sample(live.handle, { vcpus: snapshot?.vcpus ?? 1, guest, windowMs });
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
    this.series?.forget(id);
    this.usageSampler.forget(id);
  }
}
