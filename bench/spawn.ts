/**
 * bench/spawn — the headline workload. Fork N=100 children from the `pyagent` snapshot; each evaluates
 * `numpy.zeros(5).tolist()`; the clock stops when all N have returned the right answer (agent readiness
 * included). Side by side in the same run: a cold-boot baseline (fresh VMs from the same image, same
 * expression). Memory is measured while all N children are alive.
 *
 *   npm run bench -- spawn            (env: BENCH_N=100, BENCH_COLD_N=4, BENCH_TAG=pyagent, BENCH_CONCURRENCY)
 */
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { chooseAccelerator } from "../src/controller/accelerator.js";
import { coldBootEval } from "../src/controller/cold-boot.js";
import { createSnapshot } from "../src/controller/create-snapshot.js";
import { forkChildren } from "../src/controller/fork.js";
import { listSnapshots } from "../src/controller/snapshots.js";
import { buildImage, loadTemplate } from "../src/image/index.js";
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

const N = Number(process.env.BENCH_N ?? 100);
const COLD_N = Number(process.env.BENCH_COLD_N ?? 4);
const COLD_CONCURRENCY = 2;
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

// --- fork N ---
const memBefore = await memAvailableKiB();
let pssPerChildKiB = Number.NaN;
let memDeltaPerChildKiB = Number.NaN;
let idleCpuPerChild = Number.NaN;
const fork = await forkChildren(paths, {
  tag: TAG,
  n: N,
  eval: EXPRESSION,
  concurrency: process.env.BENCH_CONCURRENCY ? Number(process.env.BENCH_CONCURRENCY) : undefined,
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
  n: N,
  correct,
  wall_ms: Math.round(fork.wall_ms),
  p50_ms: Math.round(percentile(ready, 50)),
  p99_ms: Math.round(percentile(ready, 99)),
  pss_mib_per_child: round1(pssPerChildKiB / 1024),
  host_mem_delta_mib_per_child: round1(memDeltaPerChildKiB / 1024),
  idle_cpu_ms_per_s_per_child: round1(idleCpuPerChild),
  fork_per_sandbox_ms: round1(forkPerSandboxMs),
  cold_boot_n: COLD_N,
  cold_boot_correct: coldCorrect,
  cold_boot_per_sandbox_ms: Math.round(coldPerSandboxMs),
  cold_boot_latency_p50_ms: Math.round(percentile(cold, 50)),
  speedup_per_sandbox: round1(coldPerSandboxMs / forkPerSandboxMs),
  measured_at: new Date().toISOString(),
};

const rows: Row[] = [
  { metric: "accelerator", value: result.accelerator },
  {
    metric: `wall-clock, N=${N} all answered`,
    value: `${result.wall_ms} ms`,
    target: "< 2000 ms",
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
    metric: `cold boot, per sandbox (wall/N, N=${COLD_N})`,
    value: `${result.cold_boot_per_sandbox_ms} ms`,
    note: `${coldCorrect}/${COLD_N} correct; latency p50 ${result.cold_boot_latency_p50_ms} ms`,
  },
  { metric: "fork speed-up per sandbox", value: `${result.speedup_per_sandbox}x`, target: ">= 50x" },
];
printRows(`bench/spawn on ${result.host}`, rows);
await writeResults(
  "spawn",
  result,
  `# bench/spawn\n\n${result.measured_at} on ${result.host}; guest 512 MiB pyagent, ${EXPRESSION}\n\n${markdownTable(rows)}`,
);
if (correct !== N) process.exitCode = 1;

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
