/** Two small SVG charts: a line over time and a histogram. Values are drawn, never inserted as markup. */
import type { Histogram } from "../../src/console/protocol.js";

const W = 320;
const H = 90;
const PAD = 4;

export function LineChart({
  points,
  max,
  label,
  format,
  testId,
}: {
  points: readonly [t: number, v: number][];
  max?: number;
  label: string;
  format: (v: number) => string;
  testId?: string;
}) {
  const last = points[points.length - 1];
  const top = Math.max(max ?? 0, ...points.map(([, v]) => v), 1e-9);
  const t0 = points[0]?.[0] ?? 0;
  const span = Math.max(1, (last?.[0] ?? 0) - t0);
  const path = points
    .map(([t, v], i) => {
      const x = PAD + ((t - t0) / span) * (W - 2 * PAD);
      const y = H - PAD - (v / top) * (H - 2 * PAD);
      return `${i === 0 ? "M" : "L"}${x.toFixed(1)},${y.toFixed(1)}`;
    })
    .join(" ");
  return (
    <figure class="chart" data-testid={testId}>
      <figcaption>
        {label}: <strong>{last ? format(last[1]) : "–"}</strong>
        <span class="muted"> (max {format(top)})</span>
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={label}>
        <rect x="0" y="0" width={W} height={H} class="chart-bg" />
        {points.length > 1 && <path d={path} class="chart-line" />}
      </svg>
      <div class="chart-axis muted">
        <span>{points.length > 1 ? new Date(t0).toLocaleTimeString() : ""}</span>
        <span>{last ? new Date(last[0]).toLocaleTimeString() : ""}</span>
      </div>
    </figure>
  );
}

export function HistogramChart({
  histogram,
  label,
  testId,
}: {
  histogram: Histogram;
  label: string;
  testId?: string;
}) {
  const top = Math.max(1, ...histogram.counts);
  const n = Math.max(1, histogram.counts.length);
  const bar = (W - 2 * PAD) / n;
  const mean = histogram.count > 0 ? histogram.sum / histogram.count : null;
  return (
    <figure class="chart" data-testid={testId}>
      <figcaption>
        {label}: <strong>{histogram.count}</strong> observed
        {mean !== null && <span class="muted"> (mean {formatSeconds(mean)})</span>}
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H + 14}`} role="img" aria-label={label}>
        <rect x="0" y="0" width={W} height={H} class="chart-bg" />
        {histogram.counts.map((count, i) => {
          const h = (count / top) * (H - 2 * PAD);
          const le = histogram.le[i];
          return (
            <g key={i}>
              <rect
                x={PAD + i * bar + 1}
                y={H - PAD - h}
                width={Math.max(1, bar - 2)}
                height={h}
                class="chart-bar"
              >
                <title>
                  ≤ {le === null || le === undefined ? "∞" : formatSeconds(le)}: {count}
                </title>
              </rect>
              {i % 2 === 0 && (
                <text x={PAD + i * bar + bar / 2} y={H + 11} class="chart-tick" text-anchor="middle">
                  {le === null || le === undefined ? "∞" : formatSeconds(le)}
                </text>
              )}
            </g>
          );
        })}
      </svg>
    </figure>
  );
}

function formatSeconds(s: number): string {
  return s < 1 ? `${Math.round(s * 1000)}ms` : `${s}s`;
}
