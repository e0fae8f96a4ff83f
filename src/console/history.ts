/**
 * The host panel's history: the daemon's host status (sandboxes, memory, CPU) sampled at a fixed interval for
 * as long as the daemon runs, in a ring of bounded length, so the console shows the last hour however recently
 * it was opened. Also turns the daemon's Prometheus histograms into per-bucket counts.
 */
import type { Histogram as PromHistogram } from "prom-client";
import { errorMessage } from "../common/errors.js";
import type { SandboxService } from "../controller/sandbox-service.js";
import type { Histogram, HistoryPoint, HostWire } from "./protocol.js";

export const DEFAULT_HISTORY_INTERVAL_MS = 5000;
/** One hour at the default interval. */
export const DEFAULT_HISTORY_POINTS = 720;

export class HistoryRecorder {
  private readonly ring: HistoryPoint[] = [];
  private latest: HostWire | null = null;
  private timer: NodeJS.Timeout | undefined;
  private readonly listeners = new Set<(point: HistoryPoint) => void>();

  constructor(
    private readonly sandboxes: Pick<SandboxService, "host">,
    private readonly options: { intervalMs?: number; maxPoints?: number } = {},
    private readonly log: { warn(obj: object, msg?: string): void } = { warn: () => {} },
  ) {}

  start(): void {
    if (this.timer) return;
    void this.sample();
    this.timer = setInterval(
      () => void this.sample(),
      this.options.intervalMs ?? DEFAULT_HISTORY_INTERVAL_MS,
    );
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  points(): HistoryPoint[] {
    return [...this.ring];
  }

  latestHost(): HostWire | null {
    return this.latest;
  }

  /** Calls `listener` with every new point; returns the unsubscribe function. */
  onPoint(listener: (point: HistoryPoint) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async sample(): Promise<void> {
    try {
      const host = await this.sandboxes.host();
      this.latest = host;
      const point: HistoryPoint = {
        t: host.timestamp_unix_ms,
        sandboxes: host.sandboxes.running + host.sandboxes.starting,
        mem_used_bytes: host.mem_total_bytes - host.mem_available_bytes,
        mem_total_bytes: host.mem_total_bytes,
        cpu_used_pct: host.cpu_used_pct,
      };
      this.ring.push(point);
      const max = this.options.maxPoints ?? DEFAULT_HISTORY_POINTS;
      if (this.ring.length > max) this.ring.splice(0, this.ring.length - max);
      for (const listener of this.listeners) listener(point);
    } catch (err) {
      this.log.warn({ err: errorMessage(err) }, "console history: sampling the host failed");
    }
  }
}

/** A prom-client histogram (all label sets added up) as counts per bucket. */
export async function histogramOf(histogram: PromHistogram<string>): Promise<Histogram> {
  const { values } = await histogram.get();
  const cumulative = new Map<number, number>();
  let count = 0;
  let sum = 0;
  for (const v of values) {
    if (v.metricName?.endsWith("_bucket")) {
      const le = v.labels.le === "+Inf" ? Number.POSITIVE_INFINITY : Number(v.labels.le);
      cumulative.set(le, (cumulative.get(le) ?? 0) + v.value);
    } else if (v.metricName?.endsWith("_count")) count += v.value;
    else if (v.metricName?.endsWith("_sum")) sum += v.value;
  }
  const bounds = [...cumulative.keys()].sort((a, b) => a - b);
  let below = 0;
  const counts = bounds.map((le) => {
    const total = cumulative.get(le) ?? 0;
    const inBucket = total - below;
    below = total;
    return inBucket;
  });
  return { le: bounds.map((b) => (Number.isFinite(b) ? b : null)), counts, count, sum };
}
