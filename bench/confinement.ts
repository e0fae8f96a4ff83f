/**
 * bench/confinement: what confining QEMU costs at spawn, side by side in one run. N children of one snapshot
 * with confinement on (the launcher's mount namespace, uid change and capability drop, seccomp, the sandbox's
 * cgroups created and limited first) vs off (QEMU as root, unconfined), in alternating rounds over the same
 * home: wall clock of the spawn, and host CPU per child (the QEMUs until ready, plus this process and the
 * tools it waited for). The load average is recorded beside each round: the build machine is shared.
 *
 *   npm run bench -- confinement   (env: BENCH_N=20, BENCH_ROUNDS=4; one unmeasured warm-up spawn first)
 */
import os from "node:os";
import { openServices } from "../src/controller/sandboxes/manager.js";
import type { ConfinementMode } from "../src/isolation/confinement.js";
import { tempHome } from "../test/support/host.js";
import { linkSharedSnapshot } from "../test/support/snapshots.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";
import { measureSpawn } from "./lib/spawn-cost.js";

const N = envNumber("BENCH_N", 20);
const ROUNDS = envNumber("BENCH_ROUNDS", 4);

const home = await tempHome("forkd-bench-confine-");
try {
  const tag = await linkSharedSnapshot(home.home, "pyagent");
  // A warm-up spawn, not measured: the first one reads the snapshot's files into the page cache.
  const warmUp = await openServices(home, { confinement: "on" });
  try {
    await measureSpawn(warmUp, tag, N);
  } finally {
    await warmUp.close({ killSandboxes: true });
  }
  const runs: { mode: ConfinementMode; wallMs: number; cpuPerChildMs: number; load1: number }[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    for (const mode of (round % 2 === 0 ? ["off", "on"] : ["on", "off"]) as ConfinementMode[]) {
      const load1 = os.loadavg()[0] as number;
      const services = await openServices(home, { confinement: mode });
      try {
        runs.push({ mode, load1, ...(await measureSpawn(services, tag, N)) });
        console.log(`round ${round + 1} ${mode}: ${JSON.stringify(runs.at(-1))}`);
      } finally {
        await services.close({ killSandboxes: true });
      }
    }
  }
  const mean = (mode: ConfinementMode, key: "wallMs" | "cpuPerChildMs") => {
    const of = runs.filter((r) => r.mode === mode);
    return of.reduce((s, r) => s + r[key], 0) / of.length;
  };
  const pct = (on: number, off: number) => round1((on / off - 1) * 100);
  const result = {
    host: hostDescription(),
    n: N,
    rounds: ROUNDS,
    runs: runs.map((r) => ({ ...r, wallMs: Math.round(r.wallMs), cpuPerChildMs: round1(r.cpuPerChildMs) })),
    confined: {
      wall_ms: Math.round(mean("on", "wallMs")),
      cpu_ms_per_child: round1(mean("on", "cpuPerChildMs")),
    },
    unconfined: {
      wall_ms: Math.round(mean("off", "wallMs")),
      cpu_ms_per_child: round1(mean("off", "cpuPerChildMs")),
    },
    wall_overhead_pct: pct(mean("on", "wallMs"), mean("off", "wallMs")),
    cpu_overhead_pct: pct(mean("on", "cpuPerChildMs"), mean("off", "cpuPerChildMs")),
    load_average_1m: runs.map((r) => round1(r.load1)),
    measured_at: new Date().toISOString(),
  };
  const rows: Row[] = [
    {
      metric: `spawn N=${N}, wall: unconfined / confined`,
      value: `${result.unconfined.wall_ms} / ${result.confined.wall_ms} ms`,
      note: `${result.wall_overhead_pct >= 0 ? "+" : ""}${result.wall_overhead_pct}%`,
    },
    {
      metric: "host CPU per child: unconfined / confined",
      value: `${result.unconfined.cpu_ms_per_child} / ${result.confined.cpu_ms_per_child} ms`,
      note: `${result.cpu_overhead_pct >= 0 ? "+" : ""}${result.cpu_overhead_pct}%`,
    },
    { metric: "1-minute load average at each round's start", value: result.load_average_1m.join(", ") },
  ];
  printRows(`bench/confinement on ${result.host}`, rows);
  await writeResults(
    "confinement",
    result,
    `# bench/confinement\n\n${result.measured_at} on ${result.host} (TCG, shared and loaded: see the load averages); guest 512 MiB pyagent; ${ROUNDS} alternating rounds of N=${N} per side\n\n${markdownTable(rows)}\n\nRounds: ${result.runs.map((r) => `${r.mode} ${r.wallMs} ms wall, ${r.cpuPerChildMs} ms CPU/child (load ${round1(r.load1)})`).join("; ")}`,
  );
} finally {
  await home.cleanup();
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
