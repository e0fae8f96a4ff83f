/**
 * Where a child's host CPU goes, phase by phase, with what TCG's translator did in each (QMP `x-query-jit`).
 * Children run one at a time so a child's CPU is its own. To separate the phases the child is started with
 * `-incoming defer -S` and driven step by step (load, cont, ping, restore, ping, first cell); the unsplit
 * path of a spawn (`-incoming fd:3`, restore, first cell) runs alternately in the same loop, so the sum of
 * the phases can be checked against what a real spawn costs.
 */
import { randomBytes } from "node:crypto";
import { readdir, readFile, rm } from "node:fs/promises";
import path from "node:path";
import { AgentClient } from "../../src/agent/host/client.js";
import type { ForkdPaths } from "../../src/common/paths.js";
import { newSandboxId } from "../../src/controller/machines/ids.js";
import type { RestorePlan } from "../../src/controller/machines/restore-plan.js";
import { launchChild, Sandbox } from "../../src/controller/machines/sandbox-vm.js";
import { type JitStats, queryJit, startIncoming, waitIncomingLoaded } from "../../src/vmm/incoming.js";

export const PHASES = [
  "QEMU start (process, devices, QMP up)",
  "device-state load",
  "guest resume (cont to first ping answered)",
  "restore fix-up (clock, entropy, hostname)",
  "ping (second)",
  "first cell (eval)",
] as const;

export interface PhaseRow {
  phase: string;
  cpu_ms: number;
  wall_ms: number;
  tbs_translated: number;
  code_kib: number;
  /** Whole translation-cache flushes in this phase (after one, the TB and code deltas undercount). */
  tb_flushes: number;
}

export interface PhaseReport {
  n: number;
  rows: PhaseRow[];
  /** Sum of the phases, per child. */
  split_cpu_ms: number;
  /** The unsplit spawn path (restore + first cell), per child, measured alternately in the same loop. */
  spawn_path_cpu_ms: number;
  /** Whole-cache flushes seen in the split children (a flush would make the TB counts undercount). */
  tb_flushes: number;
}

/** CPU time of all of a process's threads in ms (schedstat: nanoseconds, unlike stat's 10 ms ticks). */
export async function threadsCpuMs(pid: number): Promise<number> {
  let ns = 0;
  for (const tid of await readdir(`/proc/${pid}/task`)) {
    const text = await readFile(`/proc/${pid}/task/${tid}/schedstat`, "utf8").catch(() => "0");
    ns += Number(text.split(" ")[0]);
  }
  return ns / 1e6;
}

export async function measurePhases(
  paths: ForkdPaths,
  plan: RestorePlan,
  n: number,
  expression: string,
  expected: string,
): Promise<PhaseReport> {
  const sums = PHASES.map(() => ({ cpu: 0, wall: 0, tbs: 0, code: 0, flushes: 0 }));
  let flushes = 0;
  let spawnPath = 0;
  for (let i = 0; i < n; i++) {
    flushes += await splitChild(paths, plan, expression, expected, sums);
    spawnPath += await spawnPathChild(paths, plan, expression, expected);
  }
  const rows = PHASES.map((phase, i) => {
    const s = sums[i] as (typeof sums)[number];
    return {
      phase,
      cpu_ms: round1(s.cpu / n),
      wall_ms: round1(s.wall / n),
      tbs_translated: Math.round(s.tbs / n),
      code_kib: Math.round(s.code / n / 1024),
      tb_flushes: round1(s.flushes / n),
    };
  });
  return {
    n,
    rows,
    split_cpu_ms: round1(rows.reduce((a, r) => a + r.cpu_ms, 0)),
    spawn_path_cpu_ms: round1(spawnPath / n),
    tb_flushes: flushes,
  };
}

async function splitChild(
  paths: ForkdPaths,
  plan: RestorePlan,
  expression: string,
  expected: string,
  sums: { cpu: number; wall: number; tbs: number; code: number; flushes: number }[],
): Promise<number> {
  const id = newSandboxId();
  const runDir = path.join(paths.run, id);
  let t = performance.now();
  const { vm } = await launchChild(plan, { runDir, deferred: true, startPaused: true });
  let agent: AgentClient | undefined;
  try {
    const socket = await vm.agentConnection;
    const qmp = await vm.qmp();
    let cpu = 0;
    let jit: JitStats | null = { codeBytes: 0, tbCount: 0, flushes: 0 };
    const mark = async (phase: number) => {
      const wall = performance.now() - t;
      const nowCpu = await threadsCpuMs(vm.pid);
      const nowJit = await queryJit(qmp);
      const s = sums[phase] as (typeof sums)[number];
      s.cpu += nowCpu - cpu;
      s.wall += wall;
      if (jit && nowJit) {
        // After a flush the cache restarts from empty: count what it holds now as this phase's.
        const flushed = nowJit.flushes - jit.flushes;
        s.flushes += flushed;
        s.tbs += flushed > 0 ? nowJit.tbCount : nowJit.tbCount - jit.tbCount;
        s.code += flushed > 0 ? nowJit.codeBytes : nowJit.codeBytes - jit.codeBytes;
      }
      cpu = nowCpu;
      jit = nowJit;
      t = performance.now();
    };
    await mark(0);
    await startIncoming(qmp);
    await waitIncomingLoaded(qmp);
    await mark(1);
    agent = new AgentClient(socket, { callTimeoutMs: 120_000 });
    await qmp.execute("cont");
    await agent.ping();
    await mark(2);
    await agent.restore({
      timeNs: BigInt(Date.now()) * 1_000_000n,
      entropy: randomBytes(64),
      hostname: id,
      sandboxId: id,
    });
    await mark(3);
    await agent.ping();
    await mark(4);
    const out = await agent.eval(expression, { timeoutMs: 60_000 });
    if (out.result !== expected)
      throw new Error(`phase probe: ${expression} answered ${JSON.stringify(out)}`);
    await mark(5);
    return (jit as JitStats | null)?.flushes ?? 0;
  } finally {
    agent?.close();
    await vm.kill({ graceMs: 0 });
    await rm(runDir, { recursive: true, force: true });
  }
}

async function spawnPathChild(
  paths: ForkdPaths,
  plan: RestorePlan,
  expression: string,
  expected: string,
): Promise<number> {
  const sandbox = await Sandbox.restore(paths, plan);
  try {
    const out = await sandbox.agent.eval(expression, { timeoutMs: 60_000 });
    if (out.result !== expected) throw new Error(`spawn path: ${expression} answered ${JSON.stringify(out)}`);
    return await threadsCpuMs(sandbox.pid);
  } finally {
    await sandbox.destroy();
  }
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
