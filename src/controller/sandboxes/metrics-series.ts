/**
 * Each sandbox's metrics as a series since it started (E2B's `GET /sandboxes/{id}/metrics` answers one): a sample
 * every METRICS_INTERVAL_MS while it runs, at most MAX_METRICS_SAMPLES (+1) kept. A full series drops every other
 * sample and halves how often it takes new ones, so it always spans the sandbox's whole life, coarser as the
 * sandbox gets older, in bounded memory. A paused sandbox takes no samples; its series goes when it does.
 */
import type { SandboxMetrics } from "../sandbox-service.js";

/** How often a running sandbox is sampled while its series has room (E2B samples every 5 s). */
export const METRICS_INTERVAL_MS = 5000;
/** Samples kept per sandbox (20 minutes at the first interval). */
export const MAX_METRICS_SAMPLES = 240;

interface Series {
  samples: SandboxMetrics[];
  intervalMs: number;
  nextDueMs: number;
}

export class MetricsSeries {
  private readonly series = new Map<string, Series>();

  constructor(
    private readonly intervalMs = METRICS_INTERVAL_MS,
    private readonly maxSamples = MAX_METRICS_SAMPLES,
  ) {
    if (maxSamples % 2 !== 0 || maxSamples < 2) throw new Error("maxSamples must be even and at least 2");
  }

  /** Whether sandbox `id` is due for a sample at `nowMs` (a sandbox never sampled is). */
  due(id: string, nowMs: number): boolean {
    const series = this.series.get(id);
    return series === undefined || nowMs >= series.nextDueMs;
  }

  add(id: string, sample: SandboxMetrics): void {
    let series = this.series.get(id);
    if (series === undefined) {
      series = { samples: [], intervalMs: this.intervalMs, nextDueMs: 0 };
      this.series.set(id, series);
    }
    series.samples.push(sample);
    if (series.samples.length > this.maxSamples) {
      // An odd number of samples (maxSamples is even): every other one from the first keeps the sandbox's
      // start and the newest.
      series.samples = series.samples.filter((_, i) => i % 2 === 0);
      series.intervalMs *= 2;
    }
    // From the newest sample kept, so the samples stay evenly spaced after a thinning.
    series.nextDueMs = (series.samples.at(-1) as SandboxMetrics).timestamp_unix_ms + series.intervalMs;
  }

  /** The samples of `id` taken in [startMs, endMs] (either open), oldest first. */
  range(id: string, startMs?: number, endMs?: number): SandboxMetrics[] {
    const samples = this.series.get(id)?.samples ?? [];
    return samples.filter(
      (s) =>
        (startMs === undefined || s.timestamp_unix_ms >= startMs) &&
        (endMs === undefined || s.timestamp_unix_ms <= endMs),
    );
  }

  forget(id: string): void {
    this.series.delete(id);
  }
}
