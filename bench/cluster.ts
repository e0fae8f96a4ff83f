/**
 * bench/cluster: what the cluster costs a user, side by side in one run on a local cluster
 * (scripts/local-cluster.sh up --nodes 2 --gateways 1): create + first exec through the gateway vs the same
 * node directly (its front, with the node token), p50/p99, alternating, with the gateway's own share of each
 * create and exec (its Server-Timing header: its time apart from the wait on the node); a spawn that needs a pull (a snapshot
 * published from node-0, node-0 cordoned) vs a spawn of the same snapshot once held; the time a kill -9'd node
 * takes to be answered "lost"; where the gateway's share goes (create and first exec timed apart, and a call
 * without guest work, GET /v1/sandboxes/<id>, at the node, at the gateway replica and through the Service's
 * stand-in); a fork the source's node has room for vs one that spans nodes (the nodes take 2 sandboxes each).
 * Writes bench/results/cluster.{json,md}.
 */
import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { KubeConfig } from "@kubernetes/client-node";
import { CLUSTER_HEADERS, NODE_ROUTES, type PushAnswer } from "../src/cluster/protocol.js";
import { packageRoot } from "../src/common/package-root.js";
import { percentile } from "../src/common/stats.js";
import { forkdObjects } from "../src/kube/objects.js";
import {
  type ClusterState,
  listForkdNodes,
  loadState,
  NAMESPACE,
  startNode,
} from "../src/local-cluster/cluster.js";
import { signalRecorded } from "../src/local-cluster/processes.js";
import { Controller } from "../src/sdk/index.js";
import { envNumber } from "./lib/env.js";
import { mean, median, medianInterval, signs, stdev } from "./lib/paired.js";
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const run = promisify(execFile);
const ROUNDS = envNumber("BENCH_ROUNDS", 40);
const RECORD_ROUNDS = 100;
const SCRIPT = path.join(packageRoot(), "scripts", "local-cluster.sh");
const seedHome = process.env.BENCH_SEED_HOME;

const loadAtStart = os.loadavg();
const startedAt = new Date().toISOString();
const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-bench-cluster-"));
const clusterDir = path.join(dir, "cluster");
const upStarted = performance.now();
await run(
  SCRIPT,
  [
    "up",
    "--nodes",
    "2",
    "--gateways",
    "1",
    "--dir",
    clusterDir,
    "--node-max-sandboxes",
    "2",
    ...(seedHome ? ["--seed-home", seedHome] : []),
  ],
  { encoding: "utf8", maxBuffer: 1 << 24 },
);
const upMs = performance.now() - upStarted;
const state = (await loadState(clusterDir)) as ClusterState;
const kube = new KubeConfig();
kube.loadFromFile(state.adminKubeconfig);
const objects = forkdObjects(kube, NAMESPACE);
const [node0, node1] = state.nodes as [ClusterState["nodes"][number], ClusterState["nodes"][number]];
const epochOf = async (name: string) =>
  String((await listForkdNodes(kube)).find((n) => n.metadata.name === name)?.spec.epoch ?? 0);
const nodeHeaders = async (name: string) => ({
  [CLUSTER_HEADERS.token]: state.tokens.node as string,
  [CLUSTER_HEADERS.epoch]: await epochOf(name),
});

const gateway = new Controller({ url: state.url, token: state.tokens.admin, env: {} });
const direct = new Controller({ url: node0.url, headers: await nodeHeaders(node0.name), env: {} });

const replica = new Controller({ url: state.gateways[0]?.url, token: state.tokens.admin, env: {} });

interface CreateAndExec {
  ms: number;
  createMs: number;
  ok: boolean;
  /** The gateway's own ms in the create and in the exec, by its Server-Timing header (undefined: direct). */
  gatewayCreateMs?: number;
  gatewayExecMs?: number;
}

/** `gateway;dur=<ms>` of a Server-Timing header. */
function gatewayShare(headers: Record<string, string | string[] | undefined>): number | undefined {
  const match = /(?:^|,)\s*gateway;dur=([\d.]+)/.exec(String(headers["server-timing"] ?? ""));
  return match ? Number(match[1]) : undefined;
}

/** A create and a first exec as the SDK sends them, read whole so the answers' headers are seen. */
async function createAndExec(c: Controller): Promise<CreateAndExec> {
  const t0 = performance.now();
  const created = await c.send({ method: "POST", path: "/v1/sandboxes", json: { snapshot_tag: "pyagent" } });
  const createMs = performance.now() - t0;
  const [kid] = JSON.parse(created.body.toString("utf8")) as { id: string }[];
  const exec = await c.send({
    method: "POST",
    path: `/v1/sandboxes/${kid?.id}/exec`,
    json: { args: ["echo", "ok"], timeout_ms: 60_000 },
    deadlineMs: 120_000,
  });
  const ms = performance.now() - t0;
  await c.killSandbox(kid?.id as string);
  const stdout = (JSON.parse(exec.body.toString("utf8")) as { stdout: string }).stdout;
  return {
    ms,
    createMs,
    ok: stdout.trim() === "ok",
    gatewayCreateMs: gatewayShare(created.headers),
    gatewayExecMs: gatewayShare(exec.headers),
  };
}

/** A call with no guest work (the sandbox's record), `n` times on each path, alternating: what a hop costs. */
async function recordCalls(id: string, n: number) {
  const paths: [string, Controller][] = [
    ["direct", direct],
    ["replica", replica],
    ["gateway", gateway],
  ];
  const ms: Record<string, number[]> = { direct: [], replica: [], gateway: [] };
  for (let i = 0; i < n; i++) {
    for (const [name, c] of i % 2 === 0 ? paths : [...paths].reverse()) {
      const t = performance.now();
      await c.getSandbox(id);
      ms[name]?.push(performance.now() - t);
    }
  }
  return ms as { direct: number[]; replica: number[]; gateway: number[] };
}

interface ForkTimed {
  ms: number;
  nodes: string[];
  ids: string[];
}

/** A fork of `count` through the gateway: its time and where the children ran. */
async function forkThroughGateway(id: string, count: number): Promise<ForkTimed> {
  const t0 = performance.now();
  const answer = await fetch(`${state.url}/v1/sandboxes/${id}/fork`, {
    method: "POST",
    headers: { authorization: `Bearer ${state.tokens.admin}`, "content-type": "application/json" },
    body: JSON.stringify({ count }),
  });
  const ms = performance.now() - t0;
  const body = (await answer.json()) as { children?: { sandbox: { id: string; node: string } | null }[] };
  if (answer.status !== 200) throw new Error(`fork of ${count}: ${answer.status} ${JSON.stringify(body)}`);
  const kids = (body.children ?? []).flatMap((c) => (c.sandbox ? [c.sandbox] : []));
  if (kids.length !== count) throw new Error(`fork of ${count}: ${JSON.stringify(body)}`);
  return { ms, nodes: kids.map((k) => k.node), ids: kids.map((k) => k.id) };
}

/** Waits until the nodes' statuses (written at most every 3 s) show what changed. */
const statusSettles = () => new Promise((r) => setTimeout(r, 4_000));

type PathName = "gateway" | "direct";

/**
 * `rounds` rounds, each a create + first exec directly and one through the gateway back to back on node-0 (the
 * only node that takes spawns then), in ABBA order (gateway first in even rounds): each round's pair boots the
 * same snapshot on the same host state, and its difference is what the pairing measures. Both sandboxes are
 * killed within the round, so the node's 2 sandboxes are never the limit.
 */
async function pairedRounds(rounds: number) {
  const times = { gateway: [] as number[], direct: [] as number[] };
  const createTimes = { gateway: [] as number[], direct: [] as number[] };
  const gatewayOwn = { create: [] as number[], exec: [] as number[] };
  const order: PathName[] = [];
  let wrong = 0;
  for (let i = 0; i < rounds; i++) {
    const first: PathName = i % 2 === 0 ? "gateway" : "direct";
    order.push(first);
    for (const name of (first === "gateway" ? ["gateway", "direct"] : ["direct", "gateway"]) as PathName[]) {
      const r = await createAndExec(name === "gateway" ? gateway : direct);
      times[name].push(r.ms);
      createTimes[name].push(r.createMs);
      if (r.gatewayCreateMs !== undefined) gatewayOwn.create.push(r.gatewayCreateMs);
      if (r.gatewayExecMs !== undefined) gatewayOwn.exec.push(r.gatewayExecMs);
      if (!r.ok) wrong++;
    }
  }
  return { times, createTimes, gatewayOwn, wrong, order };
}

/** The per-round differences (gateway - direct) and what they say, over all rounds and by which went first. */
function pairedSummary(times: Record<PathName, number[]>, order: PathName[]) {
  const diffs = times.gateway.map((g, i) => g - (times.direct[i] as number));
  const directMedian = median(times.direct);
  const interval = medianInterval(diffs);
  const byFirst = (first: PathName) => median(diffs.filter((_, i) => order[i] === first));
  return {
    diffs,
    medianDiff: median(diffs),
    medianRatio: median(diffs) / directMedian,
    interval,
    intervalRatio: interval && { low: interval.low / directMedian, high: interval.high / directMedian },
    meanDiff: mean(diffs),
    sdDiff: stdev(diffs),
    signs: signs(diffs),
    medianDiffGatewayFirst: byFirst("gateway"),
    medianDiffDirectFirst: byFirst("direct"),
    directMedian,
  };
}

/** The < 10 % target by the paired median, and whether its interval's upper end is under 10 % too. */
function targetVerdict(p: ReturnType<typeof pairedSummary>): string {
  const byMedian = p.medianRatio < 0.1 ? "met by the paired median" : "not met by the paired median";
  if (!p.intervalRatio) return `${byMedian} (too few rounds for an interval)`;
  return `${byMedian}; the interval's upper end is ${p.intervalRatio.high < 0.1 ? "under" : "not under"} 10 %`;
}

const pct = (v: number) => `${v >= 0 ? "+" : ""}${(v * 100).toFixed(1)} %`;
const signed = (v: number) => `${v >= 0 ? "+" : ""}${Math.round(v)} ms`;

const p50 = (v: number[]) => percentile(v, 50);
const p99 = (v: number[]) => percentile(v, 99);
const fmt = (v: number) => `${Math.round(v)} ms`;
const ms1 = (v: number) => `${v.toFixed(1)} ms`;

try {
  // Only node-0 takes spawns through the gateway, so both paths reach the same node.
  await objects.nodes.patchSpec(node1.name, { unschedulable: true });
  await new Promise((r) => setTimeout(r, 3_000));
  // The first spawn on a node pays one-time costs (its network, page cache), and the gateway's first relay its
  // connection to the node: one of each, not counted.
  await createAndExec(direct);
  await createAndExec(gateway);
  const { times, createTimes, gatewayOwn, wrong, order } = await pairedRounds(ROUNDS);
  const paired = pairedSummary(times, order);
  const overhead = (p50(times.gateway) - p50(times.direct)) / p50(times.direct);
  const [recorded] = await direct.spawnSandboxes({ snapshotTag: "pyagent" });
  const records = await recordCalls(recorded?.id as string, RECORD_ROUNDS);
  await direct.killSandbox(recorded?.id as string);

  // Pull + spawn vs a spawn of what is held: a BRANCH of node-0 published, node-0 cordoned.
  const [source] = await direct.spawnSandboxes({ snapshotTag: "pyagent" });
  const branch = (await direct.branchSandbox(source?.id as string)) as unknown as { tag: string };
  await direct.killSandbox(source?.id as string);
  const reference = `${state.registry}/forkd/bench-branch:v1`;
  const pushed = await fetch(`${node0.url}${NODE_ROUTES.push}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(await nodeHeaders(node0.name)) },
    body: JSON.stringify({ tag: branch.tag, reference, insecure: true }),
  });
  if (!pushed.ok) throw new Error(`push: ${pushed.status} ${await pushed.text()}`);
  const { digest } = (await pushed.json()) as PushAnswer;
  await objects.snapshots.create("bench-branch", { reference, digest, prepull: 0 });
  await objects.nodes.patchSpec(node1.name, { unschedulable: false });
  await objects.nodes.patchSpec(node0.name, { unschedulable: true });
  await new Promise((r) => setTimeout(r, 3_000));
  // node-1's first spawn pays its one-time costs: not counted in either number.
  const warm = await gateway.spawnSandboxes({ snapshotTag: "pyagent" });
  await gateway.killSandbox(warm[0]?.id as string);
  let t0 = performance.now();
  const [pulledKid] = (await gateway.spawnSandboxes({ snapshotTag: "bench-branch" })) as unknown as {
    id: string;
    node?: string;
  }[];
  const pullSpawnMs = performance.now() - t0;
  await gateway.killSandbox(pulledKid?.id as string);
  t0 = performance.now();
  const [heldKid] = (await gateway.spawnSandboxes({ snapshotTag: "bench-branch" })) as unknown as {
    id: string;
    node?: string;
  }[];
  const heldSpawnMs = performance.now() - t0;
  await gateway.killSandbox(heldKid?.id as string);
  await objects.nodes.patchSpec(node0.name, { unschedulable: false });

  // Fork: node-0 holds the source and has room for one more: a fork of 1 stays there, a fork of 2 spans nodes
  // (BRANCH, push of the diff layer, node-1 pulls it, both restore).
  const [forkSource] = await direct.spawnSandboxes({ snapshotTag: "pyagent" });
  await statusSettles();
  const localFork = await forkThroughGateway(forkSource?.id as string, 1);
  for (const id of localFork.ids) await gateway.killSandbox(id);
  await statusSettles();
  const crossFork = await forkThroughGateway(forkSource?.id as string, 2);
  for (const id of [...crossFork.ids, forkSource?.id as string]) await gateway.killSandbox(id);
  await statusSettles();

  // Detection: kill -9 node-1 with a sandbox on it; poll a call for it through the gateway.
  await objects.nodes.patchSpec(node0.name, { unschedulable: true });
  await new Promise((r) => setTimeout(r, 3_000));
  const [victimKid] = await gateway.spawnSandboxes({ snapshotTag: "pyagent" });
  await objects.nodes.patchSpec(node0.name, { unschedulable: false });
  const killedAt = performance.now();
  await signalRecorded(node1.process as NonNullable<typeof node1.process>, "SIGKILL");
  let slowestCallMs = 0;
  let detectionMs = Number.NaN;
  while (performance.now() - killedAt < 90_000) {
    const t = performance.now();
    const err = await gateway.getSandbox(victimKid?.id as string).then(
      () => undefined,
      (e: Error) => e,
    );
    slowestCallMs = Math.max(slowestCallMs, performance.now() - t);
    if (err && /lost/.test(err.message)) {
      detectionMs = performance.now() - killedAt;
      break;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  // Back, so down stops it (it is fenced and kills the sandbox it no longer owns).
  await startNode(state, node1);

  const loadAtEnd = os.loadavg();
  const rows: Row[] = [
    {
      metric: `create + first exec p50 / p99 / mean, ${ROUNDS} paired rounds (ABBA): node directly`,
      value: `${fmt(p50(times.direct))} / ${fmt(p99(times.direct))} / ${fmt(mean(times.direct))}`,
      note: `sd ${fmt(stdev(times.direct))}`,
    },
    {
      metric: "  through the gateway (Service stand-in, 1 replica), same node",
      value: `${fmt(p50(times.gateway))} / ${fmt(p99(times.gateway))} / ${fmt(mean(times.gateway))}`,
      note: `sd ${fmt(stdev(times.gateway))}; p50s ${pct(overhead)}, means ${pct(mean(times.gateway) / mean(times.direct) - 1)}${wrong ? `; ${wrong} wrong answers` : ""}`,
    },
    {
      metric: "  paired: median of the rounds' (gateway - direct), its 95 % interval (sign test)",
      value: `${signed(paired.medianDiff)} [${paired.interval ? `${signed(paired.interval.low)}, ${signed(paired.interval.high)}` : "n too small"}]`,
      target: "< 10 % of direct's median",
      note: `${pct(paired.medianRatio)} of direct's median ${fmt(paired.directMedian)}${paired.intervalRatio ? ` [${pct(paired.intervalRatio.low)}, ${pct(paired.intervalRatio.high)}], coverage ${((paired.interval?.coverage ?? 0) * 100).toFixed(1)} %` : ""}; ${targetVerdict(paired)}`,
    },
    {
      metric: "  paired: mean difference ± sd; rounds the gateway was slower / faster",
      value: `${signed(paired.meanDiff)} ± ${fmt(paired.sdDiff)}`,
      note: `${paired.signs.above} / ${paired.signs.below}; median difference with the gateway first ${signed(paired.medianDiffGatewayFirst)}, with direct first ${signed(paired.medianDiffDirectFirst)}`,
    },
    {
      metric: "  of which the create alone, node directly / through the gateway (p50)",
      value: `${fmt(p50(createTimes.direct))} / ${fmt(p50(createTimes.gateway))}`,
      note: `exec alone: ${fmt(p50(times.direct) - p50(createTimes.direct))} / ${fmt(p50(times.gateway) - p50(createTimes.gateway))} (p50 differences)`,
    },
    {
      metric: "  the gateway's own time in them (its Server-Timing), create / exec, p50 / p99",
      value: `${ms1(p50(gatewayOwn.create))} / ${ms1(p99(gatewayOwn.create))}, ${ms1(p50(gatewayOwn.exec))} / ${ms1(p99(gatewayOwn.exec))}`,
      note: `${(((p50(gatewayOwn.create) + p50(gatewayOwn.exec)) / p50(times.direct)) * 100).toFixed(1)} % of direct's p50: the rest of the difference is the hops and the guest's spread`,
    },
    {
      metric: `GET /v1/sandboxes/<id> p50 / p99, ${RECORD_ROUNDS} each, alternating: node directly`,
      value: `${ms1(p50(records.direct))} / ${ms1(p99(records.direct))}`,
    },
    {
      metric: "  at the gateway replica (no Service stand-in)",
      value: `${ms1(p50(records.replica))} / ${ms1(p99(records.replica))}`,
      note: `+${ms1(p50(records.replica) - p50(records.direct))} p50: the gateway's relay`,
    },
    {
      metric: "  through the Service stand-in (TCP balancer) and the replica",
      value: `${ms1(p50(records.gateway))} / ${ms1(p99(records.gateway))}`,
      note: `+${ms1(p50(records.gateway) - p50(records.replica))} p50: the balancer's hop`,
    },
    {
      metric: "fork through the gateway: of 1, on the source's node / of 2, across nodes",
      value: `${fmt(localFork.ms)} / ${fmt(crossFork.ms)}`,
      note: `children on ${localFork.nodes.join(", ")} / ${crossFork.nodes.join(", ")}; across = BRANCH + push of its layer + a pull on the other node + both restores`,
    },
    {
      metric: "spawn that pulls a BRANCH first (registry on the node network) / spawn of it once held",
      value: `${fmt(pullSpawnMs)} / ${fmt(heldSpawnMs)}`,
      note: `${(pullSpawnMs / heldSpawnMs).toFixed(1)} x; node-1 already held the branch's base (pyagent)`,
    },
    {
      metric: "kill -9 of a node daemon until its sandbox answers lost",
      value: fmt(detectionMs),
      note: `Lease 15 s; slowest call meanwhile ${fmt(slowestCallMs)}`,
    },
    { metric: "local-cluster.sh up --nodes 2 --gateways 1", value: `${(upMs / 1000).toFixed(0)} s` },
    {
      metric: "load average (1 / 5 / 15 min) at the start / at the end",
      value: `${loadAtStart.map((l) => l.toFixed(1)).join(" / ")}; ${loadAtEnd.map((l) => l.toFixed(1)).join(" / ")}`,
      note: "2 shared cores: other sessions' tests ran meanwhile",
    },
  ];
  printRows(`bench/cluster on ${hostDescription()}`, rows);
  await writeResults(
    "cluster",
    {
      host: hostDescription(),
      tag: "pyagent",
      rounds: ROUNDS,
      load_average: { start: loadAtStart, end: loadAtEnd },
      started: startedAt,
      ended: new Date().toISOString(),
      measured: {
        times,
        order,
        paired,
        createTimes,
        gatewayOwn,
        records,
        localFork,
        crossFork,
        overhead,
        pullSpawnMs,
        heldSpawnMs,
        detectionMs,
        slowestCallMs,
        upMs,
        wrong,
      },
    },
    `# bench/cluster\n\n${hostDescription()}, 2 nodes and 1 gateway on one machine (scripts/local-cluster.sh), ${startedAt.slice(0, 16)} to ${new Date().toISOString().slice(11, 16)} UTC\n\n${markdownTable(rows)}`,
    // The nodes' snapshot came from the seed home (through the registry): its manifest names the machine.
    seedHome ?? path.join(clusterDir, "seed"),
  );
} finally {
  await run(SCRIPT, ["down", "--dir", clusterDir], { encoding: "utf8" }).catch((err: Error) =>
    console.error(`down: ${err.message}`),
  );
  await rm(dir, { recursive: true, force: true });
}
