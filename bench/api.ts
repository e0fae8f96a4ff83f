/**
 * bench/api — the headline workload through the daemon's REST API (via the TypeScript SDK), against the
 * in-process engine in the same run: 100 children each evaluating `numpy.zeros(5).tolist()`. Each API pattern is
 * compared with the engine doing the same thing, because the pattern itself changes the cost under TCG (a child
 * evaluates its first cell more slowly after sitting idle for a few seconds than right after its restore):
 *   - one by one: each of P workers (P = host CPUs, the engine's fork concurrency) creates a sandbox and runs the
 *     cell in it, all sandboxes kept alive until every one has answered (`forkd fork`'s pattern);
 *   - batch: one spawn of N, then N cells at once.
 * Then request round trips: a trivial exec and a trivial eval, under 1 and under 50 concurrent clients.
 *
 *   npm run bench -- api            (env: BENCH_N=100, BENCH_TAG=pyagent, BENCH_REQUESTS=20)
 */
import { rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { prepareRestore } from "../src/controller/machines/restore-plan.js";
import { Sandbox as EngineSandbox } from "../src/controller/machines/sandbox-vm.js";
import { DEFAULT_FORK_CONCURRENCY, forkChildren } from "../src/controller/sandboxes/fork-children.js";
import { Sandbox } from "../src/sdk/index.js";
import { startBenchDaemon } from "./lib/daemon.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const N = envNumber("BENCH_N", 100);
const TAG = process.env.BENCH_TAG ?? "pyagent";
const REQUESTS = envNumber("BENCH_REQUESTS", 20);
const EXPRESSION = "numpy.zeros(5).tolist()";
const EXPECTED = "[0.0, 0.0, 0.0, 0.0, 0.0]";

const paths = resolvePaths();
const socketPath = path.join(os.tmpdir(), `forkd-bench-api-${process.pid}.sock`);

// --- the engine, in process: one by one (forkChildren), then batch ---
const engine = await forkChildren(paths, { tag: TAG, n: N, eval: EXPRESSION });
const engineOk = engine.children.filter((c) => c.result === EXPECTED).length;
const engineBatch = await engineBatchRun();

/** The batch pattern in process: restore N (P at a time), then evaluate in all N at once. */
async function engineBatchRun(): Promise<{ ms: number; ok: number }> {
  const plan = await prepareRestore(paths, TAG);
  const started = performance.now();
  const sandboxes: EngineSandbox[] = [];
  try {
    let next = 0;
    await Promise.all(
      Array.from({ length: DEFAULT_FORK_CONCURRENCY }, async () => {
        while (next < N) {
          next++;
          sandboxes.push(await EngineSandbox.restore(paths, plan));
        }
      }),
    );
    const answers = await Promise.all(sandboxes.map((s) => s.agent.eval(EXPRESSION, { timeoutMs: 600_000 })));
    return { ms: performance.now() - started, ok: answers.filter((a) => a.result === EXPECTED).length };
  } finally {
    await Promise.all(sandboxes.map((s) => s.destroy()));
    await plan.dispose();
  }
}

const daemon = await startBenchDaemon(paths.home, socketPath);
try {
  const { controller } = daemon;
  // --- SDK Sandbox class, one by one: P workers each create a sandbox and run the cell ---
  let started = performance.now();
  const oneByOne: Sandbox[] = [];
  let oneByOneOk = 0;
  let created = 0;
  await Promise.all(
    Array.from({ length: DEFAULT_FORK_CONCURRENCY }, async () => {
      while (created < N) {
        created++;
        const sandbox = await Sandbox.create({ snapshotTag: TAG, url: daemon.url, env: {}, timeoutMs: 0 });
        oneByOne.push(sandbox);
        if ((await sandbox.runCode(EXPRESSION)).result === EXPECTED) oneByOneOk++;
      }
    }),
  );
  const oneByOneMs = performance.now() - started;
  await controller.killSandboxes({ all: true });

  // --- REST: one spawn request for N, then N evals at once ---
  started = performance.now();
  const spawned = await controller.spawnSandboxes({ snapshotTag: TAG, n: N, timeoutMs: 0 });
  const answers = await Promise.all(spawned.map((s) => controller.evalCode(s.id, EXPRESSION)));
  const restMs = performance.now() - started;
  const restOk = answers.filter((a) => a.result === EXPECTED).length;
  await controller.killSandboxes({ all: true });

  // --- SDK Sandbox class: createMany, then runCode in each ---
  started = performance.now();
  const sandboxes = await Sandbox.createMany(N, { snapshotTag: TAG, url: daemon.url, env: {}, timeoutMs: 0 });
  const sdkAnswers = await Promise.all(sandboxes.map((s) => s.runCode(EXPRESSION)));
  const sdkMs = performance.now() - started;
  const sdkOk = sdkAnswers.filter((a) => a.result === EXPECTED).length;
  await controller.killSandboxes({ all: true });

  // --- round trips on warm sandboxes (each path used once before timing) ---
  const warm = await controller.spawnSandboxes({ snapshotTag: TAG, n: 2, timeoutMs: 0 });
  const ids = warm.map((s) => s.id);
  for (const id of ids) {
    await controller.execCommand(id, ["true"]);
    await controller.evalCode(id, "1+1");
  }
  const roundTrips = async (clients: number, call: (id: string) => Promise<unknown>) => {
    const times: number[] = [];
    await Promise.all(
      Array.from({ length: clients }, async (_, c) => {
        for (let i = 0; i < REQUESTS; i++) {
          const t = performance.now();
          await call(ids[c % ids.length] as string);
          times.push(performance.now() - t);
        }
      }),
    );
    return { p50: percentile(times, 50), p99: percentile(times, 99) };
  };
  const exec1 = await roundTrips(1, (id) => controller.execCommand(id, ["true"]));
  const exec50 = await roundTrips(50, (id) => controller.execCommand(id, ["true"]));
  const eval1 = await roundTrips(1, (id) => controller.evalCode(id, "1+1"));
  const eval50 = await roundTrips(50, (id) => controller.evalCode(id, "1+1"));

  const overheadPct = (ms: number, base: number) => Math.round(((ms - base) / base) * 1000) / 10;
  const overhead = (ms: number, base: number) => `${overheadPct(ms, base).toFixed(1)}%`;
  const f = (v: number) => `${v.toFixed(1)} ms`;
  const rows: Row[] = [
    { metric: "accelerator", value: engine.accelerator },
    {
      metric: `one by one: engine (forkd fork), N=${N}`,
      value: `${Math.round(engine.wall_ms)} ms`,
      note: `${engineOk}/${N} correct`,
    },
    {
      metric: `one by one: SDK Sandbox.create + runCode, N=${N}`,
      value: `${Math.round(oneByOneMs)} ms`,
      target: "overhead < 10%",
      note: `${oneByOneOk}/${N} correct; overhead ${overhead(oneByOneMs, engine.wall_ms)}`,
    },
    {
      metric: `batch: engine, restore ${N} then eval in all`,
      value: `${Math.round(engineBatch.ms)} ms`,
      note: `${engineBatch.ok}/${N} correct`,
    },
    {
      metric: `batch: REST (SDK Controller) spawn n=${N} + ${N} evals`,
      value: `${Math.round(restMs)} ms`,
      target: "overhead < 10%",
      note: `${restOk}/${N} correct; overhead ${overhead(restMs, engineBatch.ms)}`,
    },
    {
      metric: `batch: SDK Sandbox.createMany + runCode, N=${N}`,
      value: `${Math.round(sdkMs)} ms`,
      target: "overhead < 10%",
      note: `${sdkOk}/${N} correct; overhead ${overhead(sdkMs, engineBatch.ms)}`,
    },
    { metric: "exec `true`, 1 client: p50 / p99", value: `${f(exec1.p50)} / ${f(exec1.p99)}` },
    { metric: "exec `true`, 50 clients: p50 / p99", value: `${f(exec50.p50)} / ${f(exec50.p99)}` },
    { metric: "eval `1+1`, 1 client: p50 / p99", value: `${f(eval1.p50)} / ${f(eval1.p99)}` },
    { metric: "eval `1+1`, 50 clients: p50 / p99", value: `${f(eval50.p50)} / ${f(eval50.p99)}` },
  ];
  const result = {
    accelerator: engine.accelerator,
    host: hostDescription(),
    n: N,
    engine_wall_ms: Math.round(engine.wall_ms),
    sdk_one_by_one_wall_ms: Math.round(oneByOneMs),
    sdk_one_by_one_overhead_pct: overheadPct(oneByOneMs, engine.wall_ms),
    engine_batch_wall_ms: Math.round(engineBatch.ms),
    rest_wall_ms: Math.round(restMs),
    sdk_wall_ms: Math.round(sdkMs),
    rest_overhead_pct: overheadPct(restMs, engineBatch.ms),
    sdk_overhead_pct: overheadPct(sdkMs, engineBatch.ms),
    correct: {
      engine: engineOk,
      sdk_one_by_one: oneByOneOk,
      engine_batch: engineBatch.ok,
      rest: restOk,
      sdk: sdkOk,
    },
    exec_ms: { clients_1: exec1, clients_50: exec50 },
    eval_ms: { clients_1: eval1, clients_50: eval50 },
    measured_at: new Date().toISOString(),
  };
  printRows(`bench/api on ${result.host}`, rows);
  await writeResults(
    "api",
    result,
    `# bench/api\n\n${result.measured_at} on ${result.host}\n\n${markdownTable(rows)}`,
  );
} finally {
  await daemon.stop();
  await rm(socketPath, { force: true });
}
