/**
 * bench/command — where a command's time goes, layer by layer, calls interleaved in one run so load hits every
 * layer alike:
 *   - in the guest: `posix_spawn` + wait of /bin/true, timed by the guest itself (a Python cell): the guest's
 *     kernel and libc creating a process, no agent;
 *   - the agent: `exec true` straight to a sandbox's agent (in this process, no daemon): the guest agent's own
 *     time for the call (its `duration_ms`) and the host round trip, and the sandbox's QEMU CPU per call; the
 *     same in a sibling whose guest address-space randomisation is on (randomize_va_space 2 vs 0);
 *   - the daemon: forkd's SDK `commands.run(["true"])` (REST exec stream over TCP), then the shells E2B users get:
 *     `bash -c true` (forkd's string form) and `bash -l -c true` (E2B's argv);
 *   - E2B's SDK `commands.run('true')` (envd's Process service, `bash -l -c true`);
 *   - `forkd exec <id> -- true`, the CLI as a user types it (Node.js start included).
 * Targets: `commands.run('true')` and forkd exec p50 < 150 ms.
 *
 *   npm run bench -- command   (env: BENCH_TAG=pyagent, BENCH_REQUESTS=30, BENCH_CLI_REQUESTS=10)
 */
import { execFile } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { Sandbox as E2bSandbox } from "e2b";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { prepareRestore } from "../src/controller/machines/restore-plan.js";
import { Sandbox as Direct } from "../src/controller/machines/sandbox-vm.js";
import { packageRoot } from "../src/image/package-root.js";
import { Sandbox } from "../src/sdk/index.js";
import { startTcpBenchDaemon } from "./lib/daemon.js";
import { envNumber } from "./lib/env.js";
import { threadsCpuMs } from "./lib/phases.js";
import {
  benchConditions,
  conditionsLine,
  hostDescription,
  markdownTable,
  printRows,
  type Row,
  writeResults,
} from "./lib/report.js";

const TAG = process.env.BENCH_TAG ?? "pyagent";
const REQUESTS = envNumber("BENCH_REQUESTS", 30);
const CLI_REQUESTS = envNumber("BENCH_CLI_REQUESTS", 10);
const WARMUP_CALLS = 3;
const execFileAsync = promisify(execFile);

const paths = resolvePaths();
const loadBefore = os.loadavg();
const server = await startTcpBenchDaemon(paths.home, TAG);
const { url, token } = server;
const plan = await prepareRestore(paths, TAG);
const samples: Record<string, number[]> = {};
const push = (key: string, value: number) => {
  samples[key] ??= [];
  samples[key].push(value);
};
let e2bBox: E2bSandbox | undefined;
let forkdBox: Sandbox | undefined;
let direct: Direct | undefined;
let directAslr: Direct | undefined;
try {
  direct = await Direct.restore(paths, plan);
  // The same snapshot with the guest's address-space randomisation switched the other way at run time, so
  // both settings are measured side by side whatever the snapshot was booted with (TCG default: off).
  directAslr = await Direct.restore(paths, plan);
  for (const [sandbox, value] of [
    [direct, 0],
    [directAslr, 2],
  ] as const) {
    const set = await sandbox.agent.exec(["sh", "-c", `echo ${value} > /proc/sys/kernel/randomize_va_space`]);
    if (set.exitCode !== 0) throw new Error(`cannot set randomize_va_space: ${set.stderr}`);
  }
  const a = directAslr;
  forkdBox = await Sandbox.create({ snapshotTag: TAG, url, token, env: {}, timeoutMs: 30 * 60_000 });
  e2bBox = await E2bSandbox.create({ timeoutMs: 30 * 60_000 });
  const d = direct;
  const f = forkdBox;
  const e = e2bBox;
  const cliEnv = { ...process.env, FORKD_URL: url, FORKD_TOKEN: token };
  const cli = () =>
    execFileAsync(
      process.execPath,
      [path.join(packageRoot(), "bin", "forkd.js"), "exec", f.id, "--", "true"],
      {
        env: cliEnv,
      },
    );
  const layers: [string, () => Promise<unknown>][] = [
    [
      "guest posix_spawn",
      async () => {
        const out = await d.agent.eval(
          "import os, time\n_t = time.perf_counter()\n_p = os.posix_spawn('/bin/true', ['true'], {})\nos.waitpid(_p, 0)\n(time.perf_counter() - _t) * 1000",
          { timeoutMs: 60_000 },
        );
        if (out.result === null) throw new Error(`posix_spawn cell failed: ${out.error?.message}`);
        push("guest posix_spawn (guest clock)", Number(out.result));
      },
    ],
    [
      "agent exec true",
      async () => {
        const cpu = await threadsCpuMs(d.pid);
        const t = performance.now();
        const ran = await d.agent.exec(["true"], { timeoutMs: 60_000 });
        push("agent exec true (host round trip)", performance.now() - t);
        push("agent exec true (guest agent's duration)", ran.durationMs);
        push("agent exec true (QEMU CPU)", (await threadsCpuMs(d.pid)) - cpu);
        if (ran.exitCode !== 0) throw new Error(`exec true exited ${ran.exitCode}`);
      },
    ],
    [
      "agent exec true, guest ASLR on",
      async () => {
        const cpu = await threadsCpuMs(a.pid);
        const ran = await a.agent.exec(["true"], { timeoutMs: 60_000 });
        push("agent exec true, guest ASLR on (QEMU CPU)", (await threadsCpuMs(a.pid)) - cpu);
        if (ran.exitCode !== 0) throw new Error(`exec true exited ${ran.exitCode}`);
      },
    ],
    ["forkd SDK commands.run(['true'])", () => f.commands.run(["true"])],
    ["forkd SDK commands.run('true') (bash -c)", () => f.commands.run("true")],
    ["forkd SDK bash -l -c true", () => f.commands.run(["/bin/bash", "-l", "-c", "true"])],
    ["E2B SDK commands.run('true') (bash -l -c)", () => e.commands.run("true")],
  ];
  for (let i = 0; i < WARMUP_CALLS; i++) for (const [, call] of layers) await call();
  for (let i = 0; i < REQUESTS; i++) {
    // Rotated so no layer always runs right after the same other one.
    for (let k = 0; k < layers.length; k++) {
      const [name, call] = layers[(i + k) % layers.length] as (typeof layers)[number];
      const t = performance.now();
      await call();
      push(name, performance.now() - t);
    }
    if (i < CLI_REQUESTS) {
      const t = performance.now();
      await cli();
      push("forkd exec <id> -- true (CLI process)", performance.now() - t);
    }
  }

  const conditions = await benchConditions(plan.snapshot.manifest);
  const p50 = (key: string) => r1(percentile(samples[key] ?? [], 50));
  const p99 = (key: string) => r1(percentile(samples[key] ?? [], 99));
  const result = {
    host: hostDescription(),
    ...conditions,
    tag: TAG,
    load_average_before: loadBefore.map(r1),
    load_average_after: os.loadavg().map(r1),
    requests: REQUESTS,
    p50_ms: Object.fromEntries(Object.keys(samples).map((k) => [k, p50(k)])),
    p99_ms: Object.fromEntries(Object.keys(samples).map((k) => [k, p99(k)])),
    samples,
    measured_at: new Date().toISOString(),
  };
  const row = (key: string, target?: string, note?: string): Row => ({
    metric: key,
    value: `${p50(key)} / ${p99(key)} ms`,
    target,
    note,
  });
  const spawn = p50("guest posix_spawn (guest clock)");
  const agentGuest = p50("agent exec true (guest agent's duration)");
  const agentHost = p50("agent exec true (host round trip)");
  const sdkArgv = p50("forkd SDK commands.run(['true'])");
  const rows: Row[] = [
    row(
      "guest posix_spawn (guest clock)",
      undefined,
      "the guest's kernel and libc: process creation, exec, exit, wait",
    ),
    row(
      "agent exec true (guest agent's duration)",
      undefined,
      `agent around the process: ${r1(agentGuest - spawn)} ms`,
    ),
    row(
      "agent exec true (host round trip)",
      undefined,
      `transport and host client: ${r1(agentHost - agentGuest)} ms`,
    ),
    row("agent exec true (QEMU CPU)", undefined, "host CPU of the sandbox's QEMU per call (guest ASLR off)"),
    row("agent exec true, guest ASLR on", undefined, "the same call in a sibling with randomize_va_space=2"),
    row("agent exec true, guest ASLR on (QEMU CPU)", undefined, "host CPU of that sibling's QEMU per call"),
    row(
      "forkd SDK commands.run(['true'])",
      "< 150 ms",
      `daemon, REST and SDK: ${r1(sdkArgv - agentHost)} ms`,
    ),
    row(
      "forkd SDK commands.run('true') (bash -c)",
      undefined,
      `bash: +${r1(p50("forkd SDK commands.run('true') (bash -c)") - sdkArgv)} ms`,
    ),
    row(
      "forkd SDK bash -l -c true",
      undefined,
      `login shell (profile scripts): +${r1(p50("forkd SDK bash -l -c true") - p50("forkd SDK commands.run('true') (bash -c)"))} ms`,
    ),
    row(
      "E2B SDK commands.run('true') (bash -l -c)",
      "< 150 ms",
      `envd protocol vs the same argv: ${r1(p50("E2B SDK commands.run('true') (bash -l -c)") - p50("forkd SDK bash -l -c true"))} ms`,
    ),
    row(
      "forkd exec <id> -- true (CLI process)",
      "< 150 ms",
      `${CLI_REQUESTS} runs; Node.js start and the CLI's own work included`,
    ),
  ];
  const head = `${conditionsLine(conditions)}, load average ${result.load_average_before.join(" ")} before, ${result.load_average_after.join(" ")} after`;
  printRows(`bench/command on ${result.host} (${head}); p50 / p99`, rows);
  await writeResults(
    "command",
    result,
    `# bench/command\n\n${result.measured_at} on ${result.host}; ${head}; snapshot ${TAG}; ${REQUESTS} calls per layer, interleaved; p50 / p99\n\n${markdownTable(rows)}`,
  );
} finally {
  await e2bBox?.kill().catch(() => {});
  await forkdBox?.kill().catch(() => {});
  await direct?.destroy();
  await directAslr?.destroy();
  await plan.dispose();
  await server.stop();
}

function r1(n: number): number {
  return Math.round(n * 10) / 10;
}
