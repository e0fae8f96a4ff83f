/**
 * bench/pause — pause and resume a busy sandbox. A 512 MiB pyagent sandbox holds a 100 MiB numpy workload; each
 * of BENCH_ROUNDS cycles rewrites every page of it, pauses the sandbox, then resumes it and waits for the
 * interpreter's first answer. Reported: pause p50/p90 (the call, the engine's CPU in it, and the guest-stopped
 * part), resume to first answer p50/p90, the paused sandbox's own layers on disk against the pages it dirtied
 * (read once the pause's background work is over), host RAM given back (QEMU's resident set and MemAvailable),
 * and the resume time and disk use of the first and last cycles (they must not grow). The machine's load average
 * is recorded with the numbers: other work shares its CPUs.
 *
 * With BENCH_BASELINE_ROOT (a built checkout, e.g. of main) the same cycles run side by side, interleaved round by
 * round, on that checkout's engine (its own module graph, its own home BENCH_BASELINE_HOME, default
 * <FORKD_HOME>/../pause-baseline, given a copy of this home's snapshot): each table cell then shows this
 * checkout's figure and the baseline's in parentheses.
 *
 *   npm run bench -- pause        (env: BENCH_ROUNDS=20, BENCH_DIRTY_MIB=100, BENCH_TAG=pyagent,
 *                                  BENCH_BASELINE_ROOT, BENCH_BASELINE_HOME)
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { sleep } from "../src/common/deadline.js";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import type { openServices } from "../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { envNumber } from "./lib/env.js";
import {
  hostDescription,
  markdownTable,
  memAvailableKiB,
  printRows,
  type Row,
  writeResults,
} from "./lib/report.js";

const ROUNDS = envNumber("BENCH_ROUNDS", 20);
const DIRTY_MIB = envNumber("BENCH_DIRTY_MIB", 100);
const TAG = process.env.BENCH_TAG ?? "pyagent";
const MIB = 2 ** 20;

/** Bytes allocated on disk under `dir`, each inode once (a layer's overlay is hard-linked, never copied). */
async function diskBytes(dir: string, seen = new Set<number>()): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const file = path.join(dir, entry.name);
    if (entry.isDirectory()) total += await diskBytes(file, seen);
    else if (entry.isFile()) {
      const s = await stat(file);
      if (seen.has(s.ino)) continue;
      seen.add(s.ino);
      total += s.blocks * 512;
    }
  }
  return total;
}

/** The paused sandbox's own layers (pause-<id>-...): what pausing it keeps on disk. */
async function ownLayersBytes(snapshotsDir: string, id: string): Promise<{ layers: number; bytes: number }> {
  const names = (await readdir(snapshotsDir)).filter((n) => n.startsWith(`pause-${id}-`));
  const seen = new Set<number>();
  let bytes = 0;
  for (const name of names) bytes += await diskBytes(path.join(snapshotsDir, name), seen);
  return { layers: names.length, bytes };
}

interface Cycle {
  round: number;
  load1: number;
  pause_call_ms: number;
  /** CPU of this process (the engine, in-process) during the pause call: load-independent. */
  pause_call_cpu_ms: number;
  guest_stopped_ms: number;
  write_ms: number;
  bytes_captured: number;
  bytes_stored: number;
  merged: boolean;
  layers: number;
  disk_bytes: number;
  freed_rss_bytes: number;
  mem_available_gain_bytes: number;
  resume_call_ms: number;
  resume_to_answer_ms: number;
}

/** What drives one side: a checkout's engine (its own module graph) over its own FORKD_HOME and sandbox. */
interface Side {
  name: string;
  label: string;
  root: string;
  paths: ReturnType<typeof resolvePaths>;
  services: Awaited<ReturnType<typeof openServices>>;
  id: string;
  cycles: Cycle[];
}

const here = path.dirname(fileURLToPath(import.meta.url));
const thisRoot = path.resolve(here, "../..");
const baselineRoot = process.env.BENCH_BASELINE_ROOT;
const thisPaths = resolvePaths();

/** Opens `root`'s engine on `home` (a snapshot TAG copied from this checkout's home when it has none). */
async function openSide(name: string, label: string, root: string, home: string): Promise<Side> {
  const paths = resolvePaths({ ...process.env, FORKD_HOME: home });
  if (home !== thisPaths.home && !existsSync(path.join(paths.snapshots, TAG))) {
    mkdirSync(paths.snapshots, { recursive: true });
    execFileSync("cp", ["-a", "--", path.join(thisPaths.snapshots, TAG), paths.snapshots]);
  }
  const engine = (await import(
    pathToFileURL(path.join(root, "dist/src/controller/sandboxes/manager.js")).href
  )) as { openServices: typeof openServices };
  const services = await engine.openServices(paths);
  return { name, label, root, paths, services, id: "", cycles: [] };
}

async function startWorkload(side: Side): Promise<void> {
  const [spawned] = await side.services.sandboxes.spawn({ snapshotTag: TAG, n: 1, timeoutMs: 0 });
  side.id = (spawned as { id: string }).id;
  const held = await side.services.sandboxes.eval(
    side.id,
    `import numpy\nWORK = numpy.ones(${DIRTY_MIB} * 2**20 // 8)\nint(WORK.nbytes // 2**20)`,
    { timeoutMs: 600_000 },
  );
  console.log(`${side.name}: sandbox ${side.id}: workload holds ${held.result} MiB`);
}

/** One pause/resume cycle of `side`; the previous cycle's disk use is read first (its merged layers are gone). */
async function cycle(side: Side, round: number): Promise<void> {
  const { services, id } = side;
  const previous = side.cycles.at(-1);
  if (previous) Object.assign(previous, await diskOf(side));
  // Every page of the workload is written again, so each pause has DIRTY_MIB of new pages to keep.
  await services.sandboxes.eval(id, `WORK += 1\nROUND = ${round}`, { timeoutMs: 600_000 });
  const availableBefore = await memAvailableKiB();
  const cpuBefore = process.cpuUsage();
  const pauseStarted = performance.now();
  const paused = await services.sandboxes.pause(id);
  const pauseCallMs = performance.now() - pauseStarted;
  const cpu = process.cpuUsage(cpuBefore);
  const availableAfter = await memAvailableKiB();

  const resumeStarted = performance.now();
  await services.sandboxes.resume(id);
  const resumeCallMs = performance.now() - resumeStarted;
  const answer = await services.sandboxes.eval(id, "ROUND, float(WORK[0])", { timeoutMs: 120_000 });
  const resumeToAnswerMs = performance.now() - resumeStarted;
  if (answer.result !== `(${round}, ${round + 2}.0)`) {
    throw new Error(`${side.name} round ${round}: the resumed sandbox answered ${answer.result}`);
  }
  const c: Cycle = {
    round,
    load1: os.loadavg()[0] as number,
    pause_call_ms: pauseCallMs,
    pause_call_cpu_ms: (cpu.user + cpu.system) / 1000,
    guest_stopped_ms: paused.pause_ms,
    write_ms: paused.write_ms,
    bytes_captured: paused.bytes_captured,
    bytes_stored: paused.bytes_stored,
    merged: paused.merged,
    layers: 0,
    disk_bytes: 0,
    freed_rss_bytes: paused.freed_bytes,
    mem_available_gain_bytes: (availableAfter - availableBefore) * 1024,
    resume_call_ms: resumeCallMs,
    resume_to_answer_ms: resumeToAnswerMs,
  };
  side.cycles.push(c);
  console.log(
    `${side.name} round ${round}: pause ${pauseCallMs.toFixed(0)} ms (cpu ${c.pause_call_cpu_ms.toFixed(0)}, guest ` +
      `stopped ${paused.pause_ms.toFixed(0)}), resume to answer ${resumeToAnswerMs.toFixed(0)} ms, captured ` +
      `${(paused.bytes_captured / MIB).toFixed(1)} MiB${paused.merged ? " (merged)" : ""}, load ${c.load1.toFixed(1)}`,
  );
}

async function diskOf(side: Side): Promise<{ layers: number; disk_bytes: number }> {
  const disk = await ownLayersBytes(side.paths.snapshots, side.id);
  return { layers: disk.layers, disk_bytes: disk.bytes };
}

const loadAtStart = os.loadavg();
const sides: Side[] = [];
try {
  if (baselineRoot) {
    const home = process.env.BENCH_BASELINE_HOME ?? path.join(path.dirname(thisPaths.home), "pause-baseline");
    sides.push(await openSide("baseline", `baseline (${path.resolve(baselineRoot)})`, baselineRoot, home));
  }
  sides.push(await openSide("this", "this checkout", thisRoot, thisPaths.home));
  const first = sides[sides.length - 1] as Side;
  if (!(await first.services.snapshots.list()).some((s) => s.tag === TAG && s.bootable)) {
    console.log(`creating snapshot ${TAG} from the pyagent template (one-time)...`);
    await createSnapshot(thisPaths, { tag: TAG, template: "pyagent" });
  }
  const memoryMiB = (await first.services.snapshots.get(TAG)).memory_mib;
  for (const side of sides) await startWorkload(side);
  // Interleaved: each round pauses and resumes every side once, so load changes hit both alike.
  for (let round = 0; round < ROUNDS; round++) {
    for (const side of sides) await cycle(side, round);
  }
  for (const side of sides) {
    await sleep(2000);
    Object.assign(side.cycles.at(-1) as Cycle, await diskOf(side));
    await side.services.sandboxes.kill(side.id);
  }

  const measuredAt = new Date().toISOString();
  const accelerator = (await first.services.snapshots.get(TAG)).accelerator;
  const summaries = sides.map((side) => ({ side, ...summarize(side.cycles) }));
  const current = summaries[summaries.length - 1] as (typeof summaries)[number];
  const baseline = summaries.length > 1 ? summaries[0] : undefined;
  const rows: Row[] = current.rows.map((row, i) => {
    const before = baseline?.rows[i];
    return before ? { ...row, value: `${row.value} (baseline ${before.value})` } : row;
  });
  rows.push({
    metric: "load average (1 min) start / end",
    value: `${loadAtStart[0]?.toFixed(1)} / ${os.loadavg()[0]?.toFixed(1)}`,
    note: `${os.cpus().length} CPUs shared with other work`,
  });
  const json = {
    host: hostDescription(),
    accelerator,
    measured_at: measuredAt,
    memory_mib: memoryMiB,
    dirty_mib: DIRTY_MIB,
    rounds: ROUNDS,
    load_average: { start: loadAtStart, end: os.loadavg() },
    sides: summaries.map(({ side, stats }) => ({
      name: side.name,
      label: side.label,
      ...stats,
      cycles: side.cycles,
    })),
  };
  const title = baseline
    ? `this checkout, side by side with ${baseline.side.label} (values in parentheses), cycles interleaved`
    : "this checkout";
  printRows(`bench/pause on ${hostDescription()} (${memoryMiB} MiB sandbox, ${DIRTY_MIB} MiB dirtied)`, rows);
  await writeResults(
    "pause",
    json,
    `# bench/pause\n\n${measuredAt} on ${json.host}; ${accelerator}; ${memoryMiB} MiB sandbox, ${DIRTY_MIB} MiB ` +
      `rewritten before each of ${ROUNDS} cycles; ${title}\n\n${markdownTable(rows)}`,
  );
} finally {
  for (const side of sides) {
    await side.services.sandboxes.killAll();
    await side.services.close();
  }
}

/** One side's table rows and headline figures. */
function summarize(cycles: Cycle[]) {
  const p = (values: number[], q: number) => Math.round(percentile(values, q));
  const of = (f: (c: Cycle) => number) => cycles.map(f);
  const p50p90 = (f: (c: Cycle) => number) => ({ p50: p(of(f), 50), p90: p(of(f), 90) });
  const mib = (bytes: number) => `${(bytes / MIB).toFixed(1)} MiB`;
  const quarter = Math.max(1, Math.floor(cycles.length / 4));
  const firstCycles = cycles.slice(0, quarter);
  const lastCycles = cycles.slice(-quarter);
  const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
  // The layer on disk should be within 10% of the pages the sandbox dirtied.
  const diskRatio = of((c) => c.disk_bytes / c.bytes_captured);
  const stats = {
    pause_call_ms: p50p90((c) => c.pause_call_ms),
    pause_call_cpu_ms: p50p90((c) => c.pause_call_cpu_ms),
    guest_stopped_ms: p50p90((c) => c.guest_stopped_ms),
    resume_call_ms: p50p90((c) => c.resume_call_ms),
    resume_to_answer_ms: p50p90((c) => c.resume_to_answer_ms),
    disk_over_dirtied_p50: percentile(diskRatio, 50),
  };
  const pair = (x: { p50: number; p90: number }) => `${x.p50} / ${x.p90} ms`;
  const rows: Row[] = [
    { metric: "pause (call) p50 / p90", value: pair(stats.pause_call_ms), target: "p50 < 500 ms" },
    {
      metric: "engine CPU in the pause call p50 / p90",
      value: pair(stats.pause_call_cpu_ms),
      note: "this process's CPU (in-process engine; QEMU and tools not included)",
    },
    { metric: "guest stopped p50 / p90", value: pair(stats.guest_stopped_ms) },
    { metric: "resume (call) p50 / p90", value: pair(stats.resume_call_ms) },
    {
      metric: "resume to first answer p50 / p90",
      value: pair(stats.resume_to_answer_ms),
      target: "p50 < 500 ms",
    },
    {
      metric: "pages dirtied per cycle p50",
      value: mib(
        p(
          of((c) => c.bytes_captured),
          50,
        ),
      ),
      note: `workload ${DIRTY_MIB} MiB rewritten each cycle`,
    },
    {
      metric: "own layers on disk per paused sandbox p50 / max",
      value: `${mib(
        p(
          of((c) => c.disk_bytes),
          50,
        ),
      )} / ${mib(Math.max(...of((c) => c.disk_bytes)))}`,
      note: `layers at most ${Math.max(...of((c) => c.layers))}; merges ${cycles.filter((c) => c.merged).length}`,
    },
    {
      metric: "disk / pages dirtied p50",
      value: (Math.round(stats.disk_over_dirtied_p50 * 100) / 100).toFixed(2),
      target: "<= 1.10",
    },
    {
      metric: `resume to answer, first ${firstCycles.length} vs last ${lastCycles.length} cycles (mean)`,
      value: `${mean(firstCycles.map((c) => c.resume_to_answer_ms)).toFixed(0)} vs ${mean(lastCycles.map((c) => c.resume_to_answer_ms)).toFixed(0)} ms`,
      note: "must not grow",
    },
    {
      metric: `disk, first ${firstCycles.length} vs last ${lastCycles.length} cycles (mean)`,
      value: `${mib(mean(firstCycles.map((c) => c.disk_bytes)))} vs ${mib(mean(lastCycles.map((c) => c.disk_bytes)))}`,
      note: "must not grow",
    },
    {
      metric: "host RAM freed by a pause p50 (QEMU RSS / MemAvailable gain)",
      value: `${mib(
        p(
          of((c) => c.freed_rss_bytes),
          50,
        ),
      )} / ${mib(
        p(
          of((c) => c.mem_available_gain_bytes),
          50,
        ),
      )}`,
      note: "MemAvailable is host-wide: other helpers' VMs move it too",
    },
    {
      metric: "load average (1 min) during p50",
      value: (
        percentile(
          of((c) => c.load1),
          50,
        ) as number
      ).toFixed(1),
    },
  ];
  return { rows, stats };
}
