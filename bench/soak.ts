/**
 * bench/soak — `npm run test:soak`: a long run against one real daemon that fails if anything grows.
 *   1. SOAK_CYCLES (default 1000) spawn -> exec -> kill cycles, SOAK_CONCURRENCY (default 2) at a time, in
 *      batches; after each batch (nothing in flight) the daemon's open fds, the processes of the home, the
 *      home's disk use and the daemon's RSS are sampled.
 *   2. SOAK_CLIENTS (default 200) concurrent API clients, each its own SDK Controller, each sending
 *      SOAK_REQUESTS (default 20) requests (GET a sandbox, exec `true`) to a pool of SOAK_POOL (default 4)
 *      sandboxes; latency per request, and the same samples before and after.
 * Reports each metric's least-squares slope per 100 cycles and p50/p99 latencies; writes
 * bench/results/soak.{json,md}; exits 1 if a slope exceeds its bound (SLOPE_BOUNDS, documented in
 * docs/reliability.md) or any request failed. Uses the shared test snapshot of the `minimal` template in a home
 * of its own (FORKD_IMAGE_CACHE as for the tests).
 */
import { execFile } from "node:child_process";
import { randomInt } from "node:crypto";
import { readdir, readFile, stat } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { percentile } from "../src/common/stats.js";
import { Controller } from "../src/sdk/index.js";
import { processesMentioning, tempHome } from "../test/support/host.js";
import { linkSharedSnapshot } from "../test/support/snapshots.js";
import { startBenchDaemon } from "./lib/daemon.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const CYCLES = Number(process.env.SOAK_CYCLES ?? 1000);
const CONCURRENCY = Number(process.env.SOAK_CONCURRENCY ?? 2);
const CLIENTS = Number(process.env.SOAK_CLIENTS ?? 200);
const REQUESTS = Number(process.env.SOAK_REQUESTS ?? 20);
const POOL = Number(process.env.SOAK_POOL ?? 4);

/**
 * Largest growth per 100 cycles that still counts as flat. Samples are taken with nothing in flight, so a
 * leak of one fd or one process per cycle shows as 100; the bounds leave room for noise (RSS: V8's heap
 * settling; disk: SQLite's WAL reaching its checkpoint size) and catch a leak of one item per ~50 cycles.
 */
const SLOPE_BOUNDS = { fds: 2, processes: 0.5, disk_mib: 1, rss_mib: 4 } as const;
type Metric = keyof typeof SLOPE_BOUNDS;
type Sample = Record<Metric, number> & { cycles: number; t_s: number; wal_mib: number };
const WAL_FILE = "state.db-wal";

const home = await tempHome("forkd-soak-");
const tag = await linkSharedSnapshot(home.home, "minimal");
const socketPath = path.join(home.home, "daemon.sock");
const daemon = await startBenchDaemon(home.home, socketPath, ["--net-subnet", await freeSubnet()]);
const controller = daemon.controller;
const started = performance.now();
const samples: Sample[] = [];
const sample = async (cycles: number) => {
  samples.push({ cycles, t_s: (performance.now() - started) / 1000, ...(await measure()) });
};

let failures = 0;
const firstErrors: string[] = [];
const failed = (err: unknown) => {
  failures++;
  if (firstErrors.length < 5) firstErrors.push(String(err));
};
const cycleMs: number[] = [];
let clientLatencies: { get: number[]; exec: number[] } = { get: [], exec: [] };
let clientSamples: { before?: Sample; after?: Sample } = {};
try {
  // --- 1. cycles ---
  await sample(0);
  let done = 0;
  while (done < CYCLES) {
    const batch = Math.min(CONCURRENCY, CYCLES - done);
    await Promise.all(
      Array.from({ length: batch }, async () => {
        const t0 = performance.now();
        try {
          const [sb] = await controller.spawnSandboxes({ snapshotTag: tag, n: 1, timeoutMs: 0 });
          const id = (sb as { id: string }).id;
          const ran = await controller.execCommand(id, ["sh", "-c", "echo soak"]);
          if (ran.stdout.toString() !== "soak\n")
            throw new Error(`exec answered ${JSON.stringify(ran.stdout)}`);
          await controller.killSandbox(id);
          cycleMs.push(performance.now() - t0);
        } catch (err) {
          failed(err);
        }
      }),
    );
    done += batch;
    await sample(done);
    if (done % 50 === 0) console.error(`soak: ${done}/${CYCLES} cycles, ${failures} failed`);
  }

  // --- 2. concurrent clients ---
  const pool = (await controller.spawnSandboxes({ snapshotTag: tag, n: POOL, timeoutMs: 0 })).map(
    (s) => s.id,
  );
  clientSamples = { before: { cycles: done, t_s: 0, ...(await measure()) } };
  const latencies = { get: [] as number[], exec: [] as number[] };
  await Promise.all(
    Array.from({ length: CLIENTS }, async (_, client) => {
      const own = new Controller({ url: daemon.url, env: {}, requestTimeoutMs: 600_000 });
      for (let i = 0; i < REQUESTS; i++) {
        const id = pool[(client + i) % pool.length] as string;
        const t0 = performance.now();
        try {
          if (i % 2 === 0) {
            await own.getSandbox(id);
            latencies.get.push(performance.now() - t0);
          } else {
            await own.execCommand(id, ["true"]);
            latencies.exec.push(performance.now() - t0);
          }
        } catch (err) {
          failed(err);
        }
      }
    }),
  );
  clientLatencies = latencies;
  for (const id of pool) await controller.killSandbox(id).catch(failed);
  clientSamples.after = { cycles: done, t_s: 0, ...(await measure()) };
} finally {
  await daemon.stop();
  await home.cleanup();
}

// --- report ---
const slopes = Object.fromEntries(
  (Object.keys(SLOPE_BOUNDS) as Metric[]).map((m) => [m, slopePer100(samples.map((s) => [s.cycles, s[m]]))]),
) as Record<Metric, number>;
const over = (Object.keys(SLOPE_BOUNDS) as Metric[]).filter((m) => slopes[m] > SLOPE_BOUNDS[m]);
const fmt = (n: number) => (Math.abs(n) < 0.01 ? n.toExponential(1) : n.toFixed(2));
const p = (xs: number[], q: number) => (xs.length ? percentile(xs, q).toFixed(1) : "-");
const first = samples[0] as Sample;
const last = samples[samples.length - 1] as Sample;
const rows: Row[] = [
  ...(Object.keys(SLOPE_BOUNDS) as Metric[]).map((m) => ({
    metric: `${m} slope per 100 cycles (${samples.length} samples)`,
    value: fmt(slopes[m]),
    target: `<= ${SLOPE_BOUNDS[m]}`,
    note: `first ${fmt(first[m])}, last ${fmt(last[m])}`,
  })),
  {
    metric: "state database WAL, largest sample (MiB; bounded by SQLite's checkpoint, not in disk_mib)",
    value: fmt(Math.max(...samples.map((s) => s.wal_mib))),
  },
  {
    metric: `cycle (spawn+exec+kill) p50 / p99 ms, ${CONCURRENCY} at a time`,
    value: `${p(cycleMs, 50)} / ${p(cycleMs, 99)}`,
  },
  {
    metric: `${CLIENTS} clients: GET sandbox p50 / p99 ms (${clientLatencies.get.length})`,
    value: `${p(clientLatencies.get, 50)} / ${p(clientLatencies.get, 99)}`,
  },
  {
    metric: `${CLIENTS} clients: exec true p50 / p99 ms (${clientLatencies.exec.length})`,
    value: `${p(clientLatencies.exec, 50)} / ${p(clientLatencies.exec, 99)}`,
  },
  {
    metric: "daemon fds / RSS MiB before -> after the clients",
    value: `${clientSamples.before?.fds} / ${fmt(clientSamples.before?.rss_mib ?? 0)} -> ${clientSamples.after?.fds} / ${fmt(clientSamples.after?.rss_mib ?? 0)}`,
  },
  { metric: "failed cycles or requests", value: String(failures), target: "0", note: firstErrors[0] ?? "" },
];
const title = `soak: ${CYCLES} cycles, ${CLIENTS} clients x ${REQUESTS} requests (${hostDescription()})`;
printRows(title, rows);
await writeResults(
  "soak",
  {
    host: hostDescription(),
    config: { cycles: CYCLES, concurrency: CONCURRENCY, clients: CLIENTS, requests: REQUESTS, pool: POOL },
    bounds_per_100_cycles: SLOPE_BOUNDS,
    slopes_per_100_cycles: slopes,
    cycle_ms: { p50: percentile(cycleMs, 50), p99: percentile(cycleMs, 99), n: cycleMs.length },
    clients: {
      get_ms: clientLatencies.get.length
        ? { p50: percentile(clientLatencies.get, 50), p99: percentile(clientLatencies.get, 99) }
        : null,
      exec_ms: clientLatencies.exec.length
        ? { p50: percentile(clientLatencies.exec, 50), p99: percentile(clientLatencies.exec, 99) }
        : null,
      before: clientSamples.before,
      after: clientSamples.after,
    },
    failures,
    first_errors: firstErrors,
    samples,
  },
  `# ${title}\n\n${markdownTable(rows)}\n`,
);
if (over.length > 0 || failures > 0) {
  console.error(
    `soak FAILED: ${over.map((m) => `${m} grows ${fmt(slopes[m])}/100 cycles`).join(", ")}${failures ? ` ${failures} failures` : ""}`,
  );
  process.exit(1);
}

// --- helpers ---

async function measure(): Promise<Record<Metric, number> & { wal_mib: number }> {
  const status = await readFile(`/proc/${daemon.pid}/status`, "utf8");
  const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return {
    fds: (await readdir(`/proc/${daemon.pid}/fd`)).length,
    // Every process started for this home (QEMUs, helpers) plus the daemon's own threads' leader.
    processes: (await processesMentioning(home.home)).length,
    disk_mib: (await diskBytes(home.home)) / 2 ** 20,
    rss_mib: rssKiB / 1024,
    wal_mib: await walMiB(),
  };
}

/**
 * Allocated bytes under `dir` (hard links to shared snapshot files count once per link, as du -l would), without
 * the state database's write-ahead log: SQLite grows it to its checkpoint size (about 4 MiB) and then reuses it,
 * which over a short run reads as growth (seen: +3.9 MiB over the first 50 cycles, flat after). Its size is
 * reported on its own (wal_mib).
 */
async function diskBytes(dir: string): Promise<number> {
  let total = 0;
  for (const name of await readdir(dir, { recursive: true }).catch(() => [] as string[])) {
    if (String(name) === WAL_FILE) continue;
    const st = await stat(path.join(dir, String(name))).catch(() => null);
    if (st?.isFile()) total += st.blocks * 512;
  }
  return total;
}

async function walMiB(): Promise<number> {
  const st = await stat(path.join(home.home, WAL_FILE)).catch(() => null);
  return st ? (st.blocks * 512) / 2 ** 20 : 0;
}

/** Least-squares slope of y over x, scaled to 100 x. */
function slopePer100(points: [number, number][]): number {
  const n = points.length;
  if (n < 2) return 0;
  const mx = points.reduce((a, [x]) => a + x, 0) / n;
  const my = points.reduce((a, [, y]) => a + y, 0) / n;
  let num = 0;
  let den = 0;
  for (const [x, y] of points) {
    num += (x - mx) * (y - my);
    den += (x - mx) ** 2;
  }
  return den === 0 ? 0 : (num / den) * 100;
}

/** A /20 no route of this host uses (the home's hashed default can collide with another test home's bridge). */
async function freeSubnet(): Promise<string> {
  const { stdout } = await promisify(execFile)("ip", ["-4", "route"]);
  for (;;) {
    const candidate = `10.${200 + randomInt(50)}.${randomInt(16) * 16}.0/20`;
    if (!stdout.includes(candidate)) return candidate;
  }
}
