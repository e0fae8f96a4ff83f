/**
 * bench/pause — pause and resume a busy sandbox. A 512 MiB pyagent sandbox holds a 100 MiB numpy workload; each
 * of BENCH_ROUNDS cycles rewrites every page of it, pauses the sandbox, then resumes it and waits for the
 * interpreter's first answer. Reported: pause p50/p90 (the call, and the guest-stopped part), resume to first
 * answer p50/p90, the paused sandbox's own layers on disk against the pages it dirtied, host RAM given back
 * (QEMU's resident set and MemAvailable), and the resume time and disk use of the first and last cycles (they
 * must not grow). The machine's load average is recorded with the numbers: other work shares its CPUs.
 *
 *   npm run bench -- pause        (env: BENCH_ROUNDS=20, BENCH_DIRTY_MIB=100, BENCH_TAG=pyagent)
 */
import { readdir, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { openServices } from "../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import {
  hostDescription,
  markdownTable,
  memAvailableKiB,
  printRows,
  type Row,
  writeResults,
} from "./lib/report.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 20);
const DIRTY_MIB = Number(process.env.BENCH_DIRTY_MIB ?? 100);
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

const paths = resolvePaths();
const services = await openServices(paths);
const loadAtStart = os.loadavg();
try {
  if (!(await services.snapshots.list()).some((s) => s.tag === TAG && s.bootable)) {
    console.log(`creating snapshot ${TAG} from the pyagent template (one-time)...`);
    await createSnapshot(paths, { tag: TAG, template: "pyagent" });
  }
  const memoryMiB = (await services.snapshots.get(TAG)).memory_mib;
  const [spawned] = await services.sandboxes.spawn({ snapshotTag: TAG, n: 1, timeoutMs: 0 });
  const id = (spawned as { id: string }).id;
  const held = await services.sandboxes.eval(
    id,
    `import numpy\nWORK = numpy.ones(${DIRTY_MIB} * 2**20 // 8)\nint(WORK.nbytes // 2**20)`,
    { timeoutMs: 600_000 },
  );
  console.log(`sandbox ${id} (${memoryMiB} MiB): workload holds ${held.result} MiB`);

  const cycles: Cycle[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    // Every page of the workload is written again, so each pause has DIRTY_MIB of new pages to keep.
    await services.sandboxes.eval(id, `WORK += 1\nROUND = ${round}`, { timeoutMs: 600_000 });
    const availableBefore = await memAvailableKiB();
    const pauseStarted = performance.now();
    const paused = await services.sandboxes.pause(id);
    const pauseCallMs = performance.now() - pauseStarted;
    const availableAfter = await memAvailableKiB();
    const disk = await ownLayersBytes(paths.snapshots, id);

    const resumeStarted = performance.now();
    await services.sandboxes.resume(id);
    const resumeCallMs = performance.now() - resumeStarted;
    const answer = await services.sandboxes.eval(id, "ROUND, float(WORK[0])", { timeoutMs: 120_000 });
    const resumeToAnswerMs = performance.now() - resumeStarted;
    if (answer.result !== `(${round}, ${round + 2}.0)`) {
      throw new Error(`round ${round}: the resumed sandbox answered ${answer.result}`);
    }
    const cycle: Cycle = {
      round,
      load1: os.loadavg()[0] as number,
      pause_call_ms: pauseCallMs,
      guest_stopped_ms: paused.pause_ms,
      write_ms: paused.write_ms,
      bytes_captured: paused.bytes_captured,
      bytes_stored: paused.bytes_stored,
      merged: paused.merged,
      layers: disk.layers,
      disk_bytes: disk.bytes,
      freed_rss_bytes: paused.freed_bytes,
      mem_available_gain_bytes: (availableAfter - availableBefore) * 1024,
      resume_call_ms: resumeCallMs,
      resume_to_answer_ms: resumeToAnswerMs,
    };
    cycles.push(cycle);
    console.log(
      `round ${round}: pause ${pauseCallMs.toFixed(0)} ms (guest stopped ${paused.pause_ms.toFixed(0)}), ` +
        `resume to answer ${resumeToAnswerMs.toFixed(0)} ms, ${disk.layers} layer(s) ${(disk.bytes / MIB).toFixed(1)} MiB ` +
        `on disk, captured ${(paused.bytes_captured / MIB).toFixed(1)} MiB${paused.merged ? " (merged)" : ""}, ` +
        `freed ${(paused.freed_bytes / MIB).toFixed(0)} MiB, load ${cycle.load1.toFixed(1)}`,
    );
  }
  await services.sandboxes.kill(id);

  const p = (values: number[], q: number) => Math.round(percentile(values, q));
  const of = (f: (c: Cycle) => number) => cycles.map(f);
  const mib = (bytes: number) => `${(bytes / MIB).toFixed(1)} MiB`;
  const firstHalf = cycles.slice(0, Math.max(1, Math.floor(ROUNDS / 4)));
  const lastHalf = cycles.slice(-Math.max(1, Math.floor(ROUNDS / 4)));
  const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
  // What changed since the sandbox's base: the pages it dirtied (captured) plus its disk's writes, bounded below
  // by the workload itself. The layer on disk should be within 10% of what changed.
  const diskRatio = of((c) => c.disk_bytes / c.bytes_captured);
  const rows: Row[] = [
    {
      metric: "pause (call) p50 / p90",
      value: `${p(
        of((c) => c.pause_call_ms),
        50,
      )} / ${p(
        of((c) => c.pause_call_ms),
        90,
      )} ms`,
      target: "p50 < 1000 ms",
    },
    {
      metric: "guest stopped p50 / p90",
      value: `${p(
        of((c) => c.guest_stopped_ms),
        50,
      )} / ${p(
        of((c) => c.guest_stopped_ms),
        90,
      )} ms`,
    },
    {
      metric: "resume to first answer p50 / p90",
      value: `${p(
        of((c) => c.resume_to_answer_ms),
        50,
      )} / ${p(
        of((c) => c.resume_to_answer_ms),
        90,
      )} ms`,
      target: "p50 < 1000 ms",
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
      value: `${(Math.round(percentile(diskRatio, 50) * 100) / 100).toFixed(2)}`,
      target: "<= 1.10",
    },
    {
      metric: `resume to answer, first ${firstHalf.length} vs last ${lastHalf.length} cycles (mean)`,
      value: `${mean(firstHalf.map((c) => c.resume_to_answer_ms)).toFixed(0)} vs ${mean(lastHalf.map((c) => c.resume_to_answer_ms)).toFixed(0)} ms`,
      note: "must not grow",
    },
    {
      metric: `disk, first ${firstHalf.length} vs last ${lastHalf.length} cycles (mean)`,
      value: `${mib(mean(firstHalf.map((c) => c.disk_bytes)))} vs ${mib(mean(lastHalf.map((c) => c.disk_bytes)))}`,
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
      metric: "load average (1 min) start / during p50 / end",
      value: `${loadAtStart[0]?.toFixed(1)} / ${(
        percentile(
          of((c) => c.load1),
          50,
        ) as number
      ).toFixed(1)} / ${os.loadavg()[0]?.toFixed(1)}`,
      note: `${os.cpus().length} CPUs shared with other work`,
    },
  ];
  const measuredAt = new Date().toISOString();
  const accelerator = (await services.snapshots.get(TAG)).accelerator;
  const json = {
    host: hostDescription(),
    accelerator,
    measured_at: measuredAt,
    memory_mib: memoryMiB,
    dirty_mib: DIRTY_MIB,
    rounds: ROUNDS,
    load_average: { start: loadAtStart, end: os.loadavg() },
    pause_call_ms: {
      p50: p(
        of((c) => c.pause_call_ms),
        50,
      ),
      p90: p(
        of((c) => c.pause_call_ms),
        90,
      ),
    },
    guest_stopped_ms: {
      p50: p(
        of((c) => c.guest_stopped_ms),
        50,
      ),
      p90: p(
        of((c) => c.guest_stopped_ms),
        90,
      ),
    },
    resume_to_answer_ms: {
      p50: p(
        of((c) => c.resume_to_answer_ms),
        50,
      ),
      p90: p(
        of((c) => c.resume_to_answer_ms),
        90,
      ),
    },
    disk_over_dirtied_p50: percentile(diskRatio, 50),
    cycles,
  };
  printRows(`bench/pause on ${hostDescription()} (${memoryMiB} MiB sandbox, ${DIRTY_MIB} MiB dirtied)`, rows);
  await writeResults(
    "pause",
    json,
    `# bench/pause\n\n${measuredAt} on ${json.host}; ${accelerator}; ${memoryMiB} MiB sandbox, ${DIRTY_MIB} MiB ` +
      `rewritten before each of ${ROUNDS} cycles\n\n${markdownTable(rows)}`,
  );
} finally {
  await services.sandboxes.killAll();
  await services.close();
}
