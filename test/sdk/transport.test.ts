/**
 * The SDK's HTTP layer against a real node:http server on a Unix socket and on TCP: headers and bodies on the
 * wire, the error class and message for each status family, unreachable daemons, dropped connections (with the
 * health check's verdict), request timeouts, caller aborts and stale keep-alive sockets.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import https from "node:https";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import {
  AuthenticationError,
  ConflictError,
  ConnectionError,
  Controller,
  ForkdSdkError,
  InvalidArgumentError,
  NotFoundError,
  NotImplementedError,
  PayloadTooLargeError,
  RateLimitError,
  ServerError,
  TimeoutError,
  UnavailableError,
} from "../../src/sdk/index.js";
import { sendJson, startServer, type TestServer } from "./http-fixture.js";

const SANDBOX = {
  id: "sb-1",
  snapshot_tag: "py",
  created_at_unix: 1,
  pid: 42,
  memory_limit_mib: null,
  status: "running",
};

for (const where of ["unix", "tcp"] as const) {
  describe(`transport over ${where}`, () => {
    let server: TestServer;
    before(async () => {
      server = await startServer(where, (req, res, body) => {
        if (req.url === "/v1/sandboxes" && req.method === "GET") return sendJson(res, 200, [SANDBOX]);
        if (req.url === "/v1/sandboxes" && req.method === "POST") {
          const parsed = JSON.parse(body.toString());
          return sendJson(res, 201, [{ ...SANDBOX, snapshot_tag: parsed.snapshot_tag }]);
        }
        if (req.url === "/v1/sandboxes/sb%2F..%2Fx" && req.method === "DELETE") {
          res.writeHead(204);
          return res.end();
        }
        sendJson(res, 404, { error: `no route ${req.method} ${req.url}` });
      });
    });
    after(() => server.close());

    it("sends JSON with the SDK's user agent and the token as a bearer header", async () => {
      const controller = new Controller({ url: server.url, token: "s3cret-token-0123", env: {} });
      const spawned = await controller.spawnSandboxes({
        snapshotTag: "py",
        n: 1,
        timeoutMs: 0,
        memoryLimitMib: 128,
        cpuLimitMillicores: 500,
        pidsLimit: 64,
        diskLimitMib: 256,
      });
      assert.equal(spawned[0]?.snapshot_tag, "py");
      const got = server.received.at(-1);
      assert.equal(got?.method, "POST");
      assert.equal(got?.headers.authorization, "Bearer s3cret-token-0123");
      assert.match(String(got?.headers["user-agent"]), /^forkd-sdk-ts\//);
      assert.equal(got?.headers["content-type"], "application/json");
      assert.deepEqual(JSON.parse(got?.body.toString() ?? ""), {
        snapshot_tag: "py",
        n: 1,
        memory_limit_mib: 128,
        cpu_limit_millicores: 500,
        pids_limit: 64,
        disk_limit_mib: 256,
        timeout_ms: 0,
      });
      assert.deepEqual(await controller.listSandboxes(), [SANDBOX]);
    });

    it("sends no authorization header without a token, and percent-encodes ids in paths", async () => {
      const controller = new Controller({ url: server.url, env: {} });
      await controller.killSandbox("sb/../x");
      const got = server.received.at(-1);
      assert.equal(got?.url, "/v1/sandboxes/sb%2F..%2Fx");
      assert.equal(got?.headers.authorization, undefined);
    });

    it("maps a 404 answer to NotFoundError carrying the daemon's message and the request", async () => {
      const controller = new Controller({ url: server.url, env: {} });
      await assert.rejects(controller.getSandbox("nope"), (err: unknown) => {
        assert.ok(err instanceof NotFoundError);
        assert.ok(err instanceof ForkdSdkError);
        assert.equal(err.status, 404);
        assert.equal(err.request, "GET /v1/sandboxes/nope");
        assert.equal(err.serverMessage, "no route GET /v1/sandboxes/nope");
        assert.match(
          err.message,
          /no route GET \/v1\/sandboxes\/nope \(HTTP 404 from GET \/v1\/sandboxes\/nope\)/,
        );
        return true;
      });
    });
  });
}

describe("error classes per status family", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer("unix", (req, res) => {
      const status = Number(new URL(req.url ?? "/", "http://x").searchParams.get("status"));
      const headers: Record<string, string> = status === 429 || status === 503 ? { "retry-after": "3" } : {};
      if (status === 500) {
        res.writeHead(500, { "content-type": "text/plain" });
        return res.end("kaboom\nstack trace here");
      }
      sendJson(res, status, { error: `failure ${status}`, code: `code_${status}` }, headers);
    });
  });
  after(() => server.close());

  const table: [number, new (...args: never[]) => Error][] = [
    [400, InvalidArgumentError],
    [422, InvalidArgumentError],
    [401, AuthenticationError],
    [403, AuthenticationError],
    [404, NotFoundError],
    [409, ConflictError],
    [413, PayloadTooLargeError],
    [429, RateLimitError],
    [500, ServerError],
    [501, NotImplementedError],
    [503, UnavailableError],
    [504, TimeoutError],
    [418, ForkdSdkError],
  ];
  for (const [status, cls] of table) {
    it(`HTTP ${status} → ${cls.name}`, async () => {
      const controller = new Controller({ url: server.url, env: {} });
      await assert.rejects(
        controller.send({ method: "GET", path: "/probe", query: { status } }),
        (err: unknown) => {
          assert.ok(err instanceof cls, `got ${(err as Error).constructor.name}`);
          assert.ok(err instanceof ForkdSdkError);
          assert.equal(err.status, status);
          assert.equal(err.name, cls.name);
          if (status !== 500) {
            assert.equal(err.code, `code_${status}`);
            assert.match(err.message, new RegExp(`failure ${status}`));
          } else {
            assert.match(err.message, /^kaboom \(HTTP 500 from GET \/probe\)$/);
          }
          return true;
        },
      );
    });
  }

  it("429 and 503 carry Retry-After in ms and say when to retry", async () => {
    const controller = new Controller({ url: server.url, env: {} });
    for (const status of [429, 503]) {
      await assert.rejects(
        controller.send({ method: "GET", path: "/probe", query: { status } }),
        (err: unknown) => {
          assert.ok(err instanceof RateLimitError || err instanceof UnavailableError);
          assert.equal(err.retryAfterMs, 3000);
          assert.match(err.message, /retry after 3000 ms/);
          return true;
        },
      );
    }
  });

  it("401 names the setting: FORKD_TOKEN when none was sent, the token's source when it was refused", async () => {
    await assert.rejects(
      new Controller({ url: server.url, env: {} }).send({
        method: "GET",
        path: "/probe",
        query: { status: 401 },
      }),
      /no token was sent: set FORKD_TOKEN or the `token` option/,
    );
    await assert.rejects(
      new Controller({ url: server.url, env: { FORKD_TOKEN: "wrong-token-123456" } }).send({
        method: "GET",
        path: "/probe",
        query: { status: 401 },
      }),
      /the token from FORKD_TOKEN was refused/,
    );
  });

  it("branchSandbox surfaces the daemon's 501 as NotImplementedError", async () => {
    const stub = await startServer("unix", (_req, res) =>
      sendJson(res, 501, { error: "branch is not implemented yet" }),
    );
    try {
      await assert.rejects(
        new Controller({ url: stub.url, env: {} }).branchSandbox("sb-1", { mode: "diff" }),
        (err: unknown) => {
          assert.ok(err instanceof NotImplementedError);
          assert.match(
            err.message,
            /branch is not implemented yet \(HTTP 501 from POST \/v1\/sandboxes\/sb-1\/branch\)/,
          );
          return true;
        },
      );
      assert.deepEqual(JSON.parse(stub.received[0]?.body.toString() ?? ""), { mode: "diff" });
    } finally {
      await stub.close();
    }
  });

  it("a 2xx answer that is not JSON is reported, not returned", async () => {
    const html = await startServer("tcp", (_req, res) => {
      res.writeHead(200, { "content-type": "text/html" });
      res.end("<html>not forkd</html>");
    });
    try {
      await assert.rejects(
        new Controller({ url: html.url, env: {} }).listSnapshots(),
        /not JSON \(is FORKD_URL pointing at forkd\?\)/,
      );
    } finally {
      await html.close();
    }
  });
});

describe("unreachable daemons and dropped connections", () => {
  it("a missing socket: ConnectionError, daemon not reachable, message says to start it or set FORKD_URL", async () => {
    const controller = new Controller({ env: { FORKD_URL: "unix:/nonexistent/forkd.sock" } });
    await assert.rejects(controller.listSandboxes(), (err: unknown) => {
      assert.ok(err instanceof ConnectionError);
      assert.ok(err instanceof UnavailableError);
      assert.equal(err.daemonReachable, false);
      assert.equal(err.syscallCode, "ENOENT");
      assert.match(err.message, /no forkd daemon socket at \/nonexistent\/forkd\.sock \(from FORKD_URL\)/);
      assert.match(err.message, /forkd daemon/);
      return true;
    });
  });

  it("a closed TCP port: ConnectionError ECONNREFUSED naming the url option", async () => {
    const probe = await startServer("tcp", () => {});
    const url = probe.url;
    await probe.close();
    await assert.rejects(new Controller({ url, env: {} }).listSandboxes(), (err: unknown) => {
      assert.ok(err instanceof ConnectionError);
      assert.equal(err.daemonReachable, false);
      assert.equal(err.syscallCode, "ECONNREFUSED");
      assert.match(err.message, /nothing listens at http:\/\/127\.0\.0\.1:\d+ \(from the `url` option\)/);
      return true;
    });
  });

  it("a connection cut mid-answer while the daemon stays up: daemonReachable true", async () => {
    const server = await startServer("unix", (req, res) => {
      if (req.url === "/healthz") return sendJson(res, 200, { ok: true });
      res.writeHead(200, { "content-type": "application/json", "content-length": "1000" });
      res.write('[{"id":');
      setTimeout(() => res.socket?.destroy(), 20);
    });
    try {
      await assert.rejects(new Controller({ url: server.url, env: {} }).listSandboxes(), (err: unknown) => {
        assert.ok(err instanceof ConnectionError);
        assert.equal(err.daemonReachable, true);
        assert.match(err.message, /dropped during GET \/v1\/sandboxes .*the daemon is still up/);
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it("a connection cut because the daemon went away: daemonReachable false", async () => {
    let closeServer: () => Promise<void> = async () => {};
    const server = await startServer("unix", (_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-length": "1000" });
      res.write("[");
      void closeServer();
    });
    closeServer = server.close;
    await assert.rejects(new Controller({ url: server.url, env: {} }).listSandboxes(), (err: unknown) => {
      assert.ok(err instanceof ConnectionError);
      assert.equal(err.daemonReachable, false);
      assert.match(err.message, /is unreachable now/);
      return true;
    });
  });
});

describe("deadlines and cancellation", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer("unix", () => {
      // never answers
    });
  });
  after(() => server.close());

  it("requestTimeoutMs fires a TimeoutError naming the setting and closes the connection", async () => {
    const controller = new Controller({ url: server.url, requestTimeoutMs: 150, env: {} });
    const started = Date.now();
    await assert.rejects(controller.listSnapshots(), (err: unknown) => {
      assert.ok(err instanceof TimeoutError);
      assert.equal(err.setting, "requestTimeoutMs");
      assert.match(
        err.message,
        /GET \/v1\/snapshots did not finish within requestTimeoutMs=150 ms; pass a larger `requestTimeoutMs` \(0 disables it\)/,
      );
      return true;
    });
    const elapsed = Date.now() - started;
    assert.ok(elapsed >= 140 && elapsed < 2000, `took ${elapsed} ms`);
    await waitUntil(() => server.sockets.size === 0, "the server to see the connection closed");
  });

  it("a spawn's deadline grows by a second per child, and its message says so", async () => {
    const controller = new Controller({ url: server.url, requestTimeoutMs: 100, env: {} });
    const started = Date.now();
    await assert.rejects(controller.spawnSandboxes({ snapshotTag: "py", n: 2 }), (err: unknown) => {
      assert.ok(err instanceof TimeoutError);
      assert.match(
        err.message,
        /^spawning 2 sandboxes \(requestTimeoutMs \+ 1000 ms per child\) did not finish within requestTimeoutMs=2100 ms/,
      );
      return true;
    });
    assert.ok(Date.now() - started >= 2000);
  });

  it("a per-call requestTimeoutMs overrides the client's", async () => {
    const controller = new Controller({ url: server.url, requestTimeoutMs: 60_000, env: {} });
    await assert.rejects(controller.listSnapshots({ requestTimeoutMs: 50 }), /requestTimeoutMs=50 ms/);
  });

  it("aborting the caller's signal rejects with its reason (AbortError by default), not a timeout", async () => {
    const controller = new Controller({ url: server.url, env: {} });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    await assert.rejects(controller.listSnapshots({ signal: ac.signal }), (err: unknown) => {
      assert.ok(err instanceof DOMException);
      assert.equal(err.name, "AbortError");
      return true;
    });
    const reason = new Error("agent changed its mind");
    await assert.rejects(
      controller.listSnapshots({ signal: AbortSignal.abort(reason) }),
      (err: unknown) => err === reason,
    );
    await waitUntil(() => server.sockets.size === 0, "the server to see the connection closed");
  });

  it("requestTimeoutMs 0 disables the deadline (the caller's signal still applies)", async () => {
    const controller = new Controller({ url: server.url, requestTimeoutMs: 0, env: {} });
    const started = Date.now();
    const outcome = await controller.listSnapshots({ signal: AbortSignal.timeout(400) }).then(
      () => "answered",
      (err: Error) => err.name,
    );
    assert.equal(outcome, "TimeoutError", "the caller's AbortSignal.timeout reason");
    assert.ok(Date.now() - started >= 390);
  });
});

describe("keep-alive", () => {
  it("re-sends once when a reused connection turns out closed by the daemon", async () => {
    let count = 0;
    const server = await startServer("unix", (req, res) => {
      count++;
      if (count === 2) {
        req.socket.destroy();
        return;
      }
      sendJson(res, 200, []);
    });
    try {
      const controller = new Controller({ url: server.url, env: {} });
      assert.deepEqual(await controller.listSandboxes(), []);
      assert.deepEqual(await controller.listSandboxes(), []);
      assert.equal(count, 3);
    } finally {
      await server.close();
    }
  });
});

async function waitUntil(check: () => boolean, what: string, timeoutMs = 3000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe("TLS", () => {
  it("an https daemon with a private CA: refused with a hint to pass `ca`, accepted with it", async (t) => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-sdk-tls-"));
    try {
      try {
        await promisify(execFile)("openssl", [
          "req",
          "-x509",
          "-newkey",
          "rsa:2048",
          "-nodes",
          "-days",
          "1",
          "-subj",
          "/CN=forkd-test",
          "-addext",
          "subjectAltName=IP:127.0.0.1",
          "-keyout",
          path.join(dir, "key.pem"),
          "-out",
          path.join(dir, "cert.pem"),
        ]);
      } catch (err) {
        t.skip(`openssl cannot make a test certificate: ${(err as Error).message}`);
        return;
      }
      const cert = await readFile(path.join(dir, "cert.pem"));
      const server = https.createServer(
        { cert, key: await readFile(path.join(dir, "key.pem")) },
        (req, res) => sendJson(res, 200, [{ tag: "py", auth: req.headers.authorization }]),
      );
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
      try {
        await assert.rejects(new Controller({ url, env: {} }).listSnapshots(), (err: unknown) => {
          assert.ok(err instanceof ConnectionError);
          assert.match(
            err.message,
            /TLS with the daemon at https:\/\/127\.0\.0\.1:\d+ failed .*pass the CA certificate with the `ca` option/,
          );
          return true;
        });
        const answer = await new Controller({
          url,
          ca: cert,
          token: "tls-token-0123456789",
          env: {},
        }).listSnapshots();
        assert.deepEqual(answer, [{ tag: "py", auth: "Bearer tls-token-0123456789" }]);
      } finally {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
