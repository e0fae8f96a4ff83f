/**
 * The gateway's front door over stand-in nodes (test/gateway/stand-ins.ts): E2B's data plane routed by
 * `<port>-<id>.<domain>` host names and by the E2b-Sandbox-Id header to the sandbox's node, with the cluster
 * credential added and the caller's token removed; an unknown or lost sandbox answered at once in its API's
 * shape; users' tokens against the cluster credential; and bounded bodies both ways.
 */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, it } from "node:test";
import { CLUSTER_HEADERS } from "../../src/cluster/protocol.js";
import { MAX_NODE_ANSWER_BYTES } from "../../src/gateway/node-calls.js";
import { ADMIN_TOKEN, gatewayOver, type Harness, NODE_TOKEN, TENANT_TOKEN } from "./stand-ins.js";

const DOMAIN = "sandboxes.test";
const ON_NODE_1 = "sb-1000000000c3";
const TENANTS = "sb-0000000000d4";

interface Echo {
  node: string;
  method: string;
  url: string;
  headers: Record<string, string>;
  body: string;
}

/** A raw request (fetch cannot set Host). */
function request(
  url: string,
  options: { method?: string; path: string; headers?: Record<string, string>; body?: string | Buffer },
): Promise<{ status: number; json: unknown; ms: number; headers: http.IncomingHttpHeaders }> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${options.path}`, {
      method: options.method ?? "GET",
      headers: options.headers,
    });
    req.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        resolve({
          status: res.statusCode ?? 0,
          json: text ? JSON.parse(text) : null,
          ms: performance.now() - started,
          headers: res.headers,
        });
      });
    });
    req.on("error", reject);
    req.end(options.body);
  });
}

describe("gateway routing", () => {
  let h: Harness;
  before(async () => {
    h = await gatewayOver(2, {
      e2bDomain: DOMAIN,
      prepare: ([n0, n1]) => {
        n1?.sandboxes.set(ON_NODE_1, {
          id: ON_NODE_1,
          status: "running",
          owner: null,
          snapshot_tag: "base",
          created_at_unix: 1,
        });
        n0?.sandboxes.set(TENANTS, {
          id: TENANTS,
          status: "running",
          owner: "tenant-a",
          snapshot_tag: "base",
          created_at_unix: 1,
        });
      },
    });
  });
  after(async () => {
    await h.stop();
  });

  it("relays <port>-<id>.<domain> to the sandbox's node, Host unchanged, with the cluster credential", async () => {
    const host = `49983-${ON_NODE_1}.${DOMAIN}`;
    const r = await request(h.gateway.url, {
      method: "POST",
      path: "/files?path=/tmp/x",
      headers: { host, authorization: `Bearer ${ADMIN_TOKEN}`, "x-access-token": "sandbox-own-token" },
      body: "hello",
    });
    assert.equal(r.status, 200);
    const echo = r.json as Echo;
    assert.equal(echo.node, "node-1");
    assert.equal(echo.url, "/files?path=/tmp/x");
    assert.equal(echo.body, "hello");
    assert.equal(echo.headers.host, host);
    assert.equal(echo.headers[CLUSTER_HEADERS.token], NODE_TOKEN);
    assert.equal(echo.headers[CLUSTER_HEADERS.epoch], "1");
    assert.equal(echo.headers[CLUSTER_HEADERS.tenant], undefined, "the data plane acts for no tenant");
    assert.equal(echo.headers.authorization, undefined, "a gateway token never reaches a node");
    assert.equal(
      echo.headers["x-access-token"],
      "sandbox-own-token",
      "the node checks the sandbox's own token",
    );
    assert.match(String(r.headers["server-timing"]), /^gateway;dur=\d+\.\d\d, node;dur=\d+\.\d\d$/);
  });

  it("relays by the E2b-Sandbox-Id header, and a caller's cluster headers are not passed on", async () => {
    const r = await request(h.gateway.url, {
      path: "/health?timing=1",
      headers: {
        "e2b-sandbox-id": ON_NODE_1,
        "e2b-sandbox-port": "49983",
        [CLUSTER_HEADERS.token]: "forged",
        [CLUSTER_HEADERS.tenant]: "someone",
      },
    });
    assert.equal(r.status, 200);
    const echo = r.json as Echo;
    assert.equal(echo.node, "node-1");
    assert.equal(echo.headers[CLUSTER_HEADERS.token], NODE_TOKEN);
    assert.equal(echo.headers[CLUSTER_HEADERS.tenant], undefined);
    assert.match(String(r.headers["server-timing"]), /^gateway;dur=[\d.]+, node;dur=[\d.]+, app;dur=5$/);
  });

  it("answers an unknown sandbox at once, in each API's shape", async () => {
    const unknown = "sb-ffffffffffff";
    const forkd = await request(h.gateway.url, {
      path: `/v1/sandboxes/${unknown}`,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    });
    assert.equal(forkd.status, 404);
    assert.equal((forkd.json as { code: string }).code, "not_found");
    assert.match((forkd.json as { error: string }).error, /sb-ffffffffffff.*not found/);
    const e2b = await request(h.gateway.url, {
      path: `/sandboxes/${unknown}`,
      headers: { "x-api-key": ADMIN_TOKEN },
    });
    assert.equal(e2b.status, 404);
    assert.equal((e2b.json as { code: number }).code, 404);
    const data = await request(h.gateway.url, {
      path: "/health",
      headers: { host: `49983-${unknown}.${DOMAIN}` },
    });
    assert.equal(data.status, 502, "E2B's proxy answers a gone sandbox 502");
    for (const r of [forkd, e2b, data]) assert.ok(r.ms < 1_000, `answered in ${r.ms} ms`);
    // The nodes were asked (another replica may have placed it), each answered 404 at once.
    for (const node of h.nodes) assert.ok(node.calls("GET", `/v1/sandboxes/${unknown}`).length >= 1);
    // A header naming no possible sandbox is unknown without asking any node.
    const before = h.nodes.map((n) => n.seen.length);
    const odd = await request(h.gateway.url, {
      path: "/health",
      headers: { "e2b-sandbox-id": "../snapshots/x" },
    });
    assert.equal(odd.status, 502);
    assert.deepEqual(
      h.nodes.map((n) => n.seen.length),
      before,
    );
  });

  it("answers a fenced node's sandbox lost at once", async () => {
    const node1 = h.nodes[1];
    assert.ok(node1);
    node1.specEpoch = 2;
    h.cluster.publish();
    await h.gateway.context.view.read();
    try {
      const r = await request(h.gateway.url, {
        path: `/v1/sandboxes/${ON_NODE_1}`,
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      });
      assert.equal(r.status, 404);
      const body = r.json as { error: string; detail?: { lost?: boolean } };
      assert.match(body.error, /lost with its node: node node-1 was fenced/);
      assert.equal(body.detail?.lost, true);
      assert.ok(r.ms < 1_000);
    } finally {
      node1.specEpoch = 1;
      h.cluster.publish();
      await h.gateway.context.view.read();
    }
  });

  it("takes users' tokens, never the cluster credential; a tenant sees only its own sandboxes", async () => {
    const path = `/v1/sandboxes/${TENANTS}/files?path=/a`;
    const none = await request(h.gateway.url, { path });
    assert.equal(none.status, 401);
    const cluster = await request(h.gateway.url, {
      path,
      headers: { authorization: `Bearer ${NODE_TOKEN}` },
    });
    assert.equal(cluster.status, 401, "the node token is no user's token");
    const asClusterHeader = await request(h.gateway.url, {
      path,
      headers: { [CLUSTER_HEADERS.token]: NODE_TOKEN },
    });
    assert.equal(asClusterHeader.status, 401);
    const e2bWithNodeToken = await request(h.gateway.url, {
      path: "/sandboxes",
      headers: { "x-api-key": NODE_TOKEN },
    });
    assert.equal(e2bWithNodeToken.status, 401);
    const tenant = await request(h.gateway.url, {
      path,
      headers: { authorization: `Bearer ${TENANT_TOKEN}` },
    });
    assert.equal(tenant.status, 200);
    const echo = tenant.json as Echo;
    assert.equal(echo.headers[CLUSTER_HEADERS.tenant], "tenant-a");
    assert.equal(echo.headers.authorization, undefined);
    // Another tenant's sandbox answers exactly as an unknown one.
    const other = await request(h.gateway.url, {
      path: `/v1/sandboxes/${ON_NODE_1}`,
      headers: { authorization: `Bearer ${TENANT_TOKEN}` },
    });
    assert.equal(other.status, 404);
    assert.match((other.json as { error: string }).error, /not found/);
  });

  it("bounds bodies: a request over the gateway's limit, a node's answer over MAX_NODE_ANSWER_BYTES", async () => {
    const big = Buffer.alloc(3 * 1024 * 1024, "a");
    const spawn = await request(h.gateway.url, {
      method: "POST",
      path: "/v1/sandboxes",
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
      body: Buffer.concat([Buffer.from('{"snapshot_tag":"'), big, Buffer.from('"}')]),
    });
    assert.equal(spawn.status, 413);
    assert.equal((spawn.json as { code: string }).code, "payload_too_large");
    const e2b = await request(h.gateway.url, {
      method: "POST",
      path: "/sandboxes",
      headers: { "x-api-key": ADMIN_TOKEN, "content-type": "application/json" },
      body: Buffer.concat([Buffer.from('{"templateID":"'), big, Buffer.from('"}')]),
    });
    assert.equal(e2b.status, 413);
    // A node answering a list with more than the gateway reads into memory fails that call, not the gateway.
    const node0 = h.nodes[0];
    assert.ok(node0);
    node0.oversizedAnswer = MAX_NODE_ANSWER_BYTES + 1;
    try {
      const list = await request(h.gateway.url, {
        path: "/v1/sandboxes",
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      });
      // The list is the cluster less that node, and says so.
      assert.equal(list.status, 200);
      assert.equal(list.headers["x-forkd-unanswered-nodes"], "node-0");
      assert.deepEqual(
        (list.json as { id: string; node: string }[]).map((s) => [s.id, s.node]),
        [[ON_NODE_1, "node-1"]],
      );
    } finally {
      node0.oversizedAnswer = 0;
    }
    const health = await request(h.gateway.url, { path: "/healthz" });
    assert.equal(health.status, 200);
  });
  it("a durable pause the node could not make durable: 503 (registry down) or 507 (its list full), paused but not durably", async () => {
    const node = h.nodes[1];
    assert.ok(node);
    const pause = () =>
      request(h.gateway.url, {
        method: "POST",
        path: `/v1/sandboxes/${ON_NODE_1}/pause`,
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
        body: JSON.stringify({ durable: true }),
      });
    try {
      // What a node answers when its push finds the registry down (registry-errors.ts).
      node.durableRefusal = {
        status: 503,
        error:
          "the registry 10.0.0.9:5000 is unavailable (connection refused); work on this node's own snapshots goes on",
        code: "unavailable",
      };
      const down = await pause();
      assert.equal(down.status, 503);
      const body = down.json as { error: string; code: string; detail: Record<string, unknown> };
      assert.equal(body.code, "unavailable");
      assert.deepEqual(body.detail, { paused: true, durable: false });
      assert.match(
        body.error,
        new RegExp(
          `sandbox ${ON_NODE_1} is paused on node node-1, but not durably: .*10\\.0\\.0\\.9:5000 is unavailable`,
        ),
      );
      assert.equal(
        node.calls("POST", `/v1/sandboxes/${ON_NODE_1}/pause`).length,
        1,
        "the pause itself was relayed",
      );
      const paused = node.sandboxes.get(ON_NODE_1);
      assert.equal(paused?.status, "paused");
      paused.status = "running"; // so that the stand-in pauses it again (a paused sandbox answers 409)
      node.durableRefusal = {
        status: 507,
        error: "this node lists 32 durable pauses, the most it may",
        code: "insufficient_storage",
      };
      const full = await pause();
      assert.equal(full.status, 507);
      const fullBody = full.json as { code: string; detail: Record<string, unknown> };
      assert.equal(fullBody.code, "insufficient_storage");
      assert.deepEqual(fullBody.detail, { paused: true, durable: false });
    } finally {
      node.durableRefusal = undefined;
      const ref = node.sandboxes.get(ON_NODE_1);
      if (ref) ref.status = "running";
    }
  });
});
