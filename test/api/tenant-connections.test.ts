/**
 * Connections per tenant (issue 20, item 8): listeners share a bounded number of connection slots and a proxied
 * response may hold one for minutes, so a tenant's connections are bounded (--tenant-max-connections) across
 * the daemon's listeners. Real TCP listeners and keep-alive connections, the HTTP-level services double. Before,
 * one tenant could hold every slot and lock every other tenant and the admin out.
 */
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import pino from "pino";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { ServicesDouble } from "./services-double.js";

const ADMIN = "admin-token-that-is-long-enough-1";
const ALICE = "alice-token-that-is-long-enough-1";
const BOB = "bob-token-that-is-long-enough-12";

describe("connections per tenant", () => {
  let dir: string;
  let daemon: RunningDaemon;
  let port: number;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-tenant-conns-"));
    const tokenFile = path.join(dir, "tokens");
    await writeFile(tokenFile, `${ADMIN}\n${ALICE} tenant=alice\n${BOB} tenant=bob\n`, { mode: 0o600 });
    daemon = await startDaemon(
      {
        socketPath: path.join(dir, "forkd.sock"),
        bind: "127.0.0.1:0",
        tokenFile,
        tenantMaxConnections: 2,
        auditLog: null,
        snapshotsDir: "/srv/snapshots",
        logger: pino({ level: "silent" }),
      },
      new ServicesDouble(),
    );
    port = Number(new URL(daemon.urls.find((u) => u.startsWith("http:")) as string).port);
  });
  after(async () => {
    await daemon?.stop("test");
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  /** A GET on a connection of its own, kept open (keep-alive) until the agent is destroyed. */
  const get = (token: string, agent: http.Agent) =>
    new Promise<number>((resolve, reject) => {
      const req = http.get(
        {
          host: "127.0.0.1",
          port,
          path: "/v1/sandboxes",
          agent,
          headers: { authorization: `Bearer ${token}` },
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", reject);
    });

  it("refuses a tenant's connection past its bound with 429, and no one else's", async () => {
    const agents = Array.from({ length: 5 }, () => new http.Agent({ keepAlive: true, maxSockets: 1 }));
    try {
      const [a1, a2, a3, b1, admin] = agents as [http.Agent, http.Agent, http.Agent, http.Agent, http.Agent];
      assert.equal(await get(ALICE, a1), 200);
      assert.equal(await get(ALICE, a2), 200);
      assert.equal(await get(ALICE, a1), 200, "a connection it holds goes on serving it");
      assert.equal(await get(ALICE, a3), 429, "a third connection is past alice's bound");
      assert.equal(await get(BOB, b1), 200, "another tenant is not affected");
      assert.equal(await get(ADMIN, admin), 200, "nor the admin");
      a1.destroy();
      await new Promise((r) => setTimeout(r, 200));
      const again = new http.Agent({ keepAlive: true, maxSockets: 1 });
      agents.push(again);
      assert.equal(await get(ALICE, again), 200, "a closed connection frees its slot");
    } finally {
      for (const agent of agents) agent.destroy();
    }
  });
});
