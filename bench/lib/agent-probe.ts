/**
 * One side of bench/agent: measures what a child costs with the guest agent of the forkd checkout at
 * `--root` (its compiled dist/, its templates, its image recipe), so two agents can be compared in one run
 * even when their protocols differ. It imports that checkout's own controller, so each side is driven by
 * its own host code. Prints one JSON line with the samples.
 *
 *   node dist/bench/lib/agent-probe.js --root <forkd checkout> --home <FORKD_HOME> --n 30
 */

import { existsSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { cpuMs, idleCpuMsPerSecond, pssKiB } from "./report.js";

const { values } = parseArgs({
  options: {
    root: { type: "string" },
    home: { type: "string" },
    n: { type: "string", default: "30" },
    rounds: { type: "string", default: "20" },
    tag: { type: "string", default: "pyagent" },
  },
});
if (!values.root || !values.home) throw new Error("usage: agent-probe --root <forkd checkout> --home <dir>");
const root = values.root;
const n = Number(values.n);
const rounds = Number(values.rounds);
const tag = values.tag as string;
process.env.FORKD_HOME = values.home;

// A module by its path in this checkout, then by its paths in older ones (a baseline checkout may predate the
// controller's folders).
const load = async <T>(...rels: string[]): Promise<T> => {
  const file = rels.map((rel) => `${root}/dist/src/${rel}`).find((candidate) => existsSync(candidate));
  if (!file) throw new Error(`${root}/dist/src has none of ${rels.join(", ")}: build that checkout first`);
  return (await import(pathToFileURL(file).href)) as T;
};
// Typed with this checkout's modules: the controller API they share is the same on both sides.
const { resolvePaths } = await load<typeof import("../../src/common/paths.js")>("common/paths.js");
const { createSnapshot } = await load<typeof import("../../src/controller/snapshots/create.js")>(
  "controller/snapshots/create.js",
  "controller/create-snapshot.js",
);
const { listSnapshots } = await load<typeof import("../../src/controller/snapshots/list.js")>(
  "controller/snapshots/list.js",
  "controller/snapshots.js",
);
const { prepareRestore } = await load<typeof import("../../src/controller/machines/restore-plan.js")>(
  "controller/machines/restore-plan.js",
  "controller/restore-plan.js",
);
const { Sandbox } = await load<typeof import("../../src/controller/machines/sandbox-vm.js")>(
  "controller/machines/sandbox-vm.js",
  "controller/sandbox.js",
);
type Child = Awaited<ReturnType<typeof Sandbox.restore>>;

const paths = resolvePaths();
if (!(await listSnapshots(paths)).some((s) => s.tag === tag)) {
  const started = performance.now();
  await createSnapshot(paths, { tag, template: "pyagent" });
  console.error(`# ${root}: snapshot ${tag} created in ${Math.round(performance.now() - started)} ms`);
}
const plan = await prepareRestore(paths, tag);
const live: Child[] = [];
const firstAnswerCpuMs: number[] = [];
const firstAnswerWallMs: number[] = [];
const restoreCpuMs: number[] = [];
try {
  // One child at a time: its QEMU's CPU time right after its first answer is what that answer cost, not
  // shared with other children's work or idle time.
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    const sandbox = await Sandbox.restore(paths, plan);
    live.push(sandbox);
    restoreCpuMs.push(await cpuMs(sandbox.pid));
    const out = await sandbox.agent.eval("1+1", { timeoutMs: 60_000 });
    if (out.result !== "2") throw new Error(`child ${i}: eval 1+1 answered ${JSON.stringify(out)}`);
    firstAnswerCpuMs.push(await cpuMs(sandbox.pid));
    firstAnswerWallMs.push(performance.now() - started);
  }
  // Settle: a restored child's vCPU stays busier for its first seconds (translating timer and agent code).
  await new Promise((r) => setTimeout(r, 5000));
  const pss = await Promise.all(live.map((s) => pssKiB(s.pid)));
  const idle = await idleCpuMsPerSecond(
    live.map((s) => s.pid),
    5000,
  );
  // Round trips on two children, alternating, after their first calls.
  const execMs: number[] = [];
  const evalMs: number[] = [];
  const execFirstMs: number[] = [];
  for (const s of live.slice(0, 2)) {
    const t = performance.now();
    await s.agent.exec(["true"], { timeoutMs: 60_000 });
    execFirstMs.push(performance.now() - t);
  }
  for (let r = 0; r < rounds; r++) {
    for (const s of live.slice(0, 2)) {
      let t = performance.now();
      const ran = await s.agent.exec(["true"], { timeoutMs: 60_000 });
      if (ran.exitCode !== 0) throw new Error(`exec true exited ${ran.exitCode}`);
      execMs.push(performance.now() - t);
      t = performance.now();
      const ev = await s.agent.eval("1+1", { timeoutMs: 60_000 });
      if (ev.result !== "2") throw new Error("eval 1+1 failed");
      evalMs.push(performance.now() - t);
    }
  }
  const version = (await live[0]?.agent.ping())?.agentVersion;
  console.log(
    JSON.stringify({
      root,
      agent_version: version,
      accelerator: plan.snapshot.manifest.machine.accel,
      n,
      restore_cpu_ms: restoreCpuMs,
      first_answer_cpu_ms: firstAnswerCpuMs,
      first_answer_wall_ms: firstAnswerWallMs,
      pss_kib: pss,
      idle_cpu_ms_per_s: idle,
      exec_first_ms: execFirstMs,
      exec_true_ms: execMs,
      eval_ms: evalMs,
    }),
  );
} finally {
  await Promise.all(live.map((s) => s.destroy()));
  await plan.dispose();
}
