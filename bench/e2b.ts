import { Sandbox as E2bSandbox } from "@e2b/code-interpreter";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import { Sandbox } from "../src/sdk/index.js";
import { startTcpBenchDaemon } from "./lib/daemon.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const TAG = process.env.BENCH_TAG ?? "pyagent";
const N = envNumber("BENCH_N", 20);
const PARALLEL = 2;
const REQUESTS = envNumber("BENCH_REQUESTS", 30);
const FORKS = envNumber("BENCH_FORKS", 10);
const FORK_ROUNDS = envNumber("BENCH_FORK_ROUNDS", 4);
const EXPRESSION = "numpy.zeros(5).tolist()";
const EXPECTED = "[0.0, 0.0, 0.0, 0.0, 0.0]";
const LIFETIME_MS = 30 * 60_000;

const paths = resolvePaths();
const server = await startTcpBenchDaemon(paths.home, TAG);
const { daemon, url, token } = server;
const forkdOptions = { url, token, env: {}, timeoutMs: LIFETIME_MS };

interface Timed {
  wallMs: number;
  latenciesMs: number[];
  correct: number;
}

/** `count` rounds of create + first cell + kill, `PARALLEL` at a time. */
async function createAndRun(count: number, createAndEval: () => Promise<boolean>): Promise<Timed> {
  const latenciesMs: number[] = [];
  let correct = 0;
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: PARALLEL }, async () => {
      while (next < count) {
        next++;
        const t0 = performance.now();
        if (await createAndEval()) correct++;
        latenciesMs.push(performance.now() - t0);
      }
    }),
  );
  return { wallMs: performance.now() - started, latenciesMs, correct };
}

const e2bCreate = async () => {
  const sbx = await E2bSandbox.create({ timeoutMs: LIFETIME_MS });
  try {
    return (await sbx.runCode(EXPRESSION)).text === EXPECTED;
  } finally {
    await sbx.kill();
  }
};
const forkdCreate = async () => {
  const sandbox = await Sandbox.create({ snapshotTag: TAG, ...forkdOptions });
  try {
    return (await sandbox.runCode(EXPRESSION)).result === EXPECTED;
  } finally {
    await sandbox.kill();
  }
};

function merge(a: Timed, b: Timed): Timed {
  return {
    wallMs: a.wallMs + b.wallMs,
    latenciesMs: [...a.latenciesMs, ...b.latenciesMs],
    correct: a.correct + b.correct,
  };
}

const ms = (v: number) => `${Math.round(v)} ms`;
const pct = (ours: number, theirs: number) =>
  `${theirs >= ours ? "+" : ""}${(((theirs - ours) / ours) * 100).toFixed(1)}%`;

try {
  // --- create + first runCode, in alternating quarters ---
  let forkdRuns: Timed = { wallMs: 0, latenciesMs: [], correct: 0 };
  let e2bRuns: Timed = { wallMs: 0, latenciesMs: [], correct: 0 };
  // Who goes first alternates too: a quarter right after the other path's kills runs on a busier host.
  for (let quarter = 0; quarter < 4; quarter++) {
    const count = Math.floor((N * (quarter + 1)) / 4) - Math.floor((N * quarter) / 4);
    const runForkd = async () => {
      forkdRuns = merge(forkdRuns, await createAndRun(count, forkdCreate));
    };
    const runE2b = async () => {
      e2bRuns = merge(e2bRuns, await createAndRun(count, e2bCreate));
    };
    for (const run of quarter % 2 === 0 ? [runForkd, runE2b] : [runE2b, runForkd]) await run();
  }

  // --- round trips ---
  const e2bBox = await E2bSandbox.create({ timeoutMs: LIFETIME_MS });
  const forkdBox = await Sandbox.create({ snapshotTag: TAG, ...forkdOptions });
  const trips = { e2b: [] as number[], forkd: [] as number[], forkdSameArgv: [] as number[] };
  const time = async (into: number[], call: () => Promise<unknown>) => {
    const t0 = performance.now();
    await call();
    into.push(performance.now() - t0);
  };
  for (let i = 0; i < 3; i++) {
    await e2bBox.commands.run("true");
    await forkdBox.commands.run("true");
  }
  for (let i = 0; i < REQUESTS; i++) {
    await time(trips.e2b, () => e2bBox.commands.run("true"));
    await time(trips.forkd, () => forkdBox.commands.run("true"));
    await time(trips.forkdSameArgv, () => forkdBox.commands.run(["/bin/bash", "-l", "-c", "true"]));
  }

  // --- fork count=FORKS, rounds alternating; children killed after each ---
  const forkWalls = { e2b: [] as number[], forkd: [] as number[] };
  let forkFailures = 0;
  const forkE2b = async () => {
    const t0 = performance.now();
    const forks = await E2bSandbox.fork(e2bBox.sandboxId, { count: FORKS, timeoutMs: LIFETIME_MS });
    forkWalls.e2b.push(performance.now() - t0);
    forkFailures += forks.filter((f) => f instanceof Error).length;
    await Promise.all(forks.map((f) => (f instanceof Error ? undefined : f.kill())));
  };
  const forkForkd = async () => {
    const t0 = performance.now();
    const ours = await daemon.controller.json<{ children: { sandbox: { id: string } | null }[] }>(
      {
        method: "POST",
        path: `/v1/sandboxes/${forkdBox.id}/fork`,
        json: { count: FORKS, timeout_ms: LIFETIME_MS },
      },
      { requestTimeoutMs: 600_000 },
    );
    forkWalls.forkd.push(performance.now() - t0);
    forkFailures += ours.children.filter((c) => c.sandbox === null).length;
    await Promise.all(
      ours.children.map((c) => (c.sandbox ? daemon.controller.killSandbox(c.sandbox.id) : undefined)),
    );
  };
  for (let round = 0; round < FORK_ROUNDS; round++) {
    for (const fork of round % 2 === 0 ? [forkE2b, forkForkd] : [forkForkd, forkE2b]) await fork();
  }
  await e2bBox.kill();
  await forkdBox.kill();

  const p50 = (v: number[]) => percentile(v, 50);
  const p99 = (v: number[]) => percentile(v, 99);
  const rows: Row[] = [
    {
      metric: `create + first runCode, N=${N}, ${PARALLEL} at a time: wall forkd SDK / E2B SDK`,
      value: `${(forkdRuns.wallMs / 1000).toFixed(1)} / ${(e2bRuns.wallMs / 1000).toFixed(1)} s (${pct(forkdRuns.wallMs, e2bRuns.wallMs)})`,
      target: "E2B within 10%",
      note: `correct ${forkdRuns.correct}/${N} and ${e2bRuns.correct}/${N}`,
    },
    {
      metric: "  per sandbox p50 / p99: forkd SDK",
      value: `${ms(p50(forkdRuns.latenciesMs))} / ${ms(p99(forkdRuns.latenciesMs))}`,
    },
    {
      metric: "  per sandbox p50 / p99: E2B SDK",
      value: `${ms(p50(e2bRuns.latenciesMs))} / ${ms(p99(e2bRuns.latenciesMs))}`,
    },
    {
      metric: `commands.run('true') p50 / p99, ${REQUESTS} calls: forkd SDK (bash -c)`,
      value: `${ms(p50(trips.forkd))} / ${ms(p99(trips.forkd))}`,
    },
    {
      metric: "  forkd SDK, E2B's argv (bash -l -c true)",
      value: `${ms(p50(trips.forkdSameArgv))} / ${ms(p99(trips.forkdSameArgv))}`,
    },
    {
      metric: "  E2B SDK (bash -l -c true)",
      value: `${ms(p50(trips.e2b))} / ${ms(p99(trips.e2b))} (p50 ${pct(p50(trips.forkdSameArgv), p50(trips.e2b))} vs the same argv)`,
      target: "E2B within 10%",
    },
    {
      metric: `fork count=${FORKS}, wall p50 over ${FORK_ROUNDS} rounds: forkd API / E2B SDK`,
      value: `${(p50(forkWalls.forkd) / 1000).toFixed(1)} / ${(p50(forkWalls.e2b) / 1000).toFixed(1)} s (${pct(p50(forkWalls.forkd), p50(forkWalls.e2b))})`,
      target: "E2B within 10%",
      note: forkFailures > 0 ? `${forkFailures} children failed to start` : "every child started",
    },
  ];
  printRows(`bench/e2b on ${hostDescription()}`, rows);
  const measured = { forkd: forkdRuns, e2b: e2bRuns, trips, forkWalls, forkFailures };
  await writeResults(
    "e2b",
    {
      host: hostDescription(),
      tag: TAG,
      n: N,
      parallel: PARALLEL,
      requests: REQUESTS,
      forks: FORKS,
      measured,
    },
    `# bench/e2b\n\n${hostDescription()}, snapshot ${TAG}, ${new Date().toISOString().slice(0, 10)}\n\n${markdownTable(rows)}`,
  );
} finally {
  await server.stop();
}
