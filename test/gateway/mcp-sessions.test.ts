/**
 * MCP sessions across gateway replicas (src/gateway/mcp-sessions.ts): two real MCP listeners, each with the
 * replicas' session routing, on loopback addresses of their own, and the MCP SDK's own client. A session opened
 * at one replica is served through the other (relayed); a session name no replica sealed, a relayed request and
 * a session whose replica is gone get MCP's 404 and reach no other address. No daemon is needed (tools/list
 * calls none); no API server either (nothing is written to the cluster per session).
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { advertisedUrl, McpSessionRouting, RELAYED_HEADER } from "../../src/gateway/mcp-sessions.js";
import { MCP_PATH, McpListener } from "../../src/mcp/http.js";
import { Controller } from "../../src/sdk/index.js";

const TOKEN = "mcp-replica-test-token-long-enough-00";
const OTHER_TOKEN = "mcp-replica-test-other-token-long-000";
const CLUSTER_CREDENTIAL = "the-node-token-every-replica-holds-0000";

interface Replica {
  url: string;
  routing: McpSessionRouting;
  listener: McpListener;
  server: http.Server;
}

/** A replica as the gateway makes one (GatewayMcp): a listener whose sessions are named and relayed by routing. */
async function startReplica(host: string, credential = CLUSTER_CREDENTIAL): Promise<Replica> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const url = advertisedUrl(host, (server.address() as AddressInfo).port, false);
  const routing = new McpSessionRouting(credential, url, () => {});
  const controller = new Controller({ url: "unix:/nonexistent/forkd.sock" });
  const clients = (token: string) => (token === TOKEN || token === OTHER_TOKEN ? controller : undefined);
  const listener = new McpListener(clients, undefined, () => {}, routing);
  server.on("request", (req, res) => void listener.handle(req, res));
  return { url, routing, listener, server };
}

async function stop(replica: Replica): Promise<void> {
  await replica.listener.closeAll();
  replica.routing.close();
  replica.server.closeAllConnections();
  await new Promise<void>((resolve) => replica.server.close(() => resolve()));
}

async function connect(replica: Replica, sessionId?: string) {
  const transport = new StreamableHTTPClientTransport(new URL(MCP_PATH, replica.url), {
    sessionId,
    requestInit: { headers: { authorization: `Bearer ${TOKEN}` } },
  });
  const client = new Client({ name: "forkd-replicas-test", version: "0" });
  // With a session id given, the SDK's client continues that session (no initialize).
  await client.connect(transport);
  return { client, transport };
}

/** A tools/list request for `sessionId` at `replica`, sent by hand: its status and body. */
async function listToolsAt(replica: Replica, sessionId: string, extra: Record<string, string> = {}) {
  const response = await fetch(new URL(MCP_PATH, replica.url), {
    method: "POST",
    headers: {
      authorization: `Bearer ${TOKEN}`,
      "mcp-session-id": sessionId,
      "mcp-protocol-version": "2025-06-18",
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      ...extra,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list", params: {} }),
  });
  return { status: response.status, body: await response.text() };
}

describe("MCP sessions across gateway replicas", () => {
  let a: Replica;
  let b: Replica;
  /** A listener that must never be reached: where a forged session name points. */
  let canary: http.Server;
  let canaryHits = 0;

  before(async () => {
    a = await startReplica("127.0.0.2");
    b = await startReplica("127.0.0.3");
    canary = http.createServer((_req, res) => {
      canaryHits++;
      res.end();
    });
    await new Promise<void>((resolve) => canary.listen(0, "127.0.0.4", resolve));
  });
  after(async () => {
    await stop(a);
    await stop(b);
    await new Promise<void>((resolve) => canary.close(() => resolve()));
  });

  it("serves a session opened at one replica through the other", async () => {
    const opened = await connect(a);
    const sessionId = opened.transport.sessionId as string;
    assert.equal(a.routing.ownerOf(sessionId), a.url, "the session's name says where it lives");
    try {
      const elsewhere = await listToolsAt(b, sessionId);
      assert.equal(elsewhere.status, 200, elsewhere.body);
      assert.match(elsewhere.body, /run_command/);
      // The SDK's client, continuing the session at the other replica (as through a Service).
      const viaB = await connect(b, sessionId);
      assert.ok((await viaB.client.listTools()).tools.length > 0);
      // The session is still the token's that opened it, wherever the request lands.
      const asOther = await listToolsAt(b, sessionId, { authorization: `Bearer ${OTHER_TOKEN}` });
      assert.equal(asOther.status, 404, asOther.body);
    } finally {
      await opened.client.close();
    }
  });

  it("relays nothing for a name no replica sealed, a relayed request or another cluster's session", async () => {
    const opened = await connect(a);
    const sessionId = opened.transport.sessionId as string;
    try {
      const [uuid, , mac] = sessionId.split(".");
      const canaryUrl = `http://127.0.0.4:${(canary.address() as AddressInfo).port}`;
      const forged = `${uuid}.${Buffer.from(canaryUrl).toString("base64url")}.${mac}`;
      assert.equal((await listToolsAt(b, forged)).status, 404);
      assert.equal((await listToolsAt(b, sessionId, { [RELAYED_HEADER]: "1" })).status, 404);
      assert.equal(canaryHits, 0, "a forged session name reached the address it named");
      const stranger = await startReplica("127.0.0.5", "another-cluster's-credential-000000");
      try {
        assert.equal((await listToolsAt(stranger, sessionId)).status, 404);
        assert.equal(stranger.routing.ownerOf(sessionId), undefined);
      } finally {
        await stop(stranger);
      }
    } finally {
      await opened.client.close();
    }
  });

  it("answers 404 for a session whose replica is gone, so the client initializes again", async () => {
    const gone = await startReplica("127.0.0.6");
    const opened = await connect(gone);
    const sessionId = opened.transport.sessionId as string;
    await stop(gone);
    const answer = await listToolsAt(b, sessionId);
    assert.equal(answer.status, 404, answer.body);
    assert.match(answer.body, /initialize again/);
    const fresh = await connect(b);
    assert.ok((await fresh.client.listTools()).tools.length > 0);
    await fresh.client.close();
  });
});
