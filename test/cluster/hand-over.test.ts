/**
 * The controller's hand-over of durable pauses (cluster-controller/hand-over.ts) on the real API server, with
 * the chart's CRDs: a fenced node's entry goes to exactly one live node even when two controllers race (the
 * resourceVersion makes the second write a 409), the fenced node's spec says where it went, and the gateway's
 * view (ClusterView.durablePause) reads it. An entry of a node that was not fenced stays where it is.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { CoreV1Api } from "@kubernetes/client-node";
import pino from "pino";
import { type DurableRecord, sealRecord } from "../../src/cluster/durable-record.js";
import {
  CLUSTER_LIMITS,
  type DurablePause,
  type ForkdNode,
  type ForkdSnapshot,
} from "../../src/cluster/schemas.js";
import {
  adopterCandidates,
  chooseAdopter,
  HandOver,
  pendingHandOvers,
} from "../../src/cluster-controller/hand-over.js";
import { ClusterView, kubeReads } from "../../src/gateway/cluster-view.js";
import { Leases } from "../../src/kube/leases.js";
import { type ForkdObjects, forkdObjects } from "../../src/kube/objects.js";
import { applyForkdCrds, type KubeTestCluster, startKubeCluster } from "../support/kube-cluster.js";

const NAMESPACE = "handover";
const PARENT = `sha256:${"a".repeat(64)}`;
const PUSHED = `sha256:${"c".repeat(64)}`;
const logger = pino({ level: process.env.TEST_LOG ?? "silent" });

function pauseEntry(id: string, epoch: number): DurablePause {
  const record = {
    id,
    owner: "alpha",
    snapshot_tag: "pyagent",
    layer_tags: ["pyagent", `pause-${id}-1`],
    pause_tag: `pause-${id}-1`,
    last_branch_tag: null,
    memory_tag: null,
    template_alias: null,
    accelerator: "tcg",
    live_fork: 0,
    created_at_unix: 1,
    memory_limit_mib: null,
    limits: "{}",
    metadata: "{}",
    env_vars: "{}",
    inbound: "{}",
    network: "private",
    network_policy: null,
    access_token: "t",
    traffic_token: null,
    timeout_ms: null,
    on_timeout: "kill",
    auto_resume: 0,
    auto_pause_memory: 1,
    paused_at_unix_ms: 1,
  } satisfies DurableRecord;
  return {
    id,
    owner: "alpha",
    reference: `127.0.0.1:5000/forkd/paused/${id}:1`,
    digest: PUSHED,
    parentDigest: PARENT,
    epoch,
    pausedAt: new Date().toISOString(),
    record: sealRecord(record, PUSHED, "node-token-for-the-test-0123"),
  };
}

describe("hand-over of durable pauses", () => {
  let cluster: KubeTestCluster;
  let objects: ForkdObjects;

  async function node(
    name: string,
    status: ForkdNode["status"],
    epoch = 0,
    on: ForkdObjects = objects,
  ): Promise<ForkdNode> {
    await on.nodes.create(name, { url: "http://10.1.0.1:8889", epoch: 0, unschedulable: false });
    if (epoch > 0) await on.nodes.patchSpec(name, { epoch });
    await on.nodes.patchStatus(name, status ?? {});
    return (await on.nodes.get(name)) as ForkdNode;
  }

  /** A namespace of its own for one case (the CRDs are the cluster's). */
  async function namespace(name: string): Promise<ForkdObjects> {
    await cluster.admin.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name } } });
    return forkdObjects(cluster.admin, name);
  }

  const liveBut =
    (on: ForkdObjects, ...dead: string[]) =>
    async () =>
      ((await on.nodes.list()) as ForkdNode[]).map((n) => ({
        node: n,
        live: !dead.includes(n.metadata.name),
      }));

  before(async () => {
    cluster = await startKubeCluster();
    await cluster.admin.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name: NAMESPACE } } });
    await applyForkdCrds(cluster);
    objects = forkdObjects(cluster.admin, NAMESPACE);
  });
  after(async () => {
    await cluster?.stop();
  });

  it("hands a fenced node's entry to one live node, once, even with two controllers racing", async () => {
    const lost = await node(
      "lost",
      { observedEpoch: 0, durablePauses: [pauseEntry("sb-000000000001", 0)] },
      1,
    );
    await node("kept", { observedEpoch: 0, durablePauses: [pauseEntry("sb-000000000002", 0)] });
    const holder = await node("holder", {
      observedEpoch: 0,
      snapshots: [{ digest: PARENT }],
      available: { sandboxes: 1, memoryMiB: 0, vcpus: 1, diskMiB: 0 },
    });
    const roomy = await node("roomy", {
      observedEpoch: 0,
      available: { sandboxes: 9, memoryMiB: 0, vcpus: 1, diskMiB: 0 },
    });
    assert.deepEqual(
      pendingHandOvers(lost).map((e) => e.id),
      ["sb-000000000001"],
    );
    const candidates = [lost, holder, roomy].map((n) => ({ node: n, live: n !== lost }));
    const entry = pendingHandOvers(lost)[0] as DurablePause;
    assert.equal(chooseAdopter(entry, "lost", candidates)?.metadata.name, "holder");
    assert.equal(
      chooseAdopter({ ...entry, parentDigest: undefined }, "lost", candidates)?.metadata.name,
      "roomy",
    );

    const read = async () =>
      ((await objects.nodes.list()) as ForkdNode[]).map((n) => ({
        node: n,
        live: n.metadata.name !== "lost",
      }));
    const snapshot = await read();
    // Two controllers that read the same state: the resourceVersion lets one adoption through.
    await Promise.all([
      new HandOver(objects, logger).round(snapshot),
      new HandOver(objects, logger).round(snapshot),
    ]);
    await new HandOver(objects, logger).round(await read());
    const after = (await objects.nodes.list()) as ForkdNode[];
    const adoptions = after.flatMap((n) =>
      (n.spec.adoptions ?? []).map((a) => ({ ...a, by: n.metadata.name })),
    );
    assert.deepEqual(adoptions, [{ id: "sb-000000000001", fromNode: "lost", fromEpoch: 0, by: "holder" }]);
    const lostAfter = after.find((n) => n.metadata.name === "lost") as ForkdNode;
    assert.deepEqual(lostAfter.spec.handedOver, [{ id: "sb-000000000001", toNode: "holder" }]);
    assert.deepEqual(pendingHandOvers(lostAfter), []);

    const view = new ClusterView(kubeReads(objects, new Leases(cluster.admin, NAMESPACE)), logger);
    // A fresh CRD's storage can answer 429 "(re)initializing" for a moment: read until the API server answers.
    for (let tries = 0; view.lastRead === 0 && tries < 50; tries++) {
      await view.read();
      if (view.lastRead === 0) await new Promise((resolve) => setTimeout(resolve, 200));
    }
    assert.deepEqual(view.durablePause("sb-000000000001"), { from: "lost", owner: "alpha", to: "holder" });
    assert.deepEqual(view.durablePause("sb-000000000002"), { from: "kept", owner: "alpha", to: undefined });
  });

  it("refuses a status entry whose record is not a seal's text, and more entries than the bound", async () => {
    const bad = { ...pauseEntry("sb-000000000009", 0), record: "../etc/passwd" };
    await node("bounded", {});
    await assert.rejects(objects.nodes.patchStatus("bounded", { durablePauses: [bad] }), /record/);
    const many = Array.from({ length: 33 }, (_, i) => pauseEntry(`sb-${String(i).padStart(12, "0")}`, 0));
    await assert.rejects(objects.nodes.patchStatus("bounded", { durablePauses: many }), /durablePauses/);
  });
  it("prunes an adoption once its adopter reports it done, and the hand-over once the fenced node dropped it; racing controllers agree", async () => {
    const on = await namespace("prune");
    await node("gone", { observedEpoch: 0, durablePauses: [pauseEntry("sb-000000000011", 0)] }, 1, on);
    await node("adopter", { observedEpoch: 0, snapshots: [{ digest: PARENT }] }, 0, on);
    const read = liveBut(on, "gone");
    const adoptionsOf = async (name: string) =>
      ((await on.nodes.get(name)) as ForkdNode).spec.adoptions ?? [];
    const handedOf = async (name: string) => ((await on.nodes.get(name)) as ForkdNode).spec.handedOver ?? [];
    await new HandOver(on, logger).round(await read());
    assert.deepEqual(await adoptionsOf("adopter"), [
      { id: "sb-000000000011", fromNode: "gone", fromEpoch: 0 },
    ]);
    // Not reported done yet: a round keeps both.
    await new HandOver(on, logger).round(await read());
    assert.equal((await adoptionsOf("adopter")).length, 1);
    assert.equal((await handedOf("gone")).length, 1);
    // The adopter reports it (status.adopted): two controllers prune at once; one write goes through.
    await on.nodes.patchStatus("adopter", { adopted: ["sb-000000000011"] });
    const snapshot = await read();
    await Promise.all([new HandOver(on, logger).round(snapshot), new HandOver(on, logger).round(snapshot)]);
    await new HandOver(on, logger).round(await read());
    assert.deepEqual(await adoptionsOf("adopter"), []);
    // The fenced node still lists the entry: its hand-over stays, and nothing is handed over again.
    assert.deepEqual(await handedOf("gone"), [{ id: "sb-000000000011", toNode: "adopter" }]);
    // It comes back and drops the entry: the hand-over goes.
    await on.nodes.patchStatus("gone", { observedEpoch: 1, durablePauses: [] });
    await new HandOver(on, logger).round(await read());
    assert.deepEqual(await handedOf("gone"), []);
    assert.deepEqual(await adoptionsOf("adopter"), []);

    // Moot adoptions go too: the fenced node's ForkdNode deleted, or its entry no longer listed.
    await on.nodes.patchSpec("adopter", {
      adoptions: [
        { id: "sb-000000000012", fromNode: "deleted-node", fromEpoch: 0 },
        { id: "sb-000000000013", fromNode: "gone", fromEpoch: 0 },
      ],
    });
    await new HandOver(on, logger).round(await read());
    assert.deepEqual(await adoptionsOf("adopter"), []);
  });

  it("chooses no node whose adoptions are full, and only holders of the parent (pulling it first when none holds it)", async () => {
    const on = await namespace("parents");
    const entry = pauseEntry("sb-000000000021", 0);
    await node("fenced", { observedEpoch: 0, durablePauses: [entry] }, 1, on);
    const free = (n: number) => ({ sandboxes: n, memoryMiB: 0, vcpus: 1, diskMiB: 0 });
    await node("small", { observedEpoch: 0, available: free(1) }, 0, on);
    await node("big", { observedEpoch: 0, available: free(5) }, 0, on);
    const read = liveBut(on, "fenced");
    assert.equal(chooseAdopter(entry, "fenced", await read()), undefined);
    const pulls: string[] = [];
    const snapshot = {
      metadata: { name: "pyagent" },
      spec: { reference: "127.0.0.1:5000/pyagent", digest: PARENT },
    } as ForkdSnapshot;
    // No ForkdSnapshot has the digest: nothing pulled, nothing adopted (it waits).
    await new HandOver(on, logger).round(await read(), { snapshots: [], pull: () => pulls.push("?") });
    assert.equal(pulls.length, 0);
    // One has it: the node with the most free slots pulls it; the adoption waits until it holds it.
    const context = { snapshots: [snapshot], pull: (n: ForkdNode) => pulls.push(n.metadata.name) };
    await new HandOver(on, logger).round(await read(), context);
    assert.deepEqual(pulls, ["big"]);
    const adoptions = async () =>
      ((await on.nodes.list()) as ForkdNode[]).flatMap((n) => n.spec.adoptions ?? []).map((a) => a.id);
    assert.deepEqual(await adoptions(), []);
    await on.nodes.patchStatus("big", { snapshots: [{ digest: PARENT }] });
    await new HandOver(on, logger).round(await read(), context);
    assert.deepEqual(await adoptions(), ["sb-000000000021"]);
    assert.equal(((await on.nodes.get("big")) as ForkdNode).spec.adoptions?.[0]?.id, "sb-000000000021");

    // A node with a full spec.adoptions is no candidate.
    const full = Array.from({ length: CLUSTER_LIMITS.handOversPerNode }, (_, i) => ({
      id: `sb-${String(100 + i).padStart(12, "0")}`,
      fromNode: "fenced",
      fromEpoch: 0,
    }));
    const candidates = (await read()).map((c) =>
      c.node.metadata.name === "big"
        ? { ...c, node: { ...c.node, spec: { ...c.node.spec, adoptions: full } } }
        : c,
    );
    assert.deepEqual(
      adopterCandidates("fenced", candidates).map((n) => n.metadata.name),
      ["small"],
    );
  });
});
