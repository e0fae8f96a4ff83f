/**
 * bench/spawn-daemon — the daemon's own spawn path, confined (each QEMU under its own uid, seccomp, its mounts
 * and its sandbox's cgroups), cold against a warm pool, side by side in one run. Each round opens the engine on
 * FORKD_HOME with confinement on, once without a pool and once with `--warm-pool TAG:N` (filled before the clock
 * starts), spawns N sandboxes of TAG in one request, evaluates `numpy.zeros(5).tolist()` in each
 * (BENCH_CONCURRENCY at once) and stops the clock when all have answered. BENCH_NETWORK=netns (the default) gives
 * each sandbox a network of its own (`network: {default: "allow"}`: its namespace, veth and rules; a pooled VM's
 * made ahead and given its policy when taken), `none` a NIC that leads nowhere (`network: "none"`). Rounds alternate cold/warm so load changes hit both alike. Reported per side:
 * wall p50 over the rounds, host CPU per child (QEMU threads to the answer), and for the pool its fill time and
 * CPU (paid before the clock starts). Needs root (cgroups).
 *
 *   npm run bench -- spawn-daemon    (env: BENCH_N=30, BENCH_ROUNDS=2, BENCH_TAG=pyagent, BENCH_CONCURRENCY=4,
 *                                     BENCH_NETWORK=netns|none)
 */
import os from "node:os";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { openServices } from "../src/controller/sandboxes/manager.js";
import { SnapshotStore } from "../src/store/snapshot-store.js";
import { envNumber } from "./lib/env.js";
import { threadsCpuMs } from "./lib/phases.js";
import {
  benchConditions,
  conditionsLine,
  hostDescription,
  markdownTable,
  printRows,
  type Row,
  writeResults,
} from "./lib/report.js";

const N = envNumber("BENCH_N", 30);
const ROUNDS = envNumber("BENCH_ROUNDS", 2);
const TAG = process.env.BENCH_TAG ?? "pyagent";
const CONCURRENCY = envNumber("BENCH_CONCURRENCY", 4);
const EXPECTED = "[0.0, 0.0, 0.0, 0.0, 0.0]";
const NETWORK = process.env.BENCH_NETWORK ?? "netns";
if (NETWORK !== "netns" && NETWORK !== "none")
  throw new Error(`BENCH_NETWORK=${NETWORK}: expected netns or none`);
const SPAWN_NETWORK = NETWORK === "none" ? ("none" as const) : { default: "allow" as const };

interface Run {
  side: "cold" | "warm";
  round: number;
  wall_ms: number;
  correct: number;
  from_pool: number;
  cpu_ms_per_child: number;
  fill_ms: number | null;
  fill_cpu_ms_per_vm: number | null;
  confinement: string;
  network_mode: string;
  load1: number;
}

const paths = resolvePaths();
const loadAtStart = os.loadavg();

async function runSide(side: "cold" | "warm", round: number): Promise<Run> {
  const services = await openServices(paths, {
    confinement: "on",
    warmPools: side === "warm" ? [{ tag: TAG, size: N }] : [],
  });
  try {
    const status = services.sandboxes.confinementStatus();
    const confinement = `${status.summary}; cgroups ${JSON.stringify(status.cgroups)}`;
    let fillMs: number | null = null;
    let fillCpu: number | null = null;
    if (side === "warm") {
      const started = performance.now();
      for (;;) {
        const pool = services.sandboxes.warmPoolStats().find((s) => s.tag === TAG);
        if ((pool?.ready ?? 0) >= N) break;
        if (performance.now() - started > 900_000) throw new Error("the pool did not fill in 15 min");
        await new Promise((r) => setTimeout(r, 50));
      }
      fillMs = performance.now() - started;
      const pids = services.sandboxes.warmPoolPids();
      fillCpu = (await Promise.all(pids.map((pid) => threadsCpuMs(pid)))).reduce((a, b) => a + b, 0) / N;
    }
    const before = new Set(services.sandboxes.warmPoolPids());
    const started = performance.now();
    const infos = await services.sandboxes.spawn({
      snapshotTag: TAG,
      n: N,
      network: SPAWN_NETWORK,
      timeoutMs: 0,
    });
    const kinds = new Set(infos.map((i) => i.network.kind));
    if (kinds.size !== 1 || !kinds.has(NETWORK === "none" ? "private" : "netns")) {
      throw new Error(`BENCH_NETWORK=${NETWORK} but the sandboxes' networks are ${[...kinds].join(", ")}`);
    }
    const answers: string[] = [];
    const cpu: number[] = [];
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < infos.length) {
          const info = infos[next++] as (typeof infos)[number];
          const out = await services.sandboxes.eval(info.id, "numpy.zeros(5).tolist()", {
            timeoutMs: 600_000,
          });
          answers.push(out.result ?? "");
          cpu.push(await threadsCpuMs(info.pid as number));
        }
      }),
    );
    const wallMs = performance.now() - started;
    const fromPool = infos.filter((i) => before.has(i.pid as number)).length;
    return {
      side,
      round,
      wall_ms: Math.round(wallMs),
      correct: answers.filter((a) => a === EXPECTED).length,
      from_pool: fromPool,
      cpu_ms_per_child: Math.round((cpu.reduce((a, b) => a + b, 0) / cpu.length) * 10) / 10,
      fill_ms: fillMs === null ? null : Math.round(fillMs),
      fill_cpu_ms_per_vm: fillCpu === null ? null : Math.round(fillCpu * 10) / 10,
      confinement,
      network_mode: services.sandboxes.networkStatus().mode,
      load1: os.loadavg()[0] as number,
    };
  } finally {
    await services.sandboxes.killAll();
    await services.close();
  }
}

const runs: Run[] = [];
for (let round = 0; round < ROUNDS; round++) {
  for (const side of round % 2 === 0 ? (["cold", "warm"] as const) : (["warm", "cold"] as const)) {
    const run = await runSide(side, round);
    runs.push(run);
    console.log(
      `round ${round} ${side}: ${run.wall_ms} ms for ${N} (${run.correct} correct, ${run.from_pool} from the pool), ` +
        `${run.cpu_ms_per_child} ms CPU per child${run.fill_ms === null ? "" : `, pool filled in ${run.fill_ms} ms`}, ` +
        `load ${run.load1.toFixed(1)}`,
    );
  }
}

const of = (side: "cold" | "warm") => runs.filter((r) => r.side === side);
const p50 = (values: number[]) => Math.round(percentile(values, 50));
const mean = (values: number[]) => Math.round(values.reduce((a, b) => a + b, 0) / values.length);
const cold = mean(of("cold").map((r) => r.wall_ms));
const warm = mean(of("warm").map((r) => r.wall_ms));
const warmRuns = of("warm");
const rows: Row[] = [
  {
    metric: `wall-clock, N=${N} all answered, cold (mean of ${of("cold").length})`,
    value: `${cold} ms`,
    note: `${of("cold")
      .map((r) => r.wall_ms)
      .join(", ")} ms; confinement: ${runs[0]?.confinement}`,
  },
  {
    metric: `wall-clock, N=${N} all answered, from a full warm pool (mean of ${warmRuns.length})`,
    value: `${warm} ms`,
    target: "< 50 % of cold",
    note: `${warmRuns.map((r) => r.wall_ms).join(", ")} ms; ${warmRuns.map((r) => r.from_pool).join(", ")} of ${N} from the pool; filled beforehand in ${warmRuns.map((r) => r.fill_ms).join(", ")} ms (${warmRuns.map((r) => r.fill_cpu_ms_per_vm).join(", ")} ms CPU per VM)`,
  },
  { metric: "warm / cold", value: `${((100 * warm) / cold).toFixed(0)} %`, target: "< 50 %" },
  {
    metric: "host CPU per child to its answer, cold / warm",
    value: `${p50(of("cold").map((r) => r.cpu_ms_per_child))} / ${p50(warmRuns.map((r) => r.cpu_ms_per_child))} ms`,
    note: "QEMU's threads (schedstat) after the answer; a pooled VM's includes its prestart",
  },
  {
    metric: "answers correct",
    value: `${runs.reduce((n, r) => n + r.correct, 0)} / ${runs.length * N}`,
  },
];
const manifest = (await new SnapshotStore(paths.snapshots).get(TAG)).manifest;
const conditions = await benchConditions(manifest);
const measuredAt = new Date().toISOString();
const header =
  `${measuredAt} on ${hostDescription()}; ${conditionsLine(conditions)}; load average ` +
  `${loadAtStart.map((l) => l.toFixed(1)).join(" ")} before, ${os
    .loadavg()
    .map((l) => l.toFixed(1))
    .join(
      " ",
    )} after; ${ROUNDS} rounds alternating cold/warm, N=${N}, ${CONCURRENCY} evals at once; network: ${
    NETWORK === "none" ? '"none"' : "a namespace of its own per sandbox (egress allow)"
  }`;
printRows(`bench/spawn-daemon (${header})`, rows);
await writeResults(
  "spawn-daemon",
  {
    host: hostDescription(),
    measured_at: measuredAt,
    ...conditions,
    n: N,
    rounds: ROUNDS,
    network: NETWORK,
    runs,
    load_average: { start: loadAtStart, end: os.loadavg() },
  },
  `# bench/spawn-daemon\n\n${header}\n\n${markdownTable(rows)}\n`,
);
