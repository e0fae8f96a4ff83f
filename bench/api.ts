/**
 * bench/api — the headline workload through the daemon's REST API (via the TypeScript SDK), against the
 * in-process engine in the same run: 100 children each evaluating `numpy.zeros(5).tolist()`. Then request
 * round trips: a trivial exec and a trivial eval, under 1 and under 50 concurrent clients.
 *
 *   npm run bench -- api            (env: BENCH_N=100, BENCH_TAG=pyagent, BENCH_REQUESTS=20)
 */
import { rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { forkChildren } from "../src/controller/fork.js";
import { Sandbox } from "../src/sdk/index.js";
import { startBenchDaemon } from "./lib/daemon.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const N = Number(process.env.BENCH_N ?? 100);
const TAG = process.env.BENCH_TAG ?? "pyagent";
const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 20);
const EXPRESSION = "numpy.zeros(5).tolist()";
const EXPECTED = "[0.0, 0.0, 0.0, 0.0, 0.0]";

const paths = resolvePaths();
const socketPath = path.join(os.tmpdir(), `forkd-bench-api-${process.pid}.sock`);

// --- the engine, in process ---
const engine = await forkChildren(paths, { tag: TAG, n: N, eval: EXPRESSION });
const engineOk = engine.children.filter((c) => c.result === EXPECTED).length;

const daemon = await startBenchDaemon(paths.home, socketPath);
try {
  const { controller } = daemon;
  // --- REST: one spawn request for N, then N evals at once ---
  let started = performance.now();
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

  const overhead = (ms: number) => `${(((ms - engine.wall_ms) / engine.wall_ms) * 100).toFixed(1)}%`;
  const f = (v: number) => `${v.toFixed(1)} ms`;
  const rows: Row[] = [
    { metric: "accelerator", value: engine.accelerator },
    {
      metric: `engine (in process), N=${N} all answered`,
      value: `${Math.round(engine.wall_ms)} ms`,
      note: `${engineOk}/${N} correct`,
    },
    {
      metric: `REST (SDK Controller), N=${N} all answered`,
      value: `${Math.round(restMs)} ms`,
      target: "overhead < 10%",
      note: `${restOk}/${N} correct; overhead ${overhead(restMs)}`,
    },
    {
      metric: `SDK Sandbox.createMany + runCode, N=${N}`,
      value: `${Math.round(sdkMs)} ms`,
      target: "overhead < 10%",
      note: `${sdkOk}/${N} correct; overhead ${overhead(sdkMs)}`,
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
    rest_wall_ms: Math.round(restMs),
    sdk_wall_ms: Math.round(sdkMs),
    rest_overhead_pct: Math.round(((restMs - engine.wall_ms) / engine.wall_ms) * 1000) / 10,
    sdk_overhead_pct: Math.round(((sdkMs - engine.wall_ms) / engine.wall_ms) * 1000) / 10,
    correct: { engine: engineOk, rest: restOk, sdk: sdkOk },
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
