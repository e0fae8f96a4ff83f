/**
 * bench/cluster: what the cluster costs a user, side by side in one run on a local cluster
 * (scripts/local-cluster.sh up --nodes 2 --gateways 1): create + first exec through the gateway vs the same
 * node directly (its front, with the node token), p50/p99, alternating; a spawn that needs a pull (a snapshot
 * published from node-0, node-0 cordoned) vs a spawn of the same snapshot once held; the time a kill -9'd node
 * takes to be answered "lost". Writes bench/results/cluster.{json,md}.
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
import { hostDescription, markdownTable, printRows, type Row, writeResults } from "./lib/report.js";

const run = promisify(execFile);
const ROUNDS = envNumber("BENCH_ROUNDS", 10);
const SCRIPT = path.join(packageRoot(), "scripts", "local-cluster.sh");
const seedHome = process.env.BENCH_SEED_HOME;

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

async function createAndExec(c: Controller): Promise<{ ms: number; ok: boolean }> {
  const t0 = performance.now();
  const [kid] = await c.spawnSandboxes({ snapshotTag: "pyagent" });
  const r = await c.execCommand(kid?.id as string, ["echo", "ok"]);
  const ms = performance.now() - t0;
  await c.killSandbox(kid?.id as string);
  return { ms, ok: r.stdout.trim() === "ok" };
}

const p50 = (v: number[]) => percentile(v, 50);
const p99 = (v: number[]) => percentile(v, 99);
const fmt = (v: number) => `${Math.round(v)} ms`;

try {
  // Only node-0 takes spawns through the gateway, so both paths reach the same node.
  await objects.nodes.patchSpec(node1.name, { unschedulable: true });
  await new Promise((r) => setTimeout(r, 3_000));
  // The first spawn on a node pays one-time costs (its network, page cache): not counted.
  await createAndExec(direct);
  const times = { gateway: [] as number[], direct: [] as number[] };
  let wrong = 0;
  for (let i = 0; i < ROUNDS; i++) {
    for (const [name, c] of (i % 2 === 0
      ? [
          ["gateway", gateway],
          ["direct", direct],
        ]
      : [
          ["direct", direct],
          ["gateway", gateway],
        ]) as [keyof typeof times, Controller][]) {
      const r = await createAndExec(c);
      times[name].push(r.ms);
      if (!r.ok) wrong++;
    }
  }
  const overhead = (p50(times.gateway) - p50(times.direct)) / p50(times.direct);

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

  const rows: Row[] = [
    {
      metric: `create + first exec p50 / p99, ${ROUNDS} each, alternating: node directly`,
      value: `${fmt(p50(times.direct))} / ${fmt(p99(times.direct))}`,
    },
    {
      metric: "  through the gateway (Service stand-in, 1 replica)",
      value: `${fmt(p50(times.gateway))} / ${fmt(p99(times.gateway))}`,
      target: "< 10 % over direct",
      note: `p50 ${(overhead * 100).toFixed(1)} %${wrong ? `; ${wrong} wrong answers` : ""}`,
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
  ];
  printRows(`bench/cluster on ${hostDescription()}`, rows);
  await writeResults(
    "cluster",
    {
      host: hostDescription(),
      tag: "pyagent",
      rounds: ROUNDS,
      measured: { times, overhead, pullSpawnMs, heldSpawnMs, detectionMs, slowestCallMs, upMs, wrong },
    },
    `# bench/cluster\n\n${hostDescription()}, 2 nodes and 1 gateway on one machine (scripts/local-cluster.sh), ${new Date().toISOString().slice(0, 10)}\n\n${markdownTable(rows)}`,
  );
} finally {
  await run(SCRIPT, ["down", "--dir", clusterDir], { encoding: "utf8" }).catch((err: Error) =>
    console.error(`down: ${err.message}`),
  );
  await rm(dir, { recursive: true, force: true });
}
