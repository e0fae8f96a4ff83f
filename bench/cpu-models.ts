/**
 * bench/cpu-models — the guest CPU model (and, with BENCH_QEMU_BINARIES, the QEMU version) against host CPU per
 * child under TCG. One snapshot of the pyagent template per (QEMU, model), built in this run (`FORKD_TCG_CPU`,
 * `FORKD_QEMU_BINARY`); then children of every variant side by side, one child alive at a time, the variants'
 * order rotated every round so the host's load falls on all of them alike. Each child: restore and first cell
 * (`numpy.zeros(5).tolist()`: what a spawn costs), `exec true` (the command path), a cold `python3 -c`
 * process, and three work cells (pure Python, numpy, hashlib+json); every answer is checked against its known
 * value. Host CPU is QEMU's threads' (schedstat) across each step; means with 95 % confidence intervals, since
 * a shared 2-core host is noisy.
 *
 *   npm run bench -- cpu-models   (env: BENCH_MODELS=max;Nehalem;... BENCH_QEMU_BINARIES=/usr/bin/qemu-system-x86_64;...
 *                                  BENCH_ROUNDS=10, BENCH_KEEP=1 keeps the snapshots, BENCH_REUSE=1 reuses kept ones)
 */
import { createHash } from "node:crypto";
import os from "node:os";
import { resolvePaths } from "../src/common/paths.js";
import { prepareRestore, type RestorePlan } from "../src/controller/machines/restore-plan.js";
import { Sandbox } from "../src/controller/machines/sandbox-vm.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { listSnapshots } from "../src/controller/snapshots/list.js";
import type { SnapshotManifest } from "../src/store/manifest.js";
import { SnapshotStore } from "../src/store/snapshot-store.js";
import { DEFAULT_TCG_CPU_MODEL } from "../src/vmm/cpu-model.js";
import { qemuVersion } from "../src/vmm/qemu-tools.js";
import { envNumber } from "./lib/env.js";
import { threadsCpuMs } from "./lib/phases.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

/** The candidates: "max" (the old default), "max" without one feature family each, named generations, levels. */
const DEFAULT_MODELS = [
  "max",
  // 5-level paging: a longer page walk on every TLB miss.
  "max,-la57",
  // TCG runs REP MOVS/STOS one element per pass through a translated block: with ERMS/FSRM the guest's kernel
  // and glibc pick `rep movsb`/`rep stosb` for copies and page clearing.
  "max,-erms,-fsrm",
  // AVX/AVX2: wider vector paths in glibc and numpy, and a larger XSAVE state per context switch.
  "max,-avx,-avx2,-fma,-f16c",
  "max,-avx,-avx2,-fma,-f16c,-erms,-fsrm,-la57",
  // x86-64-v2 (SSE4.2, POPCNT, CX16; QEMU has no names for the levels), none of the above.
  "Nehalem",
];
const MODELS = process.env.BENCH_MODELS ? process.env.BENCH_MODELS.split(";") : DEFAULT_MODELS;
const QEMUS = process.env.BENCH_QEMU_BINARIES ? process.env.BENCH_QEMU_BINARIES.split(";") : [undefined];
const ROUNDS = envNumber("BENCH_ROUNDS", 8);
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
const SPAWN_STEP = "restore + first cell";
const STEPS = [SPAWN_STEP, "exec true", "exec python3 -c", ...WORK.map((c) => c.name)] as const;

const paths = resolvePaths();
const store = new SnapshotStore(paths.snapshots);
const loadBefore = os.loadavg();
const saved = { cpu: process.env.FORKD_TCG_CPU, qemu: process.env.FORKD_QEMU_BINARY };

interface Variant {
  qemuBinary: string | undefined;
  qemu: string;
  model: string;
  tag: string;
  plan?: RestorePlan;
  build: { wall_ms: number; boot_ms: number; warmup_ms: number };
  guest_flags: string[];
  cpu: Record<string, number[]>;
  wall: Record<string, number[]>;
}
/** A variant whose snapshot could not be built keeps its row, with the error. */
const failed: { qemu: string; model: string; error: string }[] = [];
const variants: Variant[] = [];
try {
  // --- one snapshot per (QEMU, model), grouped by QEMU (each QEMU has its own accelerator probe) ---
  const existing = new Set((await listSnapshots(paths)).map((s) => s.tag));
  for (const [q, qemuBinary] of QEMUS.entries()) {
    setEnv("FORKD_QEMU_BINARY", qemuBinary ?? saved.qemu);
    const qemu = (await qemuVersion()).version;
    for (const [m, model] of MODELS.entries()) {
      const tag = `bench-cpu-q${q}-m${m}`;
      process.env.FORKD_TCG_CPU = model;
      const started = performance.now();
      let manifest: SnapshotManifest | undefined;
      if (REUSE && existing.has(tag)) {
        const kept = (await store.get(tag)).manifest;
        if (kept.machine.cpu === model && kept.machine.qemuVersion === qemu) manifest = kept;
      }
      if (!manifest) {
        console.log(`building snapshot ${tag}: QEMU ${qemu}, -cpu ${model} ...`);
        try {
          manifest = (await createSnapshot(paths, { tag, template: "pyagent", replace: true })).manifest;
        } catch (err) {
          const error = (err instanceof Error ? err.message : String(err)).split("\n")[0] as string;
          console.log(`  no snapshot: ${error}`);
          failed.push({ qemu, model, error });
          continue;
        }
      }
      if (manifest.machine.accel !== "tcg") throw new Error("bench/cpu-models compares TCG guests");
      variants.push({
        qemuBinary: qemuBinary ?? saved.qemu,
        qemu,
        model,
        tag,
        build: {
          wall_ms: Math.round(performance.now() - started),
          boot_ms: manifest.timings.bootMs,
          warmup_ms: manifest.timings.warmupMs,
        },
        guest_flags: [],
        cpu: Object.fromEntries(STEPS.map((s) => [s, []])),
        wall: Object.fromEntries(STEPS.map((s) => [s, []])),
      });
    }
  }
  for (const v of variants) v.plan = await prepareRestore(paths, v.tag);

  // --- children, variants interleaved and their order rotated each round ---
  for (let round = 0; round < ROUNDS; round++) {
    for (let k = 0; k < variants.length; k++) {
      const v = variants[(round + k) % variants.length] as Variant;
      setEnv("FORKD_QEMU_BINARY", v.qemuBinary);
      await measureChild(v, round === 0);
    }
    console.log(`round ${round + 1}/${ROUNDS} done (load ${os.loadavg()[0]?.toFixed(2)})`);
  }

  const label = (v: { qemu: string; model: string }) =>
    QEMUS.length > 1 ? `QEMU ${v.qemu} \`${v.model}\`` : `\`${v.model}\``;
  const results = variants.map((v) => ({
    qemu_version: v.qemu,
    model: v.model,
    default: v.model === DEFAULT_TCG_CPU_MODEL,
    snapshot: v.build,
    guest_flags: v.guest_flags,
    steps: Object.fromEntries(STEPS.map((s) => [s, summary(v.cpu[s] ?? [], v.wall[s] ?? [])])),
    work_cpu_ms: summary(
      sumPerChild(
        v,
        WORK.map((c) => c.name),
      ),
      [],
    ),
  }));
  const baseline = results.find((r) => r.model === "max") ?? results[0];
  const spawnOf = (r: (typeof results)[number]) => r.steps[SPAWN_STEP] as Summary;
  const rel = (a: number, b: number | undefined) =>
    b ? `${a <= b ? "" : "+"}${r1((a / b - 1) * 100)}%` : "";
  const rows: Row[] = results.map((r) => ({
    metric: `${label({ qemu: r.qemu_version, model: r.model })}${r.default ? " (default)" : ""}`,
    value: `${spawnOf(r).cpu_ms_mean} ± ${spawnOf(r).cpu_ms_ci95} ms`,
    note:
      `${rel(spawnOf(r).cpu_ms_mean, baseline && spawnOf(baseline).cpu_ms_mean)} vs ${baseline ? label({ qemu: baseline.qemu_version, model: baseline.model }) : ""}; ` +
      `exec true ${r.steps["exec true"]?.cpu_ms_mean} ms; python3 -c ${r.steps["exec python3 -c"]?.cpu_ms_mean} ms; ` +
      `work cells ${r.work_cpu_ms.cpu_ms_mean} ± ${r.work_cpu_ms.cpu_ms_ci95} ms (${rel(r.work_cpu_ms.cpu_ms_mean, baseline?.work_cpu_ms.cpu_ms_mean)}); ` +
      `parent boot ${r.snapshot.boot_ms} + warm-up ${r.snapshot.warmup_ms} ms; guest has ${r.guest_flags.join(" ") || "none of avx/avx2/la57/erms/xsave"}`,
  }));
  for (const f of failed) rows.push({ metric: label(f), value: "no snapshot", note: f.error });
  const stepRows: Row[] = results.flatMap((r) =>
    STEPS.map((s) => ({
      metric: `${label({ qemu: r.qemu_version, model: r.model })} ${s}`,
      value: `${r.steps[s]?.cpu_ms_mean} ± ${r.steps[s]?.cpu_ms_ci95} ms`,
      note: `p50 ${r.steps[s]?.cpu_ms_p50} ms; wall p50 ${r.steps[s]?.wall_ms_p50} ms`,
    })),
  );
  const result = {
    host: hostDescription(),
    accelerator: "tcg",
    cpu_model: "per row",
    qemu_version: [...new Set(variants.map((v) => v.qemu))].join(", "),
    load_average_before: loadBefore.map(r1),
    load_average_after: os.loadavg().map(r1),
    rounds: ROUNDS,
    results,
    failed,
    samples: variants.map((v) => ({ qemu_version: v.qemu, model: v.model, cpu_ms: v.cpu, wall_ms: v.wall })),
    measured_at: new Date().toISOString(),
  };
  const head = `tcg, QEMU ${result.qemu_version}, load average ${result.load_average_before.join(" ")} before, ${result.load_average_after.join(" ")} after`;
  printRows(
    `bench/cpu-models on ${result.host} (${head}); host CPU per child, restore + first cell (mean ± 95% CI)`,
    rows,
  );
  await writeResults(
    "cpu-models",
    result,
    `# bench/cpu-models\n\n${result.measured_at} on ${result.host}; ${head}; pyagent (512 MiB), one snapshot per variant built in this run, ` +
      `${ROUNDS} rounds of one child per variant, interleaved (order rotated each round), one child alive at a time; ` +
      `host CPU of the child's QEMU, mean ± 95 % confidence interval\n\n` +
      `${markdownTable(rows)}\n\n## Every step\n\n${markdownTable(stepRows)}`,
  );
} finally {
  setEnv("FORKD_TCG_CPU", saved.cpu);
  setEnv("FORKD_QEMU_BINARY", saved.qemu);
  for (const v of variants) await v.plan?.dispose();
  if (!KEEP) for (const v of variants) await store.delete(v.tag).catch(() => {});
}

async function measureChild(v: Variant, firstRound: boolean): Promise<void> {
  const plan = v.plan as RestorePlan;
  const started = performance.now();
  const sandbox = await Sandbox.restore(paths, plan);
  try {
    let cpu = 0;
    let t = started;
    const mark = async (step: string) => {
      const now = await threadsCpuMs(sandbox.pid);
      v.cpu[step]?.push(now - cpu);
      v.wall[step]?.push(performance.now() - t);
      cpu = now;
      t = performance.now();
    };
    await checkCell(sandbox, FIRST, v.model);
    await mark(SPAWN_STEP);
    if (firstRound) {
      const flags = await sandbox.agent.eval(
        "sorted({'avx','avx2','la57','erms','xsave'} & set(open('/proc/cpuinfo').read().split()))",
        { timeoutMs: 60_000 },
      );
      v.guest_flags = JSON.parse((flags.result ?? "[]").replaceAll("'", '"')) as string[];
      cpu = await threadsCpuMs(sandbox.pid);
      t = performance.now();
    }
    const trueCpu: number[] = [];
    const trueWall: number[] = [];
    for (let i = 0; i < EXEC_TRUE_CALLS; i++) {
      const ran = await sandbox.agent.exec(["true"], { timeoutMs: 60_000 });
      if (ran.exitCode !== 0) throw new Error(`${v.model}: exec true exited ${ran.exitCode}`);
      const now = await threadsCpuMs(sandbox.pid);
      trueCpu.push(now - cpu);
      trueWall.push(performance.now() - t);
      cpu = now;
      t = performance.now();
    }
    v.cpu["exec true"]?.push(mean(trueCpu));
    v.wall["exec true"]?.push(mean(trueWall));
    const py = await sandbox.agent.exec(["python3", "-c", "print(6 * 7)"], { timeoutMs: 60_000 });
    if (py.stdout.toString().trim() !== "42") throw new Error(`${v.model}: python3 -c printed ${py.stdout}`);
    await mark("exec python3 -c");
    for (const cell of WORK) {
      await checkCell(sandbox, cell, v.model);
      await mark(cell.name);
    }
  } finally {
    await sandbox.destroy();
  }
}

async function checkCell(sandbox: Sandbox, cell: Cell, model: string): Promise<void> {
  const out = await sandbox.agent.eval(cell.code, { timeoutMs: 120_000 });
  if (out.result !== cell.expected) {
    throw new Error(
      `${model}: ${cell.name} answered ${JSON.stringify(out.result)} (error ${out.error?.message}), expected ${cell.expected}`,
    );
  }
}

interface Summary {
  cpu_ms_mean: number;
  cpu_ms_ci95: number;
  cpu_ms_p50: number;
  wall_ms_p50: number;
}

function summary(cpu: number[], wall: number[]): Summary {
  const m = mean(cpu);
  const sd = Math.sqrt(cpu.reduce((a, x) => a + (x - m) ** 2, 0) / Math.max(1, cpu.length - 1));
  return {
    cpu_ms_mean: r1(m),
    cpu_ms_ci95: r1((1.96 * sd) / Math.sqrt(Math.max(1, cpu.length))),
    cpu_ms_p50: r1(median(cpu)),
    wall_ms_p50: r1(median(wall)),
  };
}

function sumPerChild(v: Variant, steps: string[]): number[] {
  const n = v.cpu[steps[0] as string]?.length ?? 0;
  return Array.from({ length: n }, (_, i) => steps.reduce((a, s) => a + (v.cpu[s]?.[i] ?? 0), 0));
}

function setEnv(name: string, value: string | undefined): void {
  if (value === undefined) delete process.env[name];
  else process.env[name] = value;
}

function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN;
}

function median(xs: number[]): number {
  if (xs.length === 0) return Number.NaN;
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)] as number;
}

function r1(n: number): number {
  return Math.round(n * 10) / 10;
}
