/**
 * bench/tcg-cache — the TCG translation-cache size (`FORKD_TCG_CACHE_MIB`) against host CPU and memory per
 * child, sizes interleaved round by round in one run so they share the host's load. Each child: restore, the
 * first cell (`numpy.zeros(5).tolist()`), then a second, different cell; CPU of its QEMU after each, cache
 * flushes (`x-query-jit`), and PSS with every child of the run alive.
 *
 *   npm run bench -- tcg-cache   (env: BENCH_N=8 children per size, BENCH_SIZES=8,16,24,32,48, BENCH_TAG)
 */
import os from "node:os";
import { resolvePaths } from "../src/common/paths.js";
import { prepareRestore } from "../src/controller/machines/restore-plan.js";
import { Sandbox } from "../src/controller/machines/sandbox-vm.js";
import { queryJit } from "../src/vmm/incoming.js";
import { envNumber } from "./lib/env.js";
import { threadsCpuMs } from "./lib/phases.js";
import { hostDescription, markdownTable, printRows, pssKiB, type Row, writeResults } from "./lib/report.js";

const N = envNumber("BENCH_N", 8);
const SIZES = (process.env.BENCH_SIZES ?? "8,16,24,32,48").split(",").map(Number);
const TAG = process.env.BENCH_TAG ?? "pyagent";
const FIRST = "numpy.zeros(5).tolist()";
const SECOND = "sorted({str(i): i * i for i in range(50)}.items())[:2]";

const paths = resolvePaths();
const loadBefore = os.loadavg();
const plan = await prepareRestore(paths, TAG);
const live = new Map<number, Sandbox[]>(SIZES.map((s) => [s, []]));
const samples = new Map(
  SIZES.map((s) => [s, { first: [] as number[], second: [] as number[], flushes: [] as number[] }]),
);
const previous = process.env.FORKD_TCG_CACHE_MIB;
try {
  for (let round = 0; round < N; round++) {
    for (const size of SIZES) {
      process.env.FORKD_TCG_CACHE_MIB = String(size);
      const sandbox = await Sandbox.restore(paths, plan);
      live.get(size)?.push(sandbox);
      const first = await sandbox.agent.eval(FIRST, { timeoutMs: 60_000 });
      if (first.error) throw new Error(`first cell failed: ${first.error.message}`);
      const afterFirst = await threadsCpuMs(sandbox.pid);
      const second = await sandbox.agent.eval(SECOND, { timeoutMs: 60_000 });
      if (second.error) throw new Error(`second cell failed: ${second.error.message}`);
      const afterSecond = await threadsCpuMs(sandbox.pid);
      const jit = await queryJit(await sandbox.qmp());
      const s = samples.get(size);
      s?.first.push(afterFirst);
      s?.second.push(afterSecond - afterFirst);
      s?.flushes.push(jit?.flushes ?? Number.NaN);
    }
  }
  const results = [];
  for (const size of SIZES) {
    const pss = await Promise.all((live.get(size) ?? []).map((c) => pssKiB(c.pid)));
    const s = samples.get(size) as { first: number[]; second: number[]; flushes: number[] };
    results.push({
      tcg_cache_mib: size,
      cpu_ms_to_first_answer: round1(mean(s.first)),
      cpu_ms_second_cell: round1(mean(s.second)),
      tb_flushes_per_child: round1(mean(s.flushes)),
      pss_mib_per_child: round1(mean(pss) / 1024),
    });
  }
  const result = {
    host: hostDescription(),
    accelerator: plan.snapshot.manifest.machine.accel,
    load_average_before: loadBefore.map(round1),
    load_average_after: os.loadavg().map(round1),
    n_per_size: N,
    results,
    measured_at: new Date().toISOString(),
  };
  const rows: Row[] = results.map((r) => ({
    metric: `${r.tcg_cache_mib} MiB cache`,
    value: `${r.cpu_ms_to_first_answer} ms`,
    note: `second cell +${r.cpu_ms_second_cell} ms; ${r.tb_flushes_per_child} flushes per child; PSS ${r.pss_mib_per_child} MiB`,
  }));
  const conditions = `${result.accelerator}, load average ${result.load_average_before.join(" ")} before, ${result.load_average_after.join(" ")} after`;
  printRows(`bench/tcg-cache on ${result.host} (${conditions}); host CPU per child to first answer`, rows);
  await writeResults(
    "tcg-cache",
    result,
    `# bench/tcg-cache\n\n${result.measured_at} on ${result.host}; ${conditions}; ${N} children per size, interleaved\n\n${markdownTable(rows)}`,
  );
} finally {
  if (previous === undefined) delete process.env.FORKD_TCG_CACHE_MIB;
  else process.env.FORKD_TCG_CACHE_MIB = previous;
  await Promise.all([...live.values()].flat().map((c) => c.destroy()));
  await plan.dispose();
}

function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN;
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
