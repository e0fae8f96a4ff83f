/**
 * bench/agent — the guest agent's cost per child under TCG, two agents side by side in one run: the Node.js
 * agent of a baseline checkout (BENCH_BASELINE_ROOT, e.g. a worktree of main built with npm run build) and
 * this checkout's Go agent. Each side restores N children of its own `pyagent` snapshot one at a time and
 * measures host CPU per child to its first answer (QEMU start + restore fix-up + first eval `1+1`), PSS and
 * idle CPU with all N alive, and `exec true` / eval `1+1` round trips. Each side runs in its own process
 * with its own host code (bench/lib/agent-probe.ts), so agents with different protocols compare fairly.
 *
 *   BENCH_BASELINE_ROOT=/work/wt/agent-baseline npm run bench -- agent   (env: BENCH_N=30, BENCH_ROUNDS=20)
 */
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { percentile } from "../src/common/stats.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const thisRoot = path.resolve(here, "../..");
const baselineRoot = process.env.BENCH_BASELINE_ROOT;
if (!baselineRoot) throw new Error("set BENCH_BASELINE_ROOT to a built checkout with the baseline agent");
const n = process.env.BENCH_N ?? "30";
const rounds = process.env.BENCH_ROUNDS ?? "20";
const homeBase = process.env.BENCH_HOME ?? "/var/tmp/forkd-bench-agent";

interface Probe {
  root: string;
  agent_version: string;
  accelerator: string;
  n: number;
  restore_cpu_ms: number[];
  first_answer_cpu_ms: number[];
  first_answer_wall_ms: number[];
  pss_kib: number[];
  idle_cpu_ms_per_s: number;
  exec_first_ms: number[];
  exec_true_ms: number[];
  eval_ms: number[];
}

function probe(name: string, root: string): Probe {
  const home = path.join(homeBase, name);
  mkdirSync(home, { recursive: true });
  const out = execFileSync(
    process.execPath,
    [path.join(here, "lib/agent-probe.js"), "--root", root, "--home", home, "--n", n, "--rounds", rounds],
    { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 16 << 20 },
  );
  return JSON.parse(out.trim().split("\n").at(-1) as string) as Probe;
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const r0 = (x: number) => Math.round(x);
const r1 = (x: number) => Math.round(x * 10) / 10;

const sides = [
  { name: "node", label: "Node.js agent (baseline)", root: path.resolve(baselineRoot) },
  { name: "go", label: "Go agent (this checkout)", root: thisRoot },
].map((side) => ({ ...side, probe: probe(side.name, side.root) }));

const summary = sides.map(({ name, label, probe: p }) => ({
  name,
  label,
  agent_version: p.agent_version,
  accelerator: p.accelerator,
  n: p.n,
  cpu_ms_per_child_first_answer: r0(mean(p.first_answer_cpu_ms)),
  cpu_ms_per_child_restored: r0(mean(p.restore_cpu_ms)),
  first_answer_wall_p50_ms: r0(percentile(p.first_answer_wall_ms, 50)),
  exec_true_first_ms: r0(mean(p.exec_first_ms)),
  exec_true_p50_ms: r0(percentile(p.exec_true_ms, 50)),
  exec_true_p99_ms: r0(percentile(p.exec_true_ms, 99)),
  eval_p50_ms: r1(percentile(p.eval_ms, 50)),
  eval_p99_ms: r1(percentile(p.eval_ms, 99)),
  pss_mib_per_child: r1(mean(p.pss_kib) / 1024),
  idle_cpu_ms_per_s_per_child: r1(p.idle_cpu_ms_per_s),
}));
const [node, go] = summary as [(typeof summary)[number], (typeof summary)[number]];
const ratio = (a: number, b: number) => `${r1(a / b)}x`;
const rows: Row[] = [
  { metric: "accelerator", value: `${node.accelerator} / ${go.accelerator}` },
  {
    metric: "host CPU per child to first answer (QEMU start + restore + eval 1+1)",
    value: `${node.cpu_ms_per_child_first_answer} / ${go.cpu_ms_per_child_first_answer} ms`,
    target: "< 200 ms",
    note: `${ratio(node.cpu_ms_per_child_first_answer, go.cpu_ms_per_child_first_answer)} less; N=${go.n} each, one at a time`,
  },
  {
    metric: "  of which up to the restore answer",
    value: `${node.cpu_ms_per_child_restored} / ${go.cpu_ms_per_child_restored} ms`,
  },
  {
    metric: "first answer wall p50",
    value: `${node.first_answer_wall_p50_ms} / ${go.first_answer_wall_p50_ms} ms`,
  },
  {
    metric: "`exec true`, first call per child",
    value: `${node.exec_true_first_ms} / ${go.exec_true_first_ms} ms`,
  },
  {
    metric: "`exec true` round trip p50 / p99",
    value: `${node.exec_true_p50_ms} / ${node.exec_true_p99_ms} → ${go.exec_true_p50_ms} / ${go.exec_true_p99_ms} ms`,
    target: "p50 < 100 ms",
  },
  {
    metric: "eval `1+1` p50 / p99",
    value: `${node.eval_p50_ms} / ${node.eval_p99_ms} → ${go.eval_p50_ms} / ${go.eval_p99_ms} ms`,
    target: "p50 < 5 ms",
  },
  {
    metric: "PSS per child (all N alive)",
    value: `${node.pss_mib_per_child} / ${go.pss_mib_per_child} MiB`,
  },
  {
    metric: "idle host CPU per child (all N alive, 5 s)",
    value: `${node.idle_cpu_ms_per_s_per_child} / ${go.idle_cpu_ms_per_s_per_child} ms/s`,
  },
];
const measuredAt = new Date().toISOString();
printRows(`bench/agent (Node / Go) on ${hostDescription()}`, rows);
await writeResults(
  "agent",
  { host: hostDescription(), measured_at: measuredAt, summary, samples: sides.map((s) => s.probe) },
  `# bench/agent\n\n${measuredAt} on ${hostDescription()}; pyagent, guest 512 MiB, N=${go.n} children per agent, Node.js agent (baseline) / Go agent\n\n${markdownTable(rows)}`,
);
