/**
 * bench/confinement: what confining QEMU costs at spawn, side by side in one run. N children of one snapshot
 * with confinement on (the launcher's mount namespace, uid change and capability drop, seccomp, the sandbox's
 * cgroups created and limited first) vs off (QEMU as root, unconfined), in alternating rounds over the same
 * home: wall clock of the spawn, and host CPU per child (the QEMUs until ready, plus this process and the
 * tools it waited for). The load average is recorded beside each round: the build machine is shared.
 *
 *   npm run bench -- confinement   (env: BENCH_N=20, BENCH_ROUNDS=4; one unmeasured warm-up spawn first)
 */
import { execFileSync } from "node:child_process";
import os from "node:os";
import { procStatFields } from "../src/controller/host-processes.js";
import { openServices } from "../src/controller/sandbox-manager.js";
import type { ConfinementMode } from "../src/isolation/confinement.js";
import { tempHome } from "../test/support/host.js";
import { linkSharedSnapshot } from "../test/support/snapshots.js";
import { cpuMs, hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const N = Number(process.env.BENCH_N ?? 20);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4);

let clockTicks: number | undefined;
const home = await tempHome("forkd-bench-confine-");
try {
  const tag = await linkSharedSnapshot(home.home, "pyagent");
  // A warm-up spawn, not measured: the first one reads the snapshot's files into the page cache.
  const warmUp = await openServices(home, { confinement: "on" });
  try {
    await measureSpawn(warmUp, tag);
  } finally {
    await warmUp.close({ killSandboxes: true });
  }
  const runs: { mode: ConfinementMode; wallMs: number; cpuPerChildMs: number; load1: number }[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    for (const mode of (round % 2 === 0 ? ["off", "on"] : ["on", "off"]) as ConfinementMode[]) {
      const load1 = os.loadavg()[0] as number;
      const services = await openServices(home, { confinement: mode });
      try {
        runs.push({ mode, load1, ...(await measureSpawn(services, tag)) });
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

/** Spawns N from `tag`; wall clock of the spawn and host CPU per child (QEMUs + this process + its tools). */
async function measureSpawn(
  services: Awaited<ReturnType<typeof openServices>>,
  tag: string,
): Promise<{ wallMs: number; cpuPerChildMs: number }> {
  const selfBefore = await ownCpuMs();
  const started = performance.now();
  const children = await services.sandboxes.spawn({ snapshotTag: tag, n: N, timeoutMs: 0 });
  const wallMs = performance.now() - started;
  const selfAfter = await ownCpuMs();
  const qemuMs = (await Promise.all(children.map((c) => cpuMs(c.pid as number)))).reduce((a, b) => a + b, 0);
  return { wallMs, cpuPerChildMs: (qemuMs + selfAfter - selfBefore) / N };
}

/** This process's CPU plus that of its children it has waited for (ip, nft, the launcher running nft). */
async function ownCpuMs(): Promise<number> {
  const fields = (await procStatFields(process.pid)) as string[];
  const ticks = Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
  clockTicks ??= Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
  return (ticks * 1000) / clockTicks;
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
