import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { SandboxMetrics } from "../../src/controller/sandbox-service.js";
import { MetricsSeries } from "../../src/controller/sandboxes/metrics-series.js";

const at = (ms: number): SandboxMetrics => ({
  timestamp_unix_ms: ms,
  cpu_count: 1,
  cpu_used_pct: 0,
  mem_total_bytes: 1,
  mem_used_bytes: 1,
  mem_cache_bytes: 0,
  disk_total_bytes: 1,
  disk_used_bytes: 1,
});

describe("metrics series", () => {
  it("is due at once, then every interval", () => {
    const series = new MetricsSeries(5000, 8);
    assert.equal(series.due("a", 0), true);
    series.add("a", at(1000));
    assert.equal(series.due("a", 5999), false);
    assert.equal(series.due("a", 6000), true);
    assert.equal(series.due("b", 1), true, "each sandbox its own");
  });

  it("stays bounded and spans the whole life: a full series keeps every other sample and samples half as often", () => {
    const series = new MetricsSeries(5000, 8);
    let now = 0;
    for (let i = 0; i < 30; i++) {
      while (!series.due("a", now)) now += 1000;
      series.add("a", at(now));
    }
    const kept = series.range("a");
    assert.ok(kept.length <= 9, `bounded: ${kept.length}`);
    assert.equal(kept[0]?.timestamp_unix_ms, 0, "the first sample stays");
    assert.equal(kept.at(-1)?.timestamp_unix_ms, now, "the newest is there");
    const gaps = kept
      .slice(1)
      .map((s, i) => s.timestamp_unix_ms - (kept[i] as SandboxMetrics).timestamp_unix_ms);
    assert.ok(
      gaps.every((g) => g === gaps[0]),
      `evenly spaced: ${gaps}`,
    );
    assert.ok((gaps[0] ?? 0) > 5000, "coarser than the first interval");
  });

  it("answers a range, inclusive, and forgets", () => {
    const series = new MetricsSeries(1000, 100);
    for (const ms of [0, 1000, 2000, 3000]) series.add("a", at(ms));
    assert.deepEqual(
      series.range("a", 1000, 2000).map((s) => s.timestamp_unix_ms),
      [1000, 2000],
    );
    assert.deepEqual(
      series.range("a", 2500).map((s) => s.timestamp_unix_ms),
      [3000],
    );
    series.forget("a");
    assert.deepEqual(series.range("a"), []);
  });
});
