/** The host: sandboxes, memory and CPU over time, spawn latency histograms, and what the host has now. */
import { useMemo } from "preact/hooks";
import { HistogramChart, LineChart } from "./Charts.js";
import { bytes, percent } from "./format.js";
import type { ConsoleState } from "./store.js";

export function HostPanel({ state }: { state: ConsoleState }) {
  const { history, panel } = state;
  const series = useMemo(
    () => ({
      sandboxes: history.map((p) => [p.t, p.sandboxes] as [number, number]),
      memory: history.map((p) => [p.t, p.mem_used_bytes] as [number, number]),
      cpu: history.map((p) => [p.t, p.cpu_used_pct] as [number, number]),
    }),
    [history],
  );
  const host = panel?.host ?? null;
  if (!panel) return <p class="muted pad">Waiting for the daemon…</p>;
  return (
    <div class="host" data-testid="host-panel">
      {host && (
        <dl class="facts">
          <div>
            <dt>CPUs</dt>
            <dd>
              {host.cpu_count}, load {host.load_avg.map((l) => l.toFixed(2)).join(" / ")}
            </dd>
          </div>
          <div>
            <dt>memory</dt>
            <dd>
              {bytes(host.mem_total_bytes - host.mem_available_bytes)} used of {bytes(host.mem_total_bytes)} (
              {bytes(host.mem_available_bytes)} available)
            </dd>
          </div>
          <div>
            <dt>sandboxes</dt>
            <dd>
              {Object.entries(host.sandboxes)
                .map(([status, n]) => `${n} ${status}`)
                .join(", ")}
            </dd>
          </div>
          <div>
            <dt>daemon</dt>
            <dd>{bytes(host.daemon_rss_bytes)} resident</dd>
          </div>
          {panel.network && (
            <div>
              <dt>network</dt>
              <dd>
                {panel.network.mode}
                {panel.network.reason ? ` (${panel.network.reason})` : ""}, default egress{" "}
                {panel.network.default_egress}
              </dd>
            </div>
          )}
        </dl>
      )}
      <LineChart
        testId="chart-sandboxes"
        label="sandboxes"
        points={series.sandboxes}
        format={(v) => String(Math.round(v))}
      />
      <LineChart
        testId="chart-memory"
        label="host memory used"
        points={series.memory}
        max={host?.mem_total_bytes}
        format={bytes}
      />
      <LineChart testId="chart-cpu" label="host CPU" points={series.cpu} max={100} format={percent} />
      <HistogramChart
        testId="chart-ready"
        label="sandbox ready latency (restore to ready)"
        histogram={panel.ready}
      />
      <HistogramChart
        testId="chart-spawn"
        label="spawn requests (all children ready)"
        histogram={panel.spawn}
      />
    </div>
  );
}
