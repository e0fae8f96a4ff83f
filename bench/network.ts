/**
 * bench/network: what sandbox networking costs, side by side in one run.
 *   - spawn N=50 children with a network of their own (namespace, veth, tap, rules, DNS registration), made by
 *     forkd-netd (netlink, the default) and by the ip/nft tools (FORKD_NET_BACKEND=tools), vs N=50 children of
 *     the same template snapshotted without a NIC: wall clock of the spawn and host CPU per child (the
 *     children's QEMUs until ready, the daemon, forkd-netd, and every ip/nft/launcher process they ran), and the
 *     host CPU of killing them, in rotating rounds;
 *   - guest -> test host: download throughput and HTTP request latency (a new connection per request), measured
 *     in the guest against the tests' own "internet" namespace;
 *   - the port proxy: round trip of a 1-byte HTTP response from a server in the sandbox, through the daemon's
 *     route over its Unix socket, and straight to the namespace address (what the proxy adds).
 *
 *   - the networks alone, without VMs: creating and removing N, 8 at a time, by either backend (rotating).
 *
 *   npm run bench -- network   (env: BENCH_N=50, BENCH_ROUNDS=2, BENCH_WARMUP=1, BENCH_REQUESTS=50,
 *   BENCH_DOWNLOAD_MIB=32)
 */

import { randomBytes } from "node:crypto";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { type RunningDaemon, startDaemon } from "../src/api/daemon.js";
import { resolvePaths } from "../src/common/paths.js";
import { percentile } from "../src/common/stats.js";
import type { SandboxInfo } from "../src/controller/sandbox-service.js";
import { openServices } from "../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../src/controller/snapshots/create.js";
import { listSnapshots } from "../src/controller/snapshots/list.js";
import { resolveNetworkConfig } from "../src/net/config.js";
import { cidrSize, fromUint32, toUint32 } from "../src/net/ipv4.js";
import { createSandboxNetwork, removeSandboxNetwork } from "../src/net/namespace.js";
import { compilePolicy, parseEgressPolicy } from "../src/net/policy.js";
import { INTERNET_HOSTS, startTestInternet } from "../test/support/test-internet.js";
import { envNumber } from "./lib/env.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";
import { measureSpawn, ownCpuMs } from "./lib/spawn-cost.js";

const N = envNumber("BENCH_N", 50);
const ROUNDS = envNumber("BENCH_ROUNDS", 2);
const REQUESTS = envNumber("BENCH_REQUESTS", 50);
const DOWNLOAD_MIB = envNumber("BENCH_DOWNLOAD_MIB", 32);
const WARMUP = process.env.BENCH_WARMUP !== "0";
const WITH_NIC = process.env.BENCH_TAG ?? "pyagent";
const WITHOUT_NIC = `${WITH_NIC}-nonet`;

const SIDES = ["none", "tools", "netd"] as const;
type Side = (typeof SIDES)[number];
interface SpawnRun {
  side: Side;
  wallMs: number;
  cpuPerChildMs: number;
  /** Host CPU per child of killing them all (QEMU's exit, the network's removal). */
  teardownCpuPerChildMs: number;
}

const paths = resolvePaths();
const existing = new Set((await listSnapshots(paths)).map((s) => s.tag));
for (const [tag, network] of [
  [WITH_NIC, true],
  [WITHOUT_NIC, false],
] as const) {
  if (!existing.has(tag)) {
    console.log(`creating snapshot ${tag} (${network ? "with" : "without"} a NIC, one-time)...`);
    await createSnapshot(paths, { tag, template: "pyagent", network });
  }
}

const loadBefore = os.loadavg().map(round1);
const internet = await startTestInternet();
const services = await openServices(paths, {
  network: { network: { dnsUpstreams: [internet.dns] }, defaultEgress: "allow" },
});
let daemon: RunningDaemon | undefined;
try {
  // --- spawn N without a network, with one made by the ip/nft tools, with one made by forkd-netd; rotating ---
  const spawnRuns: SpawnRun[] = [];
  // One unrecorded round first: the first spawns of a run pay for cold page caches.
  for (const side of SIDES) if (WARMUP) await spawnRun(side);
  for (let round = 0; round < ROUNDS; round++) {
    const order = SIDES.map((_, i) => SIDES[(i + round) % SIDES.length] as Side);
    for (const side of order) spawnRuns.push(await spawnRun(side));
  }
  const withoutNet = summary(spawnRuns, "none");
  const withTools = summary(spawnRuns, "tools");
  const withNet = summary(spawnRuns, "netd");
  process.env.FORKD_NET_BACKEND = "netd";

  // --- the networks alone (no VM): create + remove, 8 at a time as the daemon does, rotating backends ---
  const objectRuns: ObjectRun[] = [];
  for (let round = 0; round < ROUNDS * 2; round++)
    for (const backend of round % 2 === 0 ? (["tools", "netd"] as const) : (["netd", "tools"] as const))
      objectRuns.push(await networksAlone(backend));
  const objects = (backend: "tools" | "netd") => {
    const mine = objectRuns.filter((r) => r.backend === backend);
    const mean = (f: (r: ObjectRun) => number) => round1(mine.reduce((s, r) => s + f(r), 0) / mine.length);
    return {
      create_cpu_ms: mean((r) => r.createCpuMs),
      remove_cpu_ms: mean((r) => r.removeCpuMs),
      create_wall_ms: mean((r) => r.createWallMs),
    };
  };
  const toolsObjects = objects("tools");
  const netdObjects = objects("netd");

  // --- guest -> test host ---
  const [sb] = await services.sandboxes.spawn({ snapshotTag: WITH_NIC, n: 1, timeoutMs: 0 });
  const id = (sb as SandboxInfo).id;
  const probe = await evalJson<{ mibPerS: number; latencies: number[] }>(
    id,
    `
import json, time, urllib.request
t = time.perf_counter(); n = 0
with urllib.request.urlopen("http://${INTERNET_HOSTS.other}/bytes/${DOWNLOAD_MIB * 1024 * 1024}", timeout=600) as r:
    while True:
        b = r.read(1 << 16)
        if not b: break
        n += len(b)
mib_per_s = n / (1 << 20) / (time.perf_counter() - t)
lat = []
for i in range(${REQUESTS}):
    t = time.perf_counter(); urllib.request.urlopen("http://${INTERNET_HOSTS.other}/r", timeout=60).read(); lat.append((time.perf_counter() - t) * 1000)
print(json.dumps({"mibPerS": mib_per_s, "latencies": lat}))
`,
  );

  // --- the port proxy: a 1-byte response from a server in the sandbox ---
  await services.sandboxes.files.write(id, "/tmp/one/b", Buffer.from("x"));
  await services.sandboxes.exec(id, [
    "sh",
    "-c",
    "setsid -f python3 -m http.server 8080 -d /tmp/one >/dev/null 2>&1 </dev/null",
  ]);
  const socketPath = path.join(paths.home, "bench-network.sock");
  daemon = await startDaemon(
    { socketPath, auditLog: null, snapshotsDir: paths.snapshots },
    { ...services, close: async () => {} },
  );
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const viaProxy = { socketPath, path: `/v1/sandboxes/${id}/ports/8080/b`, agent };
  const direct = { host: (sb as SandboxInfo).network.address as string, port: 8080, path: "/b", agent };
  await waitForAnswer(viaProxy);
  const proxyMs = await roundTrips(viaProxy, REQUESTS);
  const directMs = await roundTrips(direct, REQUESTS);
  agent.destroy();

  const cpuOverhead = (withNet.cpuPerChildMs / withoutNet.cpuPerChildMs - 1) * 100;
  const wallOverhead = (withNet.wallMs / withoutNet.wallMs - 1) * 100;
  const toolsCpuOverhead = (withTools.cpuPerChildMs / withoutNet.cpuPerChildMs - 1) * 100;
  const toolsWallOverhead = (withTools.wallMs / withoutNet.wallMs - 1) * 100;
  const result = {
    host: hostDescription(),
    accelerator: (sb as SandboxInfo).accelerator,
    n: N,
    rounds: ROUNDS,
    spawn_runs: spawnRuns,
    networks_alone: { n: N, concurrency: 8, runs: objectRuns, tools: toolsObjects, netd: netdObjects },
    load_before: loadBefore,
    load_after: os.loadavg().map(round1),
    spawn_with_network: rounded(withNet),
    spawn_with_network_by_tools: rounded(withTools),
    spawn_without_network: rounded(withoutNet),
    network_cpu_overhead_pct: round1(cpuOverhead),
    network_wall_overhead_pct: round1(wallOverhead),
    tools_network_cpu_overhead_pct: round1(toolsCpuOverhead),
    tools_network_wall_overhead_pct: round1(toolsWallOverhead),
    download_mib_per_s: round1(probe.mibPerS),
    download_mib: DOWNLOAD_MIB,
    request_latency_ms: {
      p50: round1(percentile(probe.latencies, 50)),
      p99: round1(percentile(probe.latencies, 99)),
    },
    proxy_round_trip_ms: { p50: round1(percentile(proxyMs, 50)), p99: round1(percentile(proxyMs, 99)) },
    direct_round_trip_ms: { p50: round1(percentile(directMs, 50)), p99: round1(percentile(directMs, 99)) },
    measured_at: new Date().toISOString(),
  };
  const rows: Row[] = [
    { metric: "accelerator", value: result.accelerator },
    {
      metric: `spawn N=${N}, wall: without network / ip+nft tools / forkd-netd`,
      value: `${Math.round(withoutNet.wallMs)} / ${Math.round(withTools.wallMs)} / ${Math.round(withNet.wallMs)} ms`,
      note: `tools ${pct(toolsWallOverhead)}, forkd-netd ${pct(wallOverhead)}`,
    },
    {
      metric: "host CPU per child: without network / ip+nft tools / forkd-netd",
      value: `${round1(withoutNet.cpuPerChildMs)} / ${round1(withTools.cpuPerChildMs)} / ${round1(withNet.cpuPerChildMs)} ms`,
      target: "< +10%",
      note: `tools ${pct(toolsCpuOverhead)}, forkd-netd ${pct(cpuOverhead)}`,
    },
    {
      metric: "host CPU per child to kill them: without network / tools / forkd-netd",
      value: `${round1(withoutNet.teardownCpuPerChildMs)} / ${round1(withTools.teardownCpuPerChildMs)} / ${round1(withNet.teardownCpuPerChildMs)} ms`,
    },
    {
      metric: `a network alone (no VM), host CPU to create / remove, tools -> forkd-netd (${ROUNDS * 2} x ${N} each)`,
      value: `${toolsObjects.create_cpu_ms} / ${toolsObjects.remove_cpu_ms} -> ${netdObjects.create_cpu_ms} / ${netdObjects.remove_cpu_ms} ms`,
      note: `wall per network, 8 at a time: ${toolsObjects.create_wall_ms} -> ${netdObjects.create_wall_ms} ms`,
    },
    {
      metric: `guest -> test host download (${DOWNLOAD_MIB} MiB)`,
      value: `${result.download_mib_per_s} MiB/s`,
    },
    {
      metric: `guest -> test host HTTP request, new connection (n=${REQUESTS})`,
      value: `p50 ${result.request_latency_ms.p50} / p99 ${result.request_latency_ms.p99} ms`,
    },
    {
      metric: `1-byte response through the port proxy (n=${REQUESTS})`,
      value: `p50 ${result.proxy_round_trip_ms.p50} / p99 ${result.proxy_round_trip_ms.p99} ms`,
      note: `straight to the namespace: p50 ${result.direct_round_trip_ms.p50} / p99 ${result.direct_round_trip_ms.p99} ms`,
    },
  ];
  printRows(`bench/network on ${result.host}`, rows);
  await writeResults(
    "network",
    result,
    `# bench/network\n\n${result.measured_at} on ${result.host}; guest 512 MiB pyagent; ${ROUNDS} rotating rounds of N=${N} per side (no network, the ip/nft tools, forkd-netd: FORKD_NET_BACKEND); load average ${loadBefore.join(" ")} before, ${result.load_after.join(" ")} after (a shared host)\n\n${markdownTable(rows)}`,
  );
} finally {
  await daemon?.stop("bench over");
  await services.close({ killSandboxes: true });
  await internet.stop();
}

interface ObjectRun {
  backend: "tools" | "netd";
  createCpuMs: number;
  removeCpuMs: number;
  createWallMs: number;
}

/** Creates N networks (8 at a time) and removes them; host CPU per network of each half (this process, its tools, forkd-netd). */
async function networksAlone(backend: "tools" | "netd"): Promise<ObjectRun> {
  process.env.FORKD_NET_BACKEND = backend;
  const config = resolveNetworkConfig({}, process.env, paths.home);
  const policy = compilePolicy(parseEgressPolicy({ default: "allow" }));
  // Addresses from the top of the home's subnet (no sandbox runs now), ids no sandbox has.
  const top = toUint32(config.subnet.address) + cidrSize(config.subnet) - 2;
  const specs = Array.from({ length: N }, (_, i) => ({
    sandboxId: `sb-${randomBytes(6).toString("hex")}`,
    address: fromUint32(top - i),
    config,
    policy,
    generation: 1,
  }));
  const inBatches = async (f: (spec: (typeof specs)[number]) => Promise<unknown>) => {
    for (let i = 0; i < specs.length; i += 8) await Promise.all(specs.slice(i, i + 8).map(f));
  };
  const cpu0 = await ownCpuMs();
  const started = performance.now();
  await inBatches(createSandboxNetwork);
  const createWallMs = (performance.now() - started) / N;
  const cpu1 = await ownCpuMs();
  await inBatches((spec) => removeSandboxNetwork(spec.sandboxId));
  const cpu2 = await ownCpuMs();
  return { backend, createCpuMs: (cpu1 - cpu0) / N, removeCpuMs: (cpu2 - cpu1) / N, createWallMs };
}

async function spawnRun(side: Side): Promise<SpawnRun> {
  if (side !== "none") process.env.FORKD_NET_BACKEND = side;
  const spawned = await measureSpawn(services, side === "none" ? WITHOUT_NIC : WITH_NIC, N);
  const before = await ownCpuMs();
  await services.sandboxes.killAll();
  const teardownCpuPerChildMs = ((await ownCpuMs()) - before) / N;
  return { side, ...spawned, teardownCpuPerChildMs };
}

function summary(runs: readonly SpawnRun[], side: Side) {
  const mine = runs.filter((r) => r.side === side);
  const mean = (f: (r: SpawnRun) => number) => mine.reduce((s, r) => s + f(r), 0) / mine.length;
  return {
    wallMs: mean((r) => r.wallMs),
    cpuPerChildMs: mean((r) => r.cpuPerChildMs),
    teardownCpuPerChildMs: mean((r) => r.teardownCpuPerChildMs),
  };
}

function rounded(s: ReturnType<typeof summary>) {
  return {
    wall_ms: Math.round(s.wallMs),
    cpu_ms_per_child: round1(s.cpuPerChildMs),
    teardown_cpu_ms_per_child: round1(s.teardownCpuPerChildMs),
  };
}

function pct(n: number): string {
  return `${n >= 0 ? "+" : ""}${round1(n)}%`;
}

async function evalJson<T>(id: string, code: string): Promise<T> {
  const out = await services.sandboxes.eval(id, code, { timeoutMs: 900_000 });
  if (out.error) throw new Error(`${out.error.type}: ${out.error.message}`);
  return JSON.parse(out.stdout.trim()) as T;
}

function get(options: http.RequestOptions): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.get(options, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
  });
}

async function waitForAnswer(options: http.RequestOptions): Promise<void> {
  const deadline = Date.now() + 60_000;
  while ((await get(options).catch(() => 0)) !== 200) {
    if (Date.now() > deadline) throw new Error("the sandbox's HTTP server did not come up");
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function roundTrips(options: http.RequestOptions, n: number): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    if ((await get(options)) !== 200) throw new Error("the proxied request failed");
    samples.push(performance.now() - started);
  }
  return samples;
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
