/**
 * The gateway's directory (src/gateway/directory.ts): filled from a node's whole state and its changes, entries
 * of a fenced node kept as lost, and rebuilt by a restarted gateway from the nodes' event streams (stand-in
 * nodes, test/gateway/stand-ins.ts) without asking any node about a single sandbox.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { SandboxRef } from "../../src/cluster/protocol.js";
import { Directory } from "../../src/gateway/directory.js";
import { ADMIN_TOKEN, gatewayOver } from "./stand-ins.js";

const ref = (id: string, owner: string | null = null): SandboxRef => ({
  id,
  status: "running",
  owner,
  snapshot_tag: "base",
  created_at_unix: 1,
});

describe("gateway directory", () => {
  it("fills from a node's state and its changes, node by node", () => {
    const d = new Directory();
    d.applyState(
      "node-0",
      1,
      [ref("sb-000000000001"), ref("sb-000000000002")],
      [{ tag: "base", owner: null, digest: "sha256:aa" }],
    );
    d.applyState("node-1", 3, [ref("sb-100000000001", "t")], [{ tag: "base", owner: null, digest: null }]);
    assert.equal(d.lookup("sb-000000000001")?.node, "node-0");
    assert.equal(d.lookup("sb-100000000001")?.epoch, 3);
    assert.equal(d.lookup("sb-100000000001")?.owner, "t");
    assert.deepEqual(
      d
        .snapshotPlaces("base")
        .map((p) => p.node)
        .sort(),
      ["node-0", "node-1"],
    );
    d.upsert("node-0", 1, ref("sb-000000000003"));
    d.remove("node-0", "sb-000000000002");
    // A remove from another node does not touch the entry.
    d.remove("node-1", "sb-000000000001");
    assert.deepEqual(
      d
        .all()
        .map((p) => p.id)
        .sort(),
      ["sb-000000000001", "sb-000000000003", "sb-100000000001"],
    );
    // A new state of node-0 replaces its entries (what it no longer reports is gone), not node-1's.
    d.applyState("node-0", 1, [ref("sb-000000000003")], []);
    assert.equal(d.lookup("sb-000000000001"), undefined);
    assert.deepEqual(
      d.snapshotPlaces("base").map((p) => p.node),
      ["node-1"],
    );
    assert.equal(d.lookup("sb-100000000001")?.node, "node-1");
  });

  it("keeps a fenced node's entries as lost, and a learned snapshot does not overwrite the stream's", () => {
    const d = new Directory();
    d.applyState("node-0", 1, [ref("sb-000000000001"), ref("sb-000000000002")], []);
    d.markNodeLost("node-0", 1);
    assert.deepEqual(d.all(), []);
    assert.equal(d.lookup("sb-000000000001")?.node, "node-0", "a lost entry still answers, to say lost");
    // The node back under a new epoch reports nothing: its old entries stay lost, not unknown.
    d.applyState("node-0", 2, [], []);
    assert.equal(d.lookup("sb-000000000002")?.epoch, 1);
    // A sandbox found live again (a durable resume) leaves the lost list.
    d.upsert("node-1", 1, ref("sb-000000000002"));
    assert.equal(d.lookup("sb-000000000002")?.node, "node-1");
    // Also from an adopter whose own epoch is below the one the sandbox had on its old node, before that node
    // is marked lost: epochs are per node (the cluster suite's durable case hung on this in 2 runs of 3).
    d.applyState("node-2", 3, [ref("sb-000000000003")], []);
    d.upsert("node-1", 0, { ...ref("sb-000000000003"), status: "paused" });
    assert.equal(d.lookup("sb-000000000003")?.node, "node-1");
    // The same node under an older epoch does not overwrite it.
    d.upsert("node-1", 1, ref("sb-000000000004"));
    d.upsert("node-1", 0, { ...ref("sb-000000000004"), status: "paused" });
    assert.equal(d.lookup("sb-000000000004")?.status, "running");
    d.upsertSnapshot("node-1", 1, { tag: "br", owner: null, digest: "sha256:bb" });
    d.learnSnapshot("node-1", 1, { tag: "br", owner: null, digest: null });
    assert.equal(d.snapshotPlaces("br")[0]?.digest, "sha256:bb");
  });

  it("moves a sandbox to the node that reports it, whatever either node's epoch; a lost node's report never displaces a live entry", () => {
    const lost = new Set(["node-0@3"]);
    const d = new Directory((node, epoch) => lost.has(`${node}@${epoch}`));
    d.upsert("node-0", 3, ref("sb-000000000001"));
    // Adopted by node-1, which runs under epoch 0: epochs are each node's own.
    d.upsert("node-1", 0, ref("sb-000000000001"));
    assert.deepEqual([d.lookup("sb-000000000001")?.node, d.lookup("sb-000000000001")?.epoch], ["node-1", 0]);
    // A late report of the lost node (its stream's last lines) leaves it on the adopter.
    d.upsert("node-0", 3, ref("sb-000000000001"));
    assert.equal(d.lookup("sb-000000000001")?.node, "node-1");
  });

  it("is rebuilt by a restarted gateway from the nodes' streams, no node asked about a sandbox", async () => {
    const h = await gatewayOver(2, {
      prepare: ([n0, n1]) => {
        n0?.sandboxes.set("sb-0000000000a1", ref("sb-0000000000a1"));
        n1?.sandboxes.set("sb-1000000000b2", ref("sb-1000000000b2"));
      },
    });
    try {
      await h.restart();
      const directory = h.gateway.context.directory;
      assert.equal(directory.lookup("sb-0000000000a1")?.node, "node-0");
      assert.equal(directory.lookup("sb-1000000000b2")?.node, "node-1");
      const answer = await fetch(`${h.gateway.url}/v1/sandboxes/sb-1000000000b2/files?path=/x`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      });
      assert.equal(answer.status, 200);
      assert.equal(((await answer.json()) as { node: string }).node, "node-1");
      // Known from the streams: no node was asked where the sandbox is.
      for (const node of h.nodes) assert.deepEqual(node.calls("GET", "/v1/sandboxes/sb-1000000000b2"), []);
    } finally {
      await h.stop();
    }
  });
});
