/**
 * The gateway's durable pause over stand-in nodes (test/gateway/stand-ins.ts): with --durable-pause, E2B's pause
 * (as the real E2B JS SDK sends it) is the node's pause and then the node's durable push, answered 204 once
 * both are done; a filesystem-only pause stays on its node; forkd's pause is durable unless it says
 * `durable: false`. Without the setting both are as before. A pause that was not made durable says so in each
 * API's shape (503 paused but not durably, 507 the node's list full), and a lost node's durable pause is
 * answered "being moved" (503, Retry-After) to E2B's connect until the adopter reports it, then routed there.
 */
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, it } from "node:test";
import { Sandbox, SandboxNotFoundError, ServiceBusyError } from "e2b";
import { CLUSTER_HEADERS, NODE_ROUTES, type SandboxRef } from "../../src/cluster/protocol.js";
import { gatewayOver, type Harness, NODE_TOKEN, TENANT_TOKEN } from "./stand-ins.js";

const ID = "sb-0000000000e1";
const OTHERS = "sb-0000000000e2";
const ref = (status = "running", id = ID, owner = "tenant-a"): SandboxRef => ({
  id,
  status,
  owner,
  snapshot_tag: "base",
  created_at_unix: 1,
});
const e2bOptions = (h: Harness) => ({
  apiKey: TENANT_TOKEN,
  apiUrl: h.gateway.url,
  requestTimeoutMs: 10_000,
});

/** A call through the gateway: its status, JSON body (null when empty) and headers. */
async function call(h: Harness, method: string, path: string, body?: unknown, e2b = true) {
  const auth: Record<string, string> = e2b
    ? { "x-api-key": TENANT_TOKEN }
    : { authorization: `Bearer ${TENANT_TOKEN}` };
  const answer = await fetch(`${h.gateway.url}${path}`, {
    method,
    headers: { ...auth, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await answer.text();
  return { status: answer.status, json: text ? JSON.parse(text) : null, headers: answer.headers };
}

/** The pause and durable-push calls node `n` of `h` saw, in order, as "<kind> <tenant header>". */
const pauseCalls = (h: Harness, n = 0) =>
  (h.nodes[n]?.seen ?? [])
    .filter((r) => r.method === "POST" && /\/pause$|durable-pauses/.test(r.url))
    .map((r) => {
      const kind = r.url.startsWith(NODE_ROUTES.durablePauses)
        ? "durable"
        : r.url.startsWith("/v1/")
          ? "forkd-pause"
          : "e2b-pause";
      return `${kind} ${r.headers[CLUSTER_HEADERS.tenant] ?? "-"}`;
    });

describe("the gateway's durable pause", () => {
  describe("without --durable-pause", () => {
    let h: Harness;
    before(async () => {
      h = await gatewayOver(1, { prepare: ([n0]) => n0?.sandboxes.set(ID, ref()) });
    });
    after(async () => h.stop());

    it("relays E2B's pause to the node as it is, and forkd's pause without durable is not made durable", async () => {
      assert.equal(await Sandbox.pause(ID, e2bOptions(h)), true);
      assert.equal(await Sandbox.pause(ID, e2bOptions(h)), false, "already paused: the node's 409");
      (h.nodes[0]?.sandboxes.get(ID) as SandboxRef).status = "running";
      const forkd = await call(h, "POST", `/v1/sandboxes/${ID}/pause`, {}, false);
      assert.equal(forkd.status, 200);
      assert.equal(forkd.json.durable, undefined);
      assert.deepEqual(pauseCalls(h), ["e2b-pause tenant-a", "e2b-pause tenant-a", "forkd-pause tenant-a"]);
    });
  });

  describe("with --durable-pause", () => {
    let h: Harness;
    before(async () => {
      h = await gatewayOver(2, { durablePause: true });
    });
    after(async () => h.stop());
    beforeEach(() => {
      for (const node of h.nodes) {
        node.seen.length = 0;
        node.durableRefusal = undefined;
      }
      h.nodes[0]?.sandboxes.set(ID, ref());
      h.nodes[0]?.sandboxes.set(OTHERS, ref("running", OTHERS, "tenant-b"));
    });

    it("E2B's pause (the SDK's pause and betaPause) is the node's pause, then its durable push, as the cluster", async () => {
      assert.equal(await Sandbox.pause(ID, e2bOptions(h)), true);
      assert.deepEqual(pauseCalls(h), ["e2b-pause tenant-a", "durable -"]);
      const push = h.nodes[0]?.calls("POST", `${NODE_ROUTES.durablePauses}/${ID}`)[0];
      assert.equal(push?.headers[CLUSTER_HEADERS.token], NODE_TOKEN);
      // Paused already: the node's 409 (the SDK's false), and nothing pushed again.
      assert.equal(await Sandbox.betaPause(ID, e2bOptions(h)), false);
      assert.deepEqual(pauseCalls(h), ["e2b-pause tenant-a", "durable -", "e2b-pause tenant-a"]);
    });

    it("a filesystem-only E2B pause (keepMemory false) stays a pause on its node", async () => {
      assert.equal(await Sandbox.pause(ID, { ...e2bOptions(h), keepMemory: false }), true);
      assert.deepEqual(pauseCalls(h), ["e2b-pause tenant-a"]);
      assert.equal(JSON.parse(h.nodes[0]?.seen.at(-1)?.body ?? "{}").memory, false);
    });

    it("forkd's pause is durable by default; durable false or memory false keeps it on its node", async () => {
      const made = await call(h, "POST", `/v1/sandboxes/${ID}/pause`, {}, false);
      assert.equal(made.status, 200, JSON.stringify(made.json));
      assert.equal(made.json.node, "node-0");
      assert.equal(made.json.durable.uploaded_bytes, 512);
      for (const body of [{ durable: false }, { memory: false }]) {
        (h.nodes[0]?.sandboxes.get(ID) as SandboxRef).status = "running";
        const plain = await call(h, "POST", `/v1/sandboxes/${ID}/pause`, body, false);
        assert.equal(plain.status, 200);
        assert.equal(plain.json.durable, undefined);
      }
      assert.deepEqual(pauseCalls(h), [
        "forkd-pause tenant-a",
        "durable -",
        "forkd-pause tenant-a",
        "forkd-pause tenant-a",
      ]);
      const both = await call(
        h,
        "POST",
        `/v1/sandboxes/${ID}/pause`,
        { durable: true, memory: false },
        false,
      );
      assert.equal(both.status, 400);
      assert.match(both.json.error, /a durable pause keeps memory/);
    });

    it("paused but not durably: 503 in E2B's shape (the SDK's ServiceBusyError) and forkd's, saying so", async () => {
      const node = h.nodes[0];
      assert.ok(node);
      node.durableRefusal = {
        status: 409,
        error: "this node has no cluster registry (--cluster-registry): no durable pauses",
        code: "conflict",
      };
      const e2b = await call(h, "POST", `/sandboxes/${ID}/pause`, {});
      assert.equal(e2b.status, 503);
      assert.equal(e2b.json.code, 503);
      assert.match(
        e2b.json.message,
        /sandbox sb-0000000000e1 is paused on node node-0, but not durably: .*registry/,
      );
      assert.deepEqual(Object.keys(e2b.json).sort(), ["code", "message"]);
      assert.equal(node.sandboxes.get(ID)?.status, "paused", "the pause itself happened");
      node.sandboxes.set(ID, ref());
      const err = await Sandbox.pause(ID, e2bOptions(h)).then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(err instanceof ServiceBusyError, String(err));
      assert.match(err.message, /paused on node node-0, but not durably/);
      node.sandboxes.set(ID, ref());
      const forkd = await call(h, "POST", `/v1/sandboxes/${ID}/pause`, {}, false);
      assert.equal(forkd.status, 503);
      assert.equal(forkd.json.code, "unavailable");
      assert.deepEqual(forkd.json.detail, { paused: true, durable: false });
    });

    it("the node's list of durable pauses full: 507 in each API's shape", async () => {
      const node = h.nodes[0];
      assert.ok(node);
      node.durableRefusal = {
        status: 507,
        error: "this node lists 32 durable pauses, the most it may: resume or kill one first",
        code: "insufficient_storage",
      };
      // No body at all: a pause with the defaults.
      const e2b = await call(h, "POST", `/sandboxes/${ID}/pause`);
      assert.equal(e2b.status, 507);
      assert.equal(e2b.json.code, 507);
      assert.match(
        e2b.json.message,
        /paused on node node-0, but not durably: this node lists 32 durable pauses/,
      );
      node.sandboxes.set(ID, ref());
      const forkd = await call(h, "POST", `/v1/sandboxes/${ID}/pause`, undefined, false);
      assert.equal(forkd.status, 507);
      assert.equal(forkd.json.code, "insufficient_storage");
    });

    it("an unknown or another tenant's sandbox: E2B's 404, nothing paused", async () => {
      const unknown = await call(h, "POST", "/sandboxes/sb-ffffffffffff/pause", {});
      assert.equal(unknown.status, 404);
      assert.equal(unknown.json.code, 404);
      const err = await Sandbox.pause(OTHERS, e2bOptions(h)).then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(err instanceof SandboxNotFoundError, String(err));
      assert.deepEqual(pauseCalls(h), []);
      assert.equal(h.nodes[0]?.sandboxes.get(OTHERS)?.status, "running");
    });
  });

  describe("a lost node's durable pause", () => {
    let h: Harness;
    before(async () => {
      h = await gatewayOver(2, {
        durablePause: true,
        prepare: ([, n1]) => {
          n1?.sandboxes.set(ID, ref("paused"));
          // The lost node ran under a later epoch than the adopter does (each node's epoch is its own).
          if (n1) n1.specEpoch = n1.runEpoch = 5;
        },
      });
    });
    after(async () => h.stop());

    it("E2B's connect answers 503 'being moved' with Retry-After (the SDK's ServiceBusyError), then reaches the adopter", async () => {
      const [n0, n1] = h.nodes;
      assert.ok(n0 && n1);
      // node-1 listed the sandbox's durable pause, then was lost and fenced (its spec.epoch raised).
      n1.durablePauses = [
        {
          id: ID,
          owner: "tenant-a",
          reference: `registry.test/forkd/paused/${ID}:p1`,
          digest: `sha256:${"d".repeat(64)}`,
          epoch: 5,
          pausedAt: new Date().toISOString(),
          record: "c2VhbGVk",
        },
      ];
      n1.specEpoch = 6;
      h.cluster.publish();
      await h.gateway.context.view.read();
      const moving = await call(h, "POST", `/v2/sandboxes/${ID}/connect`, { timeout: 60 });
      assert.equal(moving.status, 503);
      assert.equal(moving.json.code, 503);
      assert.match(moving.json.message, /being moved from node node-1 .*a node is being chosen; retry/);
      assert.equal(moving.headers.get("retry-after"), "2");
      // The controller handed it to node-0: the message names it.
      n1.handedOver = [{ id: ID, toNode: "node-0" }];
      h.cluster.publish();
      await h.gateway.context.view.read();
      const err = await Sandbox.connect(ID, e2bOptions(h)).then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(err instanceof ServiceBusyError, `not a 404: ${String(err)}`);
      assert.match(
        err.message,
        /please retry - sandbox sb-0000000000e1 is being moved .*node node-0 is adopting it/,
      );
      // node-0 adopted it: its stream reports it, and connect goes there.
      n0.sandboxes.set(ID, ref("paused"));
      n0.emit({ type: "sandbox", sandbox: ref("paused") });
      await waitUntil(async () => h.gateway.context.directory.lookup(ID)?.node === "node-0", 5_000);
      const there = await call(h, "POST", `/v2/sandboxes/${ID}/connect`, { timeout: 60 });
      assert.equal(there.status, 200);
      assert.equal(there.json.node, "node-0", "relayed to the adopter");
    });
  });
});

async function waitUntil(check: () => Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
