/**
 * bench/cpu-models — the guest CPU model against host CPU per child under TCG. One snapshot of the pyagent
 * template per model (`FORKD_TCG_CPU`), built in this run; then children of every model side by side, one
 * child alive at a time, the models' order rotated every round so the host's load falls on all of them alike.
 * Each child: restore and first cell (`numpy.zeros(5).tolist()`: what a spawn costs), `exec true` (the command
 * path), a cold `python3 -c` process, and three work cells (pure Python, numpy, hashlib+json); every answer is
 * checked against its known value. Host CPU is QEMU's threads' (schedstat) across each step.
 *
 *   npm run bench -- cpu-models   (env: BENCH_MODELS=max,Nehalem,... BENCH_ROUNDS=6, BENCH_KEEP=1 keeps the
 *                                  snapshots, BENCH_REUSE=1 reuses snapshots of a kept run)
 */
import { createHash } from "node:crypto";
import os from "node:os";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { createSnapshot } from "../src/controller/create-snapshot.js";
import { prepareRestore, type RestorePlan } from "../src/controller/restore-plan.js";
import { Sandbox } from "../src/controller/sandbox.js";
import { listSnapshots } from "../src/controller/snapshots.js";
import { SnapshotStore } from "../src/store/snapshot-store.js";
import { DEFAULT_TCG_CPU_MODEL } from "../src/vmm/cpu-model.js";
import { threadsCpuMs } from "./lib/phases.js";
import {
  benchConditions,
  hostDescription,
  markdownTable,
  printRows,
  type Row,
  writeResults,
} from "./lib/report.js";

/** The candidates: "max" (today's), named Intel generations, and the x86-64 levels QEMU 7.2 has no names for. */
const DEFAULT_MODELS = [
  "max",
  "max,-la57",
  "max,-avx,-avx2,-fma,-f16c",
  "qemu64",
  // x86-64-v2 on qemu64: SSE3, SSSE3, SSE4.1/4.2, POPCNT, CX16, LAHF.
  "qemu64,+pni,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+lahf-lm",
  "Nehalem",
  "Westmere",
  "SandyBridge",
  "SandyBridge,-avx",
  "Haswell-noTSX",
  // x86-64-v3 on qemu64: v2 plus AVX, AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE, XSAVE.
  "qemu64,+pni,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+lahf-lm,+avx,+avx2,+bmi1,+bmi2,+f16c,+fma,+abm,+movbe,+xsave",
];
const MODELS = process.env.BENCH_MODELS ? process.env.BENCH_MODELS.split(";") : DEFAULT_MODELS;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 6);
const KEEP = process.env.BENCH_KEEP === "1";
const REUSE = process.env.BENCH_REUSE === "1";
const EXEC_TRUE_CALLS = 3;

interface Cell {
  name: string;
  code: string;
  expected: string;
}
const FIRST: Cell = {
  name: "first cell",
  code: "numpy.zeros(5).tolist()",
  expected: "[0.0, 0.0, 0.0, 0.0, 0.0]",
};
const SQUARES_N = 200_000;
const MATRIX_N = 120;
const JSON_N = 20_000;
const WORK: Cell[] = [
  {
    name: "pure Python",
    code: `sum(i * i for i in range(${SQUARES_N}))`,
    // sum of i^2 for i < n = (n-1) n (2n-1) / 6
    expected: String(((BigInt(SQUARES_N) - 1n) * BigInt(SQUARES_N) * (2n * BigInt(SQUARES_N) - 1n)) / 6n),
  },
  {
    name: "numpy",
    code: `int(numpy.dot(numpy.ones((${MATRIX_N}, ${MATRIX_N})), numpy.ones((${MATRIX_N}, ${MATRIX_N}))).sum())`,
    expected: String(MATRIX_N ** 3),
  },
  {
    name: "hashlib+json",
    code: `import hashlib, json\nhashlib.sha256(json.dumps(list(range(${JSON_N}))).encode()).hexdigest()`,
    expected: `'${createHash("sha256")
      .update(`[${Array.from({ length: JSON_N }, (_, i) => i).join(", ")}]`)
      .digest("hex")}'`,
  },
];
const STEPS = ["restore + first cell", "exec true", "exec python3 -c", ...WORK.map((c) => c.name)] as const;

const paths = resolvePaths();
const store = new SnapshotStore(paths.snapshots);
const loadBefore = os.loadavg();
const tagOf = (i: number) => `bench-cpu-${i}`;
const previous = process.env.FORKD_TCG_CPU;

interface ModelRun {
  model: string;
  tag: string;
  plan?: RestorePlan;
  build: { wall_ms: number; boot_ms: number; warmup_ms: number; cpu_in_manifest: string };
  guest_flags: string[];
  cpu: Record<string, number[]>;
  wall: Record<string, number[]>;
}
const runs: ModelRun[] = [];
try {
  // --- one snapshot per model ---
  const existing = new Set((await listSnapshots(paths)).map((s) => s.tag));
  for (const [i, model] of MODELS.entries()) {
    const tag = tagOf(i);
    process.env.FORKD_TCG_CPU = model;
    const started = performance.now();
    let manifest = REUSE && existing.has(tag) ? (await store.get(tag)).manifest : undefined;
    if (manifest && manifest.machine.cpu !== model) manifest = undefined;
    if (!manifest) {
      console.log(`building snapshot ${tag} on -cpu ${model} ...`);
      manifest = (await createSnapshot(paths, { tag, template: "pyagent", replace: true })).manifest;
    }
    if (manifest.machine.accel !== "tcg") throw new Error("bench/cpu-models compares TCG guest CPU models");
    runs.push({
      model,
      tag,
      build: {
        wall_ms: Math.round(performance.now() - started),
        boot_ms: manifest.timings.bootMs,
        warmup_ms: manifest.timings.warmupMs,
        cpu_in_manifest: manifest.machine.cpu,
      },
      guest_flags: [],
      cpu: Object.fromEntries(STEPS.map((s) => [s, []])),
      wall: Object.fromEntries(STEPS.map((s) => [s, []])),
    });
  }
  for (const run of runs) run.plan = await prepareRestore(paths, run.tag);

  // --- children, models interleaved and their order rotated each round ---
  for (let round = 0; round < ROUNDS; round++) {
    for (let k = 0; k < runs.length; k++) {
      const run = runs[(round + k) % runs.length] as ModelRun;
      await measureChild(run, round === 0);
    }
    console.log(`round ${round + 1}/${ROUNDS} done (load ${os.loadavg()[0]?.toFixed(2)})`);
  }

  const conditions = await benchConditions(runs[0]?.plan?.snapshot.manifest);
  const results = runs.map((run) => ({
    model: run.model,
    default: run.model === DEFAULT_TCG_CPU_MODEL,
    snapshot: run.build,
    guest_flags: run.guest_flags,
    steps: Object.fromEntries(
      STEPS.map((s) => [
        s,
        {
          cpu_ms_p50: r1(percentile(run.cpu[s] ?? [], 50)),
          wall_ms_p50: r1(percentile(run.wall[s] ?? [], 50)),
        },
      ]),
    ),
    work_cpu_ms_p50: r1(
      percentile(
        sumPerChild(
          run,
          WORK.map((c) => c.name),
        ),
        50,
      ),
    ),
  }));
  const baseline = results.find((r) => r.model === "max") ?? results[0];
  const result = {
    host: hostDescription(),
    ...conditions,
    cpu_model: "per row",
    load_average_before: loadBefore.map(r1),
    load_average_after: os.loadavg().map(r1),
    rounds: ROUNDS,
    results,
    measured_at: new Date().toISOString(),
  };
  const first = (r: (typeof results)[number]) =>
    r.steps["restore + first cell"] as { cpu_ms_p50: number; wall_ms_p50: number };
  const rel = (a: number, b: number | undefined) =>
    b ? `${a <= b ? "" : "+"}${r1((a / b - 1) * 100)}%` : "";
  const rows: Row[] = results.map((r) => ({
    metric: `\`${r.model}\`${r.default ? " (default)" : ""}`,
    value: `${first(r).cpu_ms_p50} ms`,
    note:
      `${rel(first(r).cpu_ms_p50, baseline && first(baseline).cpu_ms_p50)} vs max; wall ${first(r).wall_ms_p50} ms; ` +
      `exec true ${r.steps["exec true"]?.wall_ms_p50} ms; python3 -c ${r.steps["exec python3 -c"]?.wall_ms_p50} ms wall; ` +
      `work cells ${r.work_cpu_ms_p50} ms CPU (${rel(r.work_cpu_ms_p50, baseline?.work_cpu_ms_p50)}); ` +
      `parent boot ${r.snapshot.boot_ms} ms + warm-up ${r.snapshot.warmup_ms} ms; guest has ${r.guest_flags.join(" ") || "none of avx/avx2/avx512f/la57/xsave"}`,
  }));
  const stepRows: Row[] = results.flatMap((r) =>
    STEPS.map((s) => ({
      metric: `\`${r.model}\` ${s}`,
      value: `${r.steps[s]?.cpu_ms_p50} ms`,
      note: `wall ${r.steps[s]?.wall_ms_p50} ms`,
    })),
  );
  const head = `${result.accelerator}, QEMU ${result.qemu_version}, load average ${result.load_average_before.join(" ")} before, ${result.load_average_after.join(" ")} after`;
  printRows(
    `bench/cpu-models on ${result.host} (${head}); host CPU p50 per child, restore + first cell`,
    rows,
  );
  await writeResults(
    "cpu-models",
    result,
    `# bench/cpu-models\n\n${result.measured_at} on ${result.host}; ${head}; pyagent (512 MiB), one snapshot per model built in this run, ` +
      `${ROUNDS} rounds of one child per model, interleaved (order rotated each round), one child alive at a time; p50s\n\n` +
      `${markdownTable(rows)}\n\n## Every step (host CPU p50 of QEMU's threads)\n\n${markdownTable(stepRows)}`,
  );
} finally {
  if (previous === undefined) delete process.env.FORKD_TCG_CPU;
  else process.env.FORKD_TCG_CPU = previous;
  for (const run of runs) await run.plan?.dispose();
  if (!KEEP) for (const run of runs) await store.delete(run.tag).catch(() => {});
}

async function measureChild(run: ModelRun, firstRound: boolean): Promise<void> {
  const plan = run.plan as RestorePlan;
  const started = performance.now();
  const sandbox = await Sandbox.restore(paths, plan);
  try {
    let cpu = 0;
    let t = started;
    const mark = async (step: string) => {
      const now = await threadsCpuMs(sandbox.pid);
      run.cpu[step]?.push(now - cpu);
      run.wall[step]?.push(performance.now() - t);
      cpu = now;
      t = performance.now();
    };
    await checkCell(sandbox, FIRST);
    await mark("restore + first cell");
    if (firstRound) {
      const flags = await sandbox.agent.eval(
        "sorted({'avx','avx2','avx512f','la57','xsave'} & set(open('/proc/cpuinfo').read().split()))",
        { timeoutMs: 60_000 },
      );
      run.guest_flags = JSON.parse((flags.result ?? "[]").replaceAll("'", '"')) as string[];
      cpu = await threadsCpuMs(sandbox.pid);
      t = performance.now();
    }
    const trueCpu: number[] = [];
    const trueWall: number[] = [];
    for (let i = 0; i < EXEC_TRUE_CALLS; i++) {
      const ran = await sandbox.agent.exec(["true"], { timeoutMs: 60_000 });
      if (ran.exitCode !== 0) throw new Error(`${run.model}: exec true exited ${ran.exitCode}`);
      const now = await threadsCpuMs(sandbox.pid);
      trueCpu.push(now - cpu);
      trueWall.push(performance.now() - t);
      cpu = now;
      t = performance.now();
    }
    run.cpu["exec true"]?.push(percentile(trueCpu, 50));
    run.wall["exec true"]?.push(percentile(trueWall, 50));
    const py = await sandbox.agent.exec(["python3", "-c", "print(6 * 7)"], { timeoutMs: 60_000 });
    if (py.stdout.toString().trim() !== "42")
      throw new Error(`${run.model}: python3 -c printed ${py.stdout}`);
    await mark("exec python3 -c");
    for (const cell of WORK) {
      await checkCell(sandbox, cell, run.model);
      await mark(cell.name);
    }
  } finally {
    await sandbox.destroy();
  }
}

async function checkCell(sandbox: Sandbox, cell: Cell, model = ""): Promise<void> {
  const out = await sandbox.agent.eval(cell.code, { timeoutMs: 120_000 });
  if (out.result !== cell.expected) {
    throw new Error(
      `${model}: ${cell.name} answered ${JSON.stringify(out.result)} (error ${out.error?.message}), expected ${cell.expected}`,
    );
  }
}

function sumPerChild(run: ModelRun, steps: string[]): number[] {
  const n = run.cpu[steps[0] as string]?.length ?? 0;
  return Array.from({ length: n }, (_, i) => steps.reduce((a, s) => a + (run.cpu[s]?.[i] ?? 0), 0));
}

function r1(n: number): number {
  return Math.round(n * 10) / 10;
}
