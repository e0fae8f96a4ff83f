/**
 * Placement through the real gateway over stand-in nodes (test/gateway/stand-ins.ts): best-of-K on free slots,
 * holders of a ForkdSnapshot's digest before emptier nodes that would have to pull, a pull on a miss, spill-over;
 * and the snapshot-poll race: a node that got a tag since its event stream last reported its snapshots (the
 * node's 2 s snapshot poll, SNAPSHOT_POLL_MS; the stand-in reports only when the test says) and a ForkdNode
 * status that does not list a digest yet (the gateway's read of the API server, triggered here by the test).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { FORKD_API } from "../../src/cluster/api-group.js";
import type { ForkdSnapshot } from "../../src/cluster/schemas.js";
import { ADMIN_TOKEN, gatewayOver, type Harness, TENANT_TOKEN } from "./stand-ins.js";

const DIGEST = `sha256:${"ab".repeat(32)}`;

function forkdSnapshot(name: string): ForkdSnapshot {
  return {
    apiVersion: FORKD_API,
    kind: "ForkdSnapshot",
    metadata: { name },
    spec: { reference: `127.0.0.1:5000/forkd/${name}:v1`, digest: DIGEST, prepull: 0 },
  };
}

async function spawn(h: Harness, tag: string, n = 1, token = ADMIN_TOKEN) {
  const answer = await fetch(`${h.gateway.url}/v1/sandboxes`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ snapshot_tag: tag, n }),
  });
  const body = (await answer.json()) as { id: string; node: string; error?: string }[];
  if (answer.status === 201) {
    // Where the spawn's time went: the gateway's own share and the wait on the nodes.
    assert.match(answer.headers.get("server-timing") ?? "", /^gateway;dur=\d+\.\d\d, node;dur=\d+\.\d\d$/);
  }
  return { status: answer.status, body };
}

const nodesOf = (kids: { node: string }[]) => kids.map((k) => k.node).sort();

describe("gateway placement", () => {
  it("puts a spawn on the node with the most free slots (best-of-K over 3 candidates), spilling over", async () => {
    const h = await gatewayOver(3, {
      prepare: (nodes) => {
        for (const [i, node] of nodes.entries()) {
          node.freeSandboxes = [2, 9, 5][i] as number;
          node.snapshots.set("base", { tag: "base", owner: null, digest: null });
        }
      },
    });
    try {
      for (let i = 0; i < 5; i++) {
        const r = await spawn(h, "base");
        assert.equal(r.status, 201);
        assert.deepEqual(nodesOf(r.body), ["node-1"], "K = 3 sees every node: the emptiest wins each time");
      }
      // 9 + 5 + 2 slots: 12 fill node-1, then node-2, then spill to node-0.
      const many = await spawn(h, "base", 12);
      assert.equal(many.status, 201);
      const counts = new Map<string, number>();
      for (const kid of many.body) counts.set(kid.node, (counts.get(kid.node) ?? 0) + 1);
      assert.deepEqual(Object.fromEntries(counts), { "node-1": 9, "node-2": 3 });
      const tooMany = await spawn(h, "base", 17);
      assert.equal(tooMany.status, 503);
      assert.match(JSON.stringify(tooMany.body), /room for 16/);
    } finally {
      await h.stop();
    }
  });

  it("prefers the holders of a ForkdSnapshot's digest; a miss makes the best other node pull it", async () => {
    const h = await gatewayOver(2, {
      prepare: ([n0, n1], cluster) => {
        if (!n0 || !n1) return;
        n0.freeSandboxes = 1;
        n1.freeSandboxes = 8;
        n0.snapshots.set("pyagent", { tag: "pyagent", owner: null, digest: DIGEST });
        cluster.digestsOf.set("node-0", [DIGEST]);
        cluster.snapshotObjects.push(forkdSnapshot("pyagent"));
      },
    });
    try {
      const held = await spawn(h, "pyagent");
      assert.equal(held.status, 201);
      assert.deepEqual(nodesOf(held.body), ["node-0"], "the holder, though node-1 is emptier");
      assert.deepEqual(h.nodes[1]?.calls("POST", "/v1/cluster/pull"), []);
      // node-0 is full now (as its next status would say): node-1 pulls, once, then spawns.
      const node0 = h.nodes[0];
      assert.ok(node0);
      node0.freeSandboxes = 0;
      h.cluster.publish();
      await h.gateway.context.view.read();
      const pulled = await spawn(h, "pyagent");
      assert.equal(pulled.status, 201);
      assert.deepEqual(nodesOf(pulled.body), ["node-1"]);
      const pulls = h.nodes[1]?.calls("POST", "/v1/cluster/pull") ?? [];
      assert.equal(pulls.length, 1);
      assert.equal((JSON.parse(pulls[0]?.body ?? "{}") as { digest: string }).digest, DIGEST);
    } finally {
      await h.stop();
    }
  });
});

describe("the snapshot-poll race", () => {
  it("places a tag a node got since its stream last reported, when the known holders are full", async () => {
    const h = await gatewayOver(2, {
      prepare: ([n0, n1]) => {
        if (!n0 || !n1) return;
        n0.freeSandboxes = 0;
        n0.snapshots.set("br-1", { tag: "br-1", owner: "tenant-a", digest: null });
      },
    });
    try {
      // node-1 gets br-1 now (a BRANCH through another replica, a pull): its stream has not said so.
      const node1 = h.nodes[1];
      assert.ok(node1);
      node1.snapshots.set("br-1", { tag: "br-1", owner: "tenant-a", digest: null });
      assert.deepEqual(
        h.gateway.context.directory.snapshotPlaces("br-1").map((p) => p.node),
        ["node-0"],
        "the directory knows only node-0 (the race is set)",
      );
      const r = await spawn(h, "br-1", 1, TENANT_TOKEN);
      assert.equal(r.status, 201, JSON.stringify(r.body));
      assert.deepEqual(nodesOf(r.body), ["node-1"]);
      // The answer is remembered: the next spawn does not ask again.
      assert.deepEqual(
        h.gateway.context.directory
          .snapshotPlaces("br-1")
          .map((p) => p.node)
          .sort(),
        ["node-0", "node-1"],
      );
      const asked = node1.calls("GET", "/v1/snapshots/br-1").length;
      assert.equal((await spawn(h, "br-1", 1, TENANT_TOKEN)).status, 201);
      assert.equal(node1.calls("GET", "/v1/snapshots/br-1").length, asked);
    } finally {
      await h.stop();
    }
  });

  it("places a tag no stream reported yet, and names the holders when none has room", async () => {
    const h = await gatewayOver(2);
    try {
      const [node0, node1] = h.nodes;
      assert.ok(node0 && node1);
      node1.snapshots.set("br-2", { tag: "br-2", owner: null, digest: null });
      const r = await spawn(h, "br-2");
      assert.equal(r.status, 201);
      assert.deepEqual(nodesOf(r.body), ["node-1"]);
      node1.freeSandboxes = 0;
      h.cluster.publish();
      await h.gateway.context.view.read();
      const full = await spawn(h, "br-2");
      assert.equal(full.status, 503);
      assert.match(JSON.stringify(full.body), /only on node-1, with room for 0/);
      // Once the stream reports it gone, the tag is unknown (and no node has it): not found.
      node1.snapshots.delete("br-2");
      node1.emit({ type: "snapshot-gone", tag: "br-2" });
      await until(() => h.gateway.context.directory.snapshotPlaces("br-2").length === 0);
      assert.equal((await spawn(h, "br-2")).status, 404);
    } finally {
      await h.stop();
    }
  });

  it("spawns a ForkdSnapshot a node just pulled, before its ForkdNode status lists the digest", async () => {
    const h = await gatewayOver(2, {
      prepare: ([n0], cluster) => {
        if (!n0) return;
        n0.freeSandboxes = 0;
        n0.snapshots.set("pyagent", { tag: "pyagent", owner: null, digest: DIGEST });
        cluster.digestsOf.set("node-0", [DIGEST]);
        cluster.snapshotObjects.push(forkdSnapshot("pyagent"));
      },
    });
    try {
      const node1 = h.nodes[1];
      assert.ok(node1);
      // node-1 pulled it a moment ago (a prepull); the status the gateway read does not say so yet.
      node1.snapshots.set("pyagent", { tag: "pyagent", owner: null, digest: DIGEST });
      const r = await spawn(h, "pyagent");
      assert.equal(r.status, 201);
      assert.deepEqual(nodesOf(r.body), ["node-1"]);
      // The gateway asked node-1 to pull (the node finds it held: a pull per digest per node is idempotent).
      assert.equal(node1.calls("POST", "/v1/cluster/pull").length, 1);
    } finally {
      await h.stop();
    }
  });
});

async function until(condition: () => boolean): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not met within 5 s");
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
