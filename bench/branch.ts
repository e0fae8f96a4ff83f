/**
 * bench/branch — BRANCH a busy source. A 1.5 GiB pyagent source (numpy warm) runs a workload that has dirtied
 * about 200 MiB; for each mode (full, diff, live) 10 BRANCHes, interleaved by round, each after the workload
 * rewrote its pages. Reported per mode: source pause p50/p90/max, round trip to "ready", bytes written (on
 * disk), spawn latency of a child from the result.
 *
 *   npm run bench -- branch        (env: BENCH_ROUNDS=10, BENCH_DIRTY_MIB=200, BENCH_MEMORY_MIB=1536)
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { openServices } from "../src/controller/sandboxes/manager.js";
import type { BranchMode } from "../src/controller/snapshots/branch.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const ROUNDS = envNumber("BENCH_ROUNDS", 10);
const DIRTY_MIB = envNumber("BENCH_DIRTY_MIB", 200);
const MEMORY_MIB = envNumber("BENCH_MEMORY_MIB", 1536);
const MODES: BranchMode[] = ["full", "diff", "live"];
const TAG = `bench-branch-${MEMORY_MIB}`;

const paths = resolvePaths();
const services = await openServices(paths, { limits: { maxConcurrentSpawns: 8 } });
const made: string[] = [];
const templateDir = await mkdtemp(path.join(os.tmpdir(), "forkd-bench-branch-"));
try {
  if (!(await services.snapshots.list()).some((s) => s.tag === TAG && s.bootable)) {
    // pyagent with a larger RAM: the template format takes a file path.
    const template = path.join(templateDir, `${TAG}.toml`);
    await writeFile(
      template,
      `name = "${TAG}"\ndescription = "pyagent with ${MEMORY_MIB} MiB (bench/branch)"\n` +
        `packages = ["python3", "python3-numpy"]\nmemory_mib = ${MEMORY_MIB}\nvcpus = 1\ndisk_mib = 2048\n` +
        `interpreter = "python"\nwarmup = "import numpy"\n`,
    );
    console.log(`creating snapshot ${TAG} (one-time; builds its image if needed)...`);
    await createSnapshot(paths, { tag: TAG, template });
  }

  const sources = new Map<BranchMode, string>();
  for (const mode of MODES) {
    const [source] = await services.sandboxes.spawn({
      snapshotTag: TAG,
      n: 1,
      timeoutMs: 0,
      liveFork: mode === "live",
    });
    const id = (source as { id: string }).id;
    sources.set(mode, id);
    const dirtied = await services.sandboxes.eval(
      id,
      `import numpy\nWORK = numpy.ones(${DIRTY_MIB} * 2**20 // 8)\nint(WORK.nbytes // 2**20)`,
      { timeoutMs: 600_000 },
    );
    console.log(`${mode} source ${id}: workload holds ${dirtied.result} MiB`);
  }

  const samples = new Map<
    BranchMode,
    { pause: number[]; roundTrip: number[]; bytes: number[]; spawn: number[] }
  >();
  for (const mode of MODES) samples.set(mode, { pause: [], roundTrip: [], bytes: [], spawn: [] });
  for (let round = 0; round < ROUNDS; round++) {
    for (const mode of MODES) {
      const id = sources.get(mode) as string;
      // The workload keeps working: every page of it is written again before each BRANCH.
      await services.sandboxes.eval(id, `WORK += 1\nROUND = ${round}`, { timeoutMs: 600_000 });
      const started = performance.now();
      const branch = await services.sandboxes.branch(id, { mode, tag: `${TAG}-${mode}-${round}` });
      const roundTrip = performance.now() - started;
      made.push(branch.tag);
      const spawnStarted = performance.now();
      const [child] = await services.sandboxes.spawn({ snapshotTag: branch.tag, n: 1 });
      const spawnMs = performance.now() - spawnStarted;
      const childId = (child as { id: string }).id;
      const check = await services.sandboxes.eval(childId, "ROUND, float(WORK[0])", { timeoutMs: 120_000 });
      if (check.result !== `(${round}, ${round + 2}.0)`)
        throw new Error(`${mode} round ${round}: child saw ${check.result}`);
      await services.sandboxes.kill(childId);
      const s = samples.get(mode) as {
        pause: number[];
        roundTrip: number[];
        bytes: number[];
        spawn: number[];
      };
      s.pause.push(branch.pause_ms);
      s.roundTrip.push(roundTrip);
      s.bytes.push(branch.bytes_written);
      s.spawn.push(spawnMs);
      console.log(
        `round ${round} ${mode}: pause ${branch.pause_ms} ms, round trip ${roundTrip.toFixed(0)} ms, ` +
          `${(branch.bytes_written / 2 ** 20).toFixed(0)} MiB written, child spawn ${spawnMs.toFixed(0)} ms`,
      );
    }
  }

  const rows: Row[] = [];
  const json: Record<string, unknown> = {
    host: hostDescription(),
    memory_mib: MEMORY_MIB,
    dirty_mib: DIRTY_MIB,
    rounds: ROUNDS,
  };
  for (const mode of MODES) {
    const s = samples.get(mode) as { pause: number[]; roundTrip: number[]; bytes: number[]; spawn: number[] };
    const p = (v: number[], q: number) => Math.round(percentile(v, q) * 10) / 10;
    const target = mode === "live" ? "p50 < 10, p90 < 20" : mode === "diff" ? "p50 < 50" : "";
    rows.push({
      metric: `${mode}: pause p50 / p90 / max`,
      value: `${p(s.pause, 50)} / ${p(s.pause, 90)} / ${Math.max(...s.pause).toFixed(1)} ms`,
      target: target ? `${target} ms` : undefined,
    });
    rows.push({ metric: `${mode}: round trip to ready p50`, value: `${p(s.roundTrip, 50).toFixed(0)} ms` });
    rows.push({
      metric: `${mode}: bytes written p50`,
      value: `${(p(s.bytes, 50) / 2 ** 20).toFixed(1)} MiB`,
      target: mode === "diff" ? `<= ${DIRTY_MIB} MiB dirtied + device state` : undefined,
    });
    rows.push({
      metric: `${mode}: child spawn from the result p50`,
      value: `${p(s.spawn, 50).toFixed(0)} ms`,
    });
    json[mode] = {
      pause_ms: { p50: p(s.pause, 50), p90: p(s.pause, 90), max: Math.max(...s.pause) },
      round_trip_ms_p50: p(s.roundTrip, 50),
      bytes_written_p50: p(s.bytes, 50),
      spawn_ms_p50: p(s.spawn, 50),
      samples: s,
    };
  }
  json.accelerator = (await services.snapshots.get(TAG)).accelerator;
  json.measured_at = new Date().toISOString();
  printRows(
    `bench/branch on ${hostDescription()} (${MEMORY_MIB} MiB source, ${DIRTY_MIB} MiB dirtied)`,
    rows,
  );
  await writeResults(
    "branch",
    json,
    `# bench/branch\n\n${json.measured_at} on ${json.host}; ${json.accelerator}\n\n${markdownTable(rows)}`,
  );
} finally {
  await services.sandboxes.killAll();
  for (const tag of made.reverse()) await services.snapshots.delete(tag).catch(() => {});
  await services.close();
  await rm(templateDir, { recursive: true, force: true });
}
