/**
 * bench/spawn — the headline workload. Fork N=100 children from the `pyagent` snapshot; each evaluates
 * `numpy.zeros(5).tolist()`; the clock stops when all N have returned the right answer (agent readiness
 * included). Side by side in the same run: a cold-boot baseline (fresh VMs from the same image, same
 * expression). Memory is measured while all N children are alive.
 *
 * The same fork then runs again from a warm pool (BENCH_N VMs of the snapshot restored ahead, the pool filled
 * before the clock starts), and a phase breakdown of one child's host CPU
 * (bench/lib/phases.ts, BENCH_PHASE_N children one at a time) is printed and written with the results.
 *
 *   npm run bench -- spawn   (env: BENCH_N=100, BENCH_COLD_N=4, BENCH_PHASE_N=10, BENCH_TAG=pyagent,
 *                             BENCH_CONCURRENCY, BENCH_WARM=0 to skip the warm-pool run)
 */
import os from "node:os";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { chooseAccelerator } from "../src/controller/machines/accelerator.js";
import { coldBootEval } from "../src/controller/machines/cold-boot.js";
import { prepareRestore } from "../src/controller/machines/restore-plan.js";
import { forkChildren } from "../src/controller/sandboxes/fork-children.js";
import { WarmPool } from "../src/controller/sandboxes/warm-pool.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { listSnapshots } from "../src/controller/snapshots/list.js";
import { buildImage, loadTemplate } from "../src/image/index.js";
import { DEFAULT_TCG_TB_SIZE_MIB } from "../src/vmm/qemu-args.js";
import { envNumber, envOptionalNumber } from "./lib/env.js";
import { measurePhases, threadsCpuMs } from "./lib/phases.js";
import {
  hostDescription,
  idleCpuMsPerSecond,
  markdownTable,
  memAvailableKiB,
  printRows,
  pssKiB,
  type Row,
  writeResults,
} from "./lib/report.js";

const N = envNumber("BENCH_N", 100);
const COLD_N = envNumber("BENCH_COLD_N", 4);
const COLD_CONCURRENCY = 2;
const PHASE_N = envNumber("BENCH_PHASE_N", 10);
const WARM = process.env.BENCH_WARM !== "0";
const TAG = process.env.BENCH_TAG ?? "pyagent";
const EXPRESSION = "numpy.zeros(5).tolist()";
const EXPECTED = "[0.0, 0.0, 0.0, 0.0, 0.0]";

const paths = resolvePaths();
const template = await loadTemplate("pyagent");
const image = await buildImage(template, {});
if (!(await listSnapshots(paths)).some((s) => s.tag === TAG)) {
  console.log(`creating snapshot ${TAG} (one-time)...`);
  await createSnapshot(paths, { tag: TAG, template: "pyagent" });
}

const loadBefore = os.loadavg();
// --- fork N (cold pool: every child's QEMU starts when the spawn asks for it) ---
const coldPoolCpu: number[] = [];
const memBefore = await memAvailableKiB();
let pssPerChildKiB = Number.NaN;
let memDeltaPerChildKiB = Number.NaN;
let idleCpuPerChild = Number.NaN;
const fork = await forkChildren(paths, {
  tag: TAG,
  n: N,
  eval: EXPRESSION,
  concurrency: envOptionalNumber("BENCH_CONCURRENCY"),
  // The child's QEMU CPU right after its answer: start, restore and first cell, nothing idle yet.
  afterWork: async (sandbox) => {
    coldPoolCpu.push(await threadsCpuMs(sandbox.pid));
  },
  inspect: async (live) => {
    const pss = await Promise.all(live.map((s) => pssKiB(s.pid)));
    pssPerChildKiB = pss.reduce((a, b) => a + b, 0) / live.length;
    memDeltaPerChildKiB = (memBefore - (await memAvailableKiB())) / live.length;
    // What N idle sandboxes cost the host while they wait for work (under TCG every guest wake-up is emulated).
    idleCpuPerChild = await idleCpuMsPerSecond(
      live.map((s) => s.pid),
      3000,
    );
  },
});
const correct = fork.children.filter((c) => c.result === EXPECTED).length;
const ready = fork.children.flatMap((c) => (c.ready_ms === null ? [] : [c.ready_ms]));

// --- fork N from a warm pool (filled before the clock starts: its CPU is reported separately) ---
let warm: {
  wall_ms: number;
  correct: number;
  cpu_ms_per_child: number;
  fill_ms: number;
  fill_cpu_ms: number;
  from_pool: number;
} | null = null;
if (WARM) {
  const pool = new WarmPool(paths);
  try {
    const fillStarted = performance.now();
    pool.warm(TAG, N);
    await pool.waitFull(TAG, 600_000);
    const fillMs = performance.now() - fillStarted;
    const fillCpu = (await Promise.all(poolPids(pool))).reduce((a, b) => a + b, 0);
    const warmCpu: number[] = [];
    const warmFork = await forkChildren(paths, {
      tag: TAG,
      n: N,
      eval: EXPRESSION,
      pool,
      concurrency: envOptionalNumber("BENCH_CONCURRENCY"),
      afterWork: async (sandbox) => {
        warmCpu.push(await threadsCpuMs(sandbox.pid));
      },
    });
    warm = {
      wall_ms: Math.round(warmFork.wall_ms),
      correct: warmFork.children.filter((c) => c.result === EXPECTED).length,
      cpu_ms_per_child: round1(mean(warmCpu)),
      fill_ms: Math.round(fillMs),
      fill_cpu_ms: round1(fillCpu / N),
      from_pool: pool.taken(),
    };
  } finally {
    await pool.close();
  }
}

// --- where one child's CPU goes, phase by phase (one child at a time) ---
const phasePlan = await prepareRestore(paths, TAG);
const phases = await measurePhases(paths, phasePlan, PHASE_N, EXPRESSION, EXPECTED).finally(() =>
  phasePlan.dispose(),
);

// --- cold boot baseline, same image and expression ---
const accel = await chooseAccelerator(paths, image);
const cold: number[] = [];
let coldCorrect = 0;
const coldStarted = performance.now();
let nextCold = 0;
await Promise.all(
  Array.from({ length: COLD_CONCURRENCY }, async () => {
    while (nextCold < COLD_N) {
      nextCold++;
      const r = await coldBootEval(paths, { template, image, accel, code: EXPRESSION });
      cold.push(r.totalMs);
      if (r.result === EXPECTED) coldCorrect++;
    }
  }),
);
const coldWallMs = performance.now() - coldStarted;

const forkPerSandboxMs = fork.wall_ms / N;
const coldPerSandboxMs = coldWallMs / COLD_N;
const result = {
  accelerator: fork.accelerator,
  host: hostDescription(),
  load_average_before: loadBefore.map(round1),
  load_average_after: os.loadavg().map(round1),
  tcg_cache_mib: process.env.FORKD_TCG_CACHE_MIB ?? `${DEFAULT_TCG_TB_SIZE_MIB} (default)`,
  n: N,
  correct,
  wall_ms: Math.round(fork.wall_ms),
  p50_ms: Math.round(percentile(ready, 50)),
  p99_ms: Math.round(percentile(ready, 99)),
  pss_mib_per_child: round1(pssPerChildKiB / 1024),
  host_mem_delta_mib_per_child: round1(memDeltaPerChildKiB / 1024),
  idle_cpu_ms_per_s_per_child: round1(idleCpuPerChild),
  fork_per_sandbox_ms: round1(forkPerSandboxMs),
  cpu_ms_per_child: round1(mean(coldPoolCpu)),
  warm_pool_wall_ms: warm?.wall_ms ?? null,
  warm_pool: warm,
  phases,
  cold_boot_n: COLD_N,
  cold_boot_correct: coldCorrect,
  cold_boot_per_sandbox_ms: Math.round(coldPerSandboxMs),
  cold_boot_latency_p50_ms: Math.round(percentile(cold, 50)),
  speedup_per_sandbox: round1(coldPerSandboxMs / forkPerSandboxMs),
  measured_at: new Date().toISOString(),
};

// Targets: issue 13's, as the README's table states them.
const rows: Row[] = [
  { metric: "accelerator", value: result.accelerator },
  {
    metric: `wall-clock, N=${N} all answered`,
    value: `${result.wall_ms} ms`,
    target: "< 15000 ms",
    note: `${correct}/${N} correct`,
  },
  { metric: "child ready latency p50", value: `${result.p50_ms} ms` },
  { metric: "child ready latency p99", value: `${result.p99_ms} ms` },
  { metric: "PSS per child (smaps_rollup)", value: `${result.pss_mib_per_child} MiB`, target: "< 24 MiB" },
  { metric: "host MemAvailable delta / N", value: `${result.host_mem_delta_mib_per_child} MiB` },
  {
    metric: "idle host CPU per child",
    value: `${result.idle_cpu_ms_per_s_per_child} ms/s`,
    note: `all ${N} alive and idle, 3 s sample`,
  },
  { metric: "fork, per sandbox (wall/N)", value: `${result.fork_per_sandbox_ms} ms` },
  {
    metric: "host CPU per child to first answer, cold pool",
    value: `${result.cpu_ms_per_child} ms`,
    target: "< 200 ms",
    note: `QEMU's threads (schedstat) right after the answer, ${N} children, ${fork.accelerator}`,
  },
  ...(warm
    ? [
        {
          metric: `wall-clock, N=${N} all answered, warm pool`,
          value: `${warm.wall_ms} ms`,
          target: "< 10000 ms",
          note: `${warm.correct}/${N} correct; pool of ${N} filled beforehand in ${warm.fill_ms} ms (${warm.fill_cpu_ms} ms CPU per VM); ${warm.from_pool} from the pool`,
        },
        {
          metric: "host CPU per child to first answer, warm pool",
          value: `${warm.cpu_ms_per_child} ms`,
          note: "includes the prestart paid before the spawn",
        },
      ]
    : []),
  {
    metric: `cold boot, per sandbox (wall/N, N=${COLD_N})`,
    value: `${result.cold_boot_per_sandbox_ms} ms`,
    note: `${coldCorrect}/${COLD_N} correct; latency p50 ${result.cold_boot_latency_p50_ms} ms`,
  },
  { metric: "fork speed-up per sandbox", value: `${result.speedup_per_sandbox}x` },
];
const phaseRows: Row[] = phases.rows.map((r) => ({
  metric: r.phase,
  value: `${r.cpu_ms} ms`,
  note: `wall ${r.wall_ms} ms; ${r.tbs_translated} TBs, ${r.code_kib} KiB code translated; ${r.tb_flushes} cache flushes`,
}));
phaseRows.push({
  metric: "sum of phases / unsplit spawn path",
  value: `${phases.split_cpu_ms} ms`,
  note: `spawn path (restore + first cell) measured alternately: ${phases.spawn_path_cpu_ms} ms`,
});
const conditions = `${result.accelerator}, load average ${result.load_average_before.join(" ")} before, ${result.load_average_after.join(" ")} after`;
printRows(`bench/spawn on ${result.host} (${conditions})`, rows);
printRows(
  `host CPU per child by phase (N=${PHASE_N}, one at a time, TCG cache ${result.tcg_cache_mib} MiB)`,
  phaseRows,
);
await writeResults(
  "spawn",
  result,
  `# bench/spawn\n\n${result.measured_at} on ${result.host}; ${conditions}; guest 512 MiB pyagent, ${EXPRESSION}\n\n` +
    `${markdownTable(rows)}\n\n## Host CPU per child by phase (N=${PHASE_N}, one at a time)\n\n${markdownTable(phaseRows)}`,
);
if (correct !== N || (warm && warm.correct !== N)) process.exitCode = 1;

function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN;
}

function poolPids(pool: WarmPool): Promise<number>[] {
  return pool.pids().map((pid) => threadsCpuMs(pid).catch(() => 0));
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
