/**
 * bench/peers — forkd against what users would pick instead on a host without hardware virtualisation, in one
 * run, on the same workload: N sandboxes each answering `numpy.zeros(5).tolist()`, the clock stopping when all
 * have answered. Every peer uses the same root filesystem (the pyagent image's, mounted read-only), so the
 * same Python and numpy are imported everywhere.
 *
 * - forkd: N copy-on-write children of the warm `pyagent` snapshot (VM isolation, TCG or KVM).
 * - gvisor-cold: `runsc run` per sandbox (ptrace platform, no network), Python importing numpy from scratch.
 * - gvisor-restore: one warm gVisor container (numpy imported) checkpointed once; `runsc restore` per sandbox.
 * - qemu-cold-boot: a fresh VM booted per sandbox from the same image.
 *
 * A peer that cannot run here keeps its row, with `ran: false` and the error it failed with.
 * CPU per sandbox is this process's CPU plus that of its reaped children (QEMU, runsc and their descendants),
 * over the peer's run; memory per sandbox is the PSS of the sandbox's processes while it is alive.
 *
 *   npm run bench -- peers   (root; env: BENCH_N=20, BENCH_COLD_N=2, BENCH_TAG=pyagent, BENCH_CONCURRENCY=2)
 *   needs runsc for the gVisor rows: scripts/install-bench-deps.sh
 */
import { execFile as execFileCb, execFileSync, spawn } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { errorMessage } from "../src/common/errors.js";
import { resolvePaths } from "../src/common/paths.js";
import { chooseAccelerator } from "../src/controller/machines/accelerator.js";
import { coldBootEval } from "../src/controller/machines/cold-boot.js";
import { forkChildren } from "../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { listSnapshots } from "../src/controller/snapshots/list.js";
import { buildImage, loadTemplate } from "../src/image/index.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, pssKiB, type Row, writeResults } from "./lib/report.js";

const execFile = promisify(execFileCb);
const N = envNumber("BENCH_N", 20);
const COLD_N = envNumber("BENCH_COLD_N", 2);
const CONCURRENCY = envNumber("BENCH_CONCURRENCY", os.availableParallelism());
const TAG = process.env.BENCH_TAG ?? "pyagent";
const EXPRESSION = "numpy.zeros(5).tolist()";
const EXPECTED = "[0.0, 0.0, 0.0, 0.0, 0.0]";
const RUNSC = process.env.BENCH_RUNSC ?? "runsc";
/** How long one gVisor sandbox may take to answer before its row fails. */
const GVISOR_TIMEOUT_MS = 120_000;

/** Says /mnt/ready once numpy is imported, waits for /mnt/go, answers into /mnt/answer, then waits for /mnt/exit (so its memory can be measured). */
const GVISOR_PROGRAM = [
  "import numpy, os, time",
  "def wait(p):",
  "    while not os.path.exists(p): time.sleep(0.02)",
  "open('/mnt/ready', 'w').close()",
  "wait('/mnt/go')",
  "open('/mnt/answer.tmp', 'w').write(repr(numpy.zeros(5).tolist()))",
  "os.rename('/mnt/answer.tmp', '/mnt/answer')",
  "wait('/mnt/exit')",
].join("\n");
let ticksPerSecond: number | undefined;

type System = "forkd" | "gvisor-cold" | "gvisor-restore" | "qemu-cold-boot";
interface PeerRow {
  system: System;
  ran: boolean;
  error: string | null;
  n: number;
  wall_ms: number | null;
  cpu_ms_per_sandbox: number | null;
  mem_mib_per_sandbox: number | null;
  isolation: string;
  note?: string;
}

const paths = resolvePaths();
const template = await loadTemplate("pyagent");
const image = await buildImage(template, {});
if (!(await listSnapshots(paths)).some((s) => s.tag === TAG)) {
  console.log(`creating snapshot ${TAG} (one-time)...`);
  await createSnapshot(paths, { tag: TAG, template: "pyagent" });
}
const loadBefore = os.loadavg();
const scratch = await mkdtemp(path.join(os.tmpdir(), "forkd-bench-peers-"));
const rows: PeerRow[] = [];
try {
  rows.push(await forkdRow());
  const rootfs = path.join(scratch, "rootfs");
  const mounted = await mountImage(rootfs).then(
    () => null,
    (err: unknown) => `cannot mount the image's root filesystem for gVisor: ${errorMessage(err)}`,
  );
  try {
    const runsc = mounted ?? (await runscUnavailable());
    rows.push(
      runsc ? failedRow("gvisor-cold", runsc) : await attempt("gvisor-cold", () => gvisorColdRow(rootfs)),
    );
    rows.push(
      runsc
        ? failedRow("gvisor-restore", runsc)
        : await attempt("gvisor-restore", () => gvisorRestoreRow(rootfs)),
    );
  } finally {
    if (!mounted) await execFile("umount", [rootfs]).catch(() => {});
  }
  rows.push(await attempt("qemu-cold-boot", qemuColdBootRow));
} finally {
  await rm(scratch, { recursive: true, force: true });
}

const forkd = rows.find((r) => r.system === "forkd");
const gvisorBest = rows
  .filter((r) => r.system.startsWith("gvisor") && r.ran && r.wall_ms !== null)
  .map((r) => (r.wall_ms as number) / r.n)
  .sort((a, b) => a - b)[0];
const result = {
  host: hostDescription(),
  accelerator: (await chooseAccelerator(paths, image)).accel,
  load_average_before: loadBefore.map(round1),
  load_average_after: os.loadavg().map(round1),
  workload: `N sandboxes each answering ${EXPRESSION}, ${CONCURRENCY} at a time`,
  rows,
  forkd_speedup_per_sandbox_vs_best_gvisor:
    forkd?.wall_ms && gvisorBest ? round1(gvisorBest / (forkd.wall_ms / forkd.n)) : null,
  measured_at: new Date().toISOString(),
};
const table: Row[] = rows.map((r) => ({
  metric: `${r.system} (N=${r.n})`,
  value: r.ran ? `${r.wall_ms} ms` : "did not run",
  note: r.ran
    ? `${r.wall_ms !== null ? round1(r.wall_ms / r.n) : "?"} ms/sandbox wall; CPU ${r.cpu_ms_per_sandbox} ms/sandbox; ` +
      `mem ${r.mem_mib_per_sandbox ?? "n/a"} MiB/sandbox; ${r.isolation}${r.note ? `; ${r.note}` : ""}`
    : `error: ${r.error}`,
}));
table.push({
  metric: "forkd per sandbox vs best gVisor",
  value: `${result.forkd_speedup_per_sandbox_vs_best_gvisor ?? "n/a"}x`,
  target: ">= 2x",
});
const conditions = `${result.accelerator}, load average ${result.load_average_before.join(" ")} before, ${result.load_average_after.join(" ")} after`;
printRows(`bench/peers on ${result.host} (${conditions})`, table);
await writeResults(
  "peers",
  result,
  `# bench/peers\n\n${result.measured_at} on ${result.host}; ${conditions}; ${result.workload}\n\n${markdownTable(table)}`,
);

// ---- forkd ----

async function forkdRow(): Promise<PeerRow> {
  let pss = Number.NaN;
  const cpu = cpuMeter();
  const fork = await forkChildren(paths, {
    tag: TAG,
    n: N,
    eval: EXPRESSION,
    concurrency: CONCURRENCY,
    inspect: async (live) => {
      const each = await Promise.all(live.map((s) => pssKiB(s.pid)));
      pss = each.reduce((a, b) => a + b, 0) / live.length / 1024;
    },
  });
  const correct = fork.children.filter((c) => c.result === EXPECTED).length;
  return {
    system: "forkd",
    ran: true,
    error: correct === N ? null : `${N - correct} of ${N} children did not answer correctly`,
    n: N,
    wall_ms: Math.round(fork.wall_ms),
    cpu_ms_per_sandbox: round1(cpu() / N),
    mem_mib_per_sandbox: round1(pss),
    isolation: `VM (${fork.accelerator}), copy-on-write fork of a warm snapshot`,
  };
}

// ---- gVisor ----

async function runscUnavailable(): Promise<string | null> {
  if (process.getuid?.() !== 0) return "needs root (runsc creates namespaces and mounts)";
  try {
    await execFile(RUNSC, ["--version"]);
    return null;
  } catch (err) {
    return `${RUNSC} is not installed (scripts/install-bench-deps.sh installs Debian's runsc): ${errorMessage(err)}`;
  }
}

async function mountImage(target: string): Promise<void> {
  await mkdir(target, { recursive: true });
  await execFile("mount", ["-o", "loop,ro", image.rootfs, target]);
}

/** A sandbox's bundle directory with a config.json made by `runsc spec` and adjusted. */
async function bundle(rootfs: string, share: string, program: string): Promise<string> {
  const dir = await mkdtemp(path.join(scratch, "bundle-"));
  await execFile(RUNSC, ["spec"], { cwd: dir });
  const config = JSON.parse(await readFile(path.join(dir, "config.json"), "utf8"));
  config.root = { path: rootfs, readonly: true };
  config.process.terminal = false;
  config.process.args = ["python3", "-c", program];
  config.mounts.push(
    { destination: "/mnt", type: "bind", source: share, options: ["rbind", "rw"] },
    { destination: "/tmp", type: "tmpfs", source: "tmpfs" },
  );
  await writeFile(path.join(dir, "config.json"), JSON.stringify(config));
  return dir;
}

function runscArgs(stateDir: string, ...rest: string[]): string[] {
  return ["--platform=ptrace", "--network=none", `--root=${stateDir}`, ...rest];
}

/** Runs `start(i)` for i < n, CONCURRENCY at a time; each answers through its share dir. */
async function gvisorSandboxes(
  n: number,
  start: (i: number, share: string) => Promise<{ done: Promise<unknown>; bundle: string }>,
): Promise<{ wallMs: number; cpuMs: number; memMiB: number }> {
  const cpu = cpuMeter();
  const started = performance.now();
  const pss: number[] = [];
  let sandboxCpuMs = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(CONCURRENCY, n) }, async () => {
      while (next < n) {
        const i = next++;
        const share = await mkdtemp(path.join(scratch, "share-"));
        await writeFile(path.join(share, "go"), "");
        const sandbox = await start(i, share);
        const answer = await waitForFile(path.join(share, "answer"), GVISOR_TIMEOUT_MS, sandbox.done);
        if (answer !== EXPECTED) throw new Error(`sandbox ${i} answered ${JSON.stringify(answer)}`);
        // runsc's sandbox and gofer leave runsc's process tree: find them by their bundle directory.
        const pids = await processesWith(`--bundle=${sandbox.bundle}`, `--bundle ${sandbox.bundle}`);
        const trees = (await Promise.all(pids.map(processTree))).flat();
        pss.push(await sumPssKiB(trees));
        sandboxCpuMs += await sumCpuMs(trees);
        await writeFile(path.join(share, "exit"), "");
        await sandbox.done;
      }
    }),
  );
  const wallMs = performance.now() - started;
  return { wallMs, cpuMs: cpu() + sandboxCpuMs, memMiB: pss.reduce((a, b) => a + b, 0) / pss.length / 1024 };
}

async function gvisorColdRow(rootfs: string): Promise<PeerRow> {
  const state = await mkdtemp(path.join(scratch, "state-"));
  const run = await gvisorSandboxes(N, async (i, share) => {
    const dir = await bundle(rootfs, share, GVISOR_PROGRAM);
    const child = execFileCb(RUNSC, runscArgs(state, "run", "--bundle", dir, `cold-${i}`), {
      timeout: GVISOR_TIMEOUT_MS,
    });
    return { done: exitOf(child), bundle: dir };
  });
  return {
    system: "gvisor-cold",
    ran: true,
    error: null,
    n: N,
    wall_ms: Math.round(run.wallMs),
    cpu_ms_per_sandbox: round1(run.cpuMs / N),
    mem_mib_per_sandbox: round1(run.memMiB),
    isolation: "gVisor sentry (user-space kernel), ptrace platform, no network",
  };
}

async function gvisorRestoreRow(rootfs: string): Promise<PeerRow> {
  const state = await mkdtemp(path.join(scratch, "state-"));
  const imageDir = path.join(scratch, "checkpoint");
  // The warm container: numpy imported, waiting for /mnt/go (never given), then checkpointed.
  const warmShare = await mkdtemp(path.join(scratch, "share-"));
  const warmBundle = await bundle(rootfs, warmShare, GVISOR_PROGRAM);
  const setupStarted = performance.now();
  // The container inherits create's stdio and keeps it open: with pipes, create would never seem done.
  await exitOf(spawn(RUNSC, runscArgs(state, "create", "--bundle", warmBundle, "warm"), { stdio: "ignore" }));
  await execFile(RUNSC, runscArgs(state, "start", "warm"));
  await waitForFile(path.join(warmShare, "ready"), GVISOR_TIMEOUT_MS, new Promise(() => {}));
  await execFile(RUNSC, runscArgs(state, "checkpoint", `--image-path=${imageDir}`, "warm"));
  await execFile(RUNSC, runscArgs(state, "delete", "-force", "warm")).catch(() => {});
  const setupMs = performance.now() - setupStarted;
  const run = await gvisorSandboxes(N, async (i, share) => {
    const dir = await bundle(rootfs, share, GVISOR_PROGRAM);
    const child = execFileCb(
      RUNSC,
      runscArgs(state, "restore", `--image-path=${imageDir}`, "--bundle", dir, `restore-${i}`),
      { timeout: GVISOR_TIMEOUT_MS, cwd: dir },
    );
    return { done: exitOf(child), bundle: dir };
  });
  return {
    system: "gvisor-restore",
    ran: true,
    error: null,
    n: N,
    wall_ms: Math.round(run.wallMs),
    cpu_ms_per_sandbox: round1(run.cpuMs / N),
    mem_mib_per_sandbox: round1(run.memMiB),
    isolation: "gVisor sentry (user-space kernel), ptrace platform, no network",
    note: `checkpoint of the warm container made once beforehand in ${Math.round(setupMs)} ms (not counted)`,
  };
}

// ---- QEMU cold boot ----

async function qemuColdBootRow(): Promise<PeerRow> {
  const accel = await chooseAccelerator(paths, image);
  const cpu = cpuMeter();
  const started = performance.now();
  let correct = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(CONCURRENCY, COLD_N) }, async () => {
      while (next < COLD_N) {
        next++;
        const r = await coldBootEval(paths, { template, image, accel, code: EXPRESSION });
        if (r.result === EXPECTED) correct++;
      }
    }),
  );
  return {
    system: "qemu-cold-boot",
    ran: true,
    error: correct === COLD_N ? null : `${COLD_N - correct} of ${COLD_N} boots did not answer correctly`,
    n: COLD_N,
    wall_ms: Math.round(performance.now() - started),
    cpu_ms_per_sandbox: round1(cpu() / COLD_N),
    mem_mib_per_sandbox: null,
    isolation: `VM (${accel.accel}), booted from scratch`,
    note: "memory not sampled (the VM exits once it answered)",
  };
}

// ---- helpers ----

async function attempt(system: System, run: () => Promise<PeerRow>): Promise<PeerRow> {
  try {
    return await run();
  } catch (err) {
    return failedRow(system, errorMessage(err));
  }
}

function failedRow(system: System, error: string): PeerRow {
  return {
    system,
    ran: false,
    error,
    n: system === "qemu-cold-boot" ? COLD_N : N,
    wall_ms: null,
    cpu_ms_per_sandbox: null,
    mem_mib_per_sandbox: null,
    isolation: system.startsWith("gvisor") ? "gVisor, ptrace platform" : "VM",
  };
}

/** CPU of this process and of its reaped descendants since the call, in ms. */
function cpuMeter(): () => number {
  const before = ownAndChildrenCpuMs();
  return () => ownAndChildrenCpuMs() - before;
}

function ownAndChildrenCpuMs(): number {
  const fields = execFileSync("cat", [`/proc/${process.pid}/stat`], { encoding: "utf8" });
  const f = fields.slice(fields.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
  return (ticks * 1000) / clockTicks();
}

function clockTicks(): number {
  ticksPerSecond ??= Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
  return ticksPerSecond;
}

/** pid and its descendants (from /proc's parent links). */
async function processTree(root: number): Promise<number[]> {
  const parents = new Map<number, number>();
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const stat = await readFile(`/proc/${name}/stat`, "utf8").catch(() => "");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (f.length > 2) parents.set(Number(name), Number(f[1]));
  }
  const tree = [root];
  for (let i = 0; i < tree.length; i++) {
    for (const [pid, ppid] of parents) if (ppid === tree[i]) tree.push(pid);
  }
  return tree;
}

/** Processes whose command line contains one of `needles`. */
async function processesWith(...needles: string[]): Promise<number[]> {
  const found: number[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = (await readFile(`/proc/${name}/cmdline`, "utf8").catch(() => "")).replaceAll("\0", " ");
    if (needles.some((n) => cmdline.includes(n))) found.push(Number(name));
  }
  return found;
}

async function sumPssKiB(pids: number[]): Promise<number> {
  const each = await Promise.all([...new Set(pids)].map((pid) => pssKiB(pid).catch(() => 0)));
  return each.reduce((a, b) => a + (Number.isNaN(b) ? 0 : b), 0);
}

/** CPU the processes used so far, their reaped children included. */
async function sumCpuMs(pids: number[]): Promise<number> {
  let ticks = 0;
  for (const pid of new Set(pids)) {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks += Number(f[11] ?? 0) + Number(f[12] ?? 0) + Number(f[13] ?? 0) + Number(f[14] ?? 0);
  }
  return (ticks * 1000) / clockTicks();
}

function exitOf(child: import("node:child_process").ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    let stderr = "";
    child.stderr?.on("data", (d: Buffer) => {
      if (stderr.length < 4000) stderr += d.toString();
    });
    child.once("exit", (code, signal) =>
      code === 0
        ? resolve()
        : reject(new Error(`runsc exited ${code ?? signal}: ${stderr.trim().slice(-800)}`)),
    );
  });
}

async function waitForFile(file: string, timeoutMs: number, exited: Promise<unknown>): Promise<string> {
  let failure: unknown;
  exited.catch((err: unknown) => {
    failure = err;
  });
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (failure) throw failure;
    const text = await readFile(file, "utf8").catch(() => null);
    if (text !== null) return text;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`no answer in ${file} within ${timeoutMs} ms`);
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
