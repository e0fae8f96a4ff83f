/**
 * Sandbox lifecycle decisions against a real HTTP server playing the daemon's answers: creating from a template
 * whose snapshot is missing, being built by someone else, or failed; createMany; connect to a dead or unknown
 * sandbox; kill of a sandbox that is already gone; argument checks before anything is sent.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  ConflictError,
  Controller,
  InvalidArgumentError,
  Sandbox,
  SandboxNotFoundError,
  TimeoutError,
} from "../../src/sdk/index.js";
import { sendJson, startServer, type TestServer } from "./http-fixture.js";

const info = (id: string, tag: string, status = "running") => ({
  id,
  snapshot_tag: tag,
  created_at_unix: 1,
  pid: 1,
  memory_limit_mib: null,
  status,
});
const snapshot = (tag: string, status: string, bootable: boolean, error: string | null = null) => ({
  tag,
  created_at_unix: 1,
  status,
  bootable,
  template: tag,
  error,
});

/** A daemon whose snapshot `tag` goes through `states` (one per GET), then stays at the last one. */
async function templateDaemon(
  tag: string,
  states: ("missing" | "writing" | "ready" | "failed")[],
  createAnswer: number,
) {
  let reads = 0;
  const state = () => states[Math.min(reads, states.length - 1)] as string;
  return startServer("unix", (req, res, body) => {
    const url = new URL(req.url ?? "/", "http://x");
    if (req.method === "POST" && url.pathname === "/v1/sandboxes") {
      const wanted = JSON.parse(body.toString()).snapshot_tag;
      if (wanted !== tag) return sendJson(res, 404, { error: "unknown tag", code: "not_found" });
      if (state() === "missing")
        return sendJson(res, 404, { error: `snapshot "${tag}" not found`, code: "not_found" });
      if (state() !== "ready") return sendJson(res, 409, { error: "not bootable", code: "conflict" });
      return sendJson(res, 201, [info("sb-aaaaaaaaaaaa", tag)]);
    }
    if (req.method === "GET" && url.pathname === `/v1/snapshots/${tag}/info`) {
      const current = state();
      reads++;
      if (current === "missing") return sendJson(res, 404, { error: "not found", code: "not_found" });
      return sendJson(
        res,
        200,
        snapshot(tag, current, current === "ready", current === "failed" ? "boot failed" : null),
      );
    }
    if (req.method === "POST" && url.pathname === "/v1/snapshots") {
      if (createAnswer === 0) return; // never answers: a build that takes forever
      if (createAnswer === 201) {
        reads = states.indexOf("ready");
        return sendJson(res, 201, snapshot(tag, "ready", true));
      }
      return sendJson(res, createAnswer, { error: "tag is being written", code: "conflict" });
    }
    sendJson(res, 404, { error: `no route ${req.method} ${url.pathname}`, code: "not_found" });
  });
}

const calls = (server: TestServer) => server.received.map((r) => `${r.method} ${r.url.split("?")[0]}`);

describe("Sandbox.create from a template", () => {
  it("builds the missing snapshot, then spawns", async () => {
    const server = await templateDaemon("pyagent", ["missing", "ready"], 201);
    try {
      const sandbox = await Sandbox.create("pyagent", { url: server.url, env: {} });
      assert.equal(sandbox.info.snapshot_tag, "pyagent");
      assert.deepEqual(calls(server), [
        "POST /v1/sandboxes",
        "GET /v1/snapshots/pyagent/info",
        "POST /v1/snapshots",
        "POST /v1/sandboxes",
      ]);
      assert.deepEqual(JSON.parse(server.received[2]?.body.toString() ?? ""), {
        tag: "pyagent",
        template: "pyagent",
      });
      assert.equal(
        JSON.parse(server.received[0]?.body.toString() ?? "").timeout_ms,
        300_000,
        "default lifetime",
      );
    } finally {
      await server.close();
    }
  });

  it("waits for a snapshot someone else is building (409 on create), then spawns", async () => {
    const server = await templateDaemon("pyagent", ["missing", "writing", "writing", "ready"], 409);
    try {
      const sandbox = await Sandbox.create({ template: "pyagent", url: server.url, env: {} });
      assert.equal(sandbox.id, "sb-aaaaaaaaaaaa");
      assert.equal(calls(server).filter((c) => c === "GET /v1/snapshots/pyagent/info").length, 4);
    } finally {
      await server.close();
    }
  });

  it("a failed snapshot is a ConflictError that says how to rebuild it", async () => {
    const server = await templateDaemon("pyagent", ["failed"], 409);
    try {
      await assert.rejects(Sandbox.create("pyagent", { url: server.url, env: {} }), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.match(
          err.message,
          /status failed: boot failed\); delete it .* to rebuild it from the template/,
        );
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it("gives up after snapshotTimeoutMs, naming it", async () => {
    const server = await templateDaemon("pyagent", ["missing", "writing"], 409);
    try {
      await assert.rejects(
        Sandbox.create("pyagent", { url: server.url, env: {}, snapshotTimeoutMs: 700 }),
        (err: unknown) => err instanceof TimeoutError && err.setting === "snapshotTimeoutMs",
      );
    } finally {
      await server.close();
    }
  });

  it("a build that outlasts snapshotTimeoutMs is a TimeoutError naming it", async () => {
    const server = await templateDaemon("pyagent", ["missing"], 0);
    try {
      await assert.rejects(
        Sandbox.create("pyagent", { url: server.url, env: {}, snapshotTimeoutMs: 300 }),
        (err: unknown) => {
          assert.ok(err instanceof TimeoutError);
          assert.equal(err.setting, "snapshotTimeoutMs");
          assert.match(
            err.message,
            /building snapshot pyagent .* snapshotTimeoutMs=300 ms; pass a larger `snapshotTimeoutMs`/,
          );
          return true;
        },
      );
    } finally {
      await server.close();
    }
  });

  it("with snapshotTag never builds anything", async () => {
    const server = await templateDaemon("pyagent", ["missing"], 201);
    try {
      await assert.rejects(Sandbox.create({ snapshotTag: "pyagent", url: server.url, env: {} }), /not found/);
      assert.deepEqual(calls(server), ["POST /v1/sandboxes"]);
    } finally {
      await server.close();
    }
  });
});

describe("Sandbox lifecycle", () => {
  it("createMany forks n in one request and wraps each", async () => {
    const server = await startServer("unix", (_req, res, body) => {
      const { n, snapshot_tag } = JSON.parse(body.toString());
      sendJson(
        res,
        201,
        Array.from({ length: n }, (_, i) => info(`sb-00000000000${i}`, snapshot_tag)),
      );
    });
    try {
      const sandboxes = await Sandbox.createMany(3, {
        snapshotTag: "py",
        url: server.url,
        env: {},
        timeoutMs: 0,
      });
      assert.deepEqual(
        sandboxes.map((s) => s.id),
        ["sb-000000000000", "sb-000000000001", "sb-000000000002"],
      );
      assert.equal(server.received.length, 1);
      assert.deepEqual(JSON.parse(server.received[0]?.body.toString() ?? ""), {
        snapshot_tag: "py",
        n: 3,
        timeout_ms: 0,
      });
    } finally {
      await server.close();
    }
  });

  it("connect: an unknown or dead sandbox is SandboxNotFoundError; kill of a gone one is fine", async () => {
    const server = await startServer("unix", (req, res) => {
      if (req.url === "/v1/sandboxes/sb-deaddeaddead")
        return sendJson(res, 200, info("sb-deaddeaddead", "py", "dead"));
      if (req.method === "DELETE")
        return sendJson(res, 404, { error: "sandbox not found", code: "not_found" });
      sendJson(res, 404, { error: "sandbox sb-000000000000 not found", code: "not_found" });
    });
    try {
      const settings = { url: server.url, env: {} };
      await assert.rejects(Sandbox.connect("sb-000000000000", settings), (err: unknown) => {
        assert.ok(err instanceof SandboxNotFoundError);
        assert.equal(err.status, 404);
        assert.match(err.message, /no sandbox sb-000000000000 on the daemon at unix:/);
        return true;
      });
      await assert.rejects(Sandbox.connect("sb-deaddeaddead", settings), SandboxNotFoundError);
      assert.equal(await Sandbox.kill("sb-000000000000", settings), false);
      await new Sandbox(new Controller(settings), info("sb-1", "py")).kill();
    } finally {
      await server.close();
    }
  });

  it("checks arguments before sending anything", async () => {
    const server = await startServer("unix", (_req, res) =>
      sendJson(res, 500, { error: "should not be called" }),
    );
    try {
      const settings = { url: server.url, env: {} };
      await assert.rejects(Sandbox.create(settings), /exactly one of `template` .* or `snapshotTag`/);
      await assert.rejects(
        Sandbox.create({ ...settings, template: "a", snapshotTag: "b" }),
        InvalidArgumentError,
      );
      await assert.rejects(
        Sandbox.create({ ...settings, snapshotTag: "py", timeoutMs: -5 }),
        /timeoutMs must be/,
      );
      assert.equal(server.received.length, 0);
    } finally {
      await server.close();
    }
  });
});
