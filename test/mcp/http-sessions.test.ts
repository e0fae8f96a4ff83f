/**
 * The MCP HTTP transport's credentials (issue 20, Low): a session belongs to the token that opened it (another
 * valid token with its Mcp-Session-Id reaches nothing), and a token file another user could read, or that is not
 * the process's own, is refused. A real listener and the MCP SDK's own client; no daemon is needed (tools/list
 * calls none).
 */
import assert from "node:assert/strict";
import { chmod, chown, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { loadTokens, MCP_PATH, type RunningHttp, serveHttp } from "../../src/mcp/http.js";
import { Controller } from "../../src/sdk/index.js";
import { probeUser } from "../support/other-user.js";

const ALICE = "alice-mcp-token-that-is-long-enough-0";
const BOB = "bob-mcp-token-that-is-long-enough-000";
const root = process.getuid?.() === 0;

describe("MCP over HTTP: sessions and the token file", () => {
  let dir: string;
  let running: RunningHttp;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-mcp-http-"));
    running = await serveHttp({
      host: "127.0.0.1",
      port: 0,
      tokens: [ALICE, BOB],
      controller: new Controller({ url: "unix:/nonexistent/forkd.sock" }),
    });
  });
  after(async () => {
    await running?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("answers a session only to the token that opened it", async () => {
    const endpoint = new URL(MCP_PATH, running.url);
    const transport = new StreamableHTTPClientTransport(endpoint, {
      requestInit: { headers: { authorization: `Bearer ${ALICE}` } },
    });
    const client = new Client({ name: "forkd-test", version: "0" });
    await client.connect(transport);
    try {
      const sessionId = transport.sessionId as string;
      assert.ok(sessionId);
      assert.ok((await client.listTools()).tools.length > 0, "alice's session works");
      const asBob = await fetch(endpoint, {
        method: "POST",
        headers: {
          authorization: `Bearer ${BOB}`,
          "mcp-session-id": sessionId,
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
        },
        body: JSON.stringify({ jsonrpc: "2.0", id: 7, method: "tools/list", params: {} }),
      });
      assert.equal(asBob.status, 404, await asBob.text());
      assert.ok((await client.listTools()).tools.length > 0, "alice's session is still hers");
    } finally {
      await client.close();
    }
  });

  it("refuses a token file other users can read, or that is not its own", async () => {
    const file = path.join(dir, "tokens");
    await writeFile(file, `${ALICE}\n`, { mode: 0o600 });
    assert.deepEqual(await loadTokens(file), [ALICE]);
    await chmod(file, 0o644);
    await assert.rejects(loadTokens(file), /open to other users \(mode 644\): chmod 600/);
    if (!root) return;
    await chmod(file, 0o600);
    await chown(file, (await probeUser()).uid, 0);
    await assert.rejects(loadTokens(file), /owned by uid \d+, not by this process's/);
  });
});
