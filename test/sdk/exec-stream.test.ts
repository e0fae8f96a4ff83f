/**
 * Streamed commands against a real HTTP server speaking the exec/stream wire format (NDJSON, base64 chunks):
 * callbacks see output as it happens and in order, non-zero exits throw CommandExitError, stream errors map to
 * their class, dropped streams say whether the sandbox is gone, abort and callback errors disconnect (which is
 * what kills the command on the daemon), stdin streams while the command runs, and deadlines name their setting.
 * The end-to-end tests (sandbox-e2e.test.ts) run the same calls against the real daemon and real VMs.
 */
import assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";
import { describe, it } from "node:test";
import vm from "node:vm";
import { installAsyncDisposeSymbol } from "../../src/sdk/dispose.js";
import {
  CommandExitError,
  ConflictError,
  ConnectionError,
  ForkdSdkError,
  NotFoundError,
  Sandbox,
  SandboxNotFoundError,
  TimeoutError,
  UnavailableError,
} from "../../src/sdk/index.js";
import { sendJson, startServer, type TestServer } from "./http-fixture.js";

const ID = "sb-0123456789ab";
const INFO = {
  id: ID,
  snapshot_tag: "py",
  created_at_unix: 1,
  pid: 7,
  memory_limit_mib: null,
  status: "running",
};

type StreamScript = (req: IncomingMessage, res: ServerResponse, body: Buffer) => unknown;

/** A server with the sandbox routes the Sandbox class needs; `script` answers exec/stream. */
async function daemonWith(
  script: StreamScript,
  options: { sandboxExists?: () => boolean; sandboxStatus?: () => string } = {},
): Promise<TestServer> {
  const exists = options.sandboxExists ?? (() => true);
  const status = options.sandboxStatus ?? (() => "running");
  return startServer(
    "unix",
    (req, res, body) => {
      const url = new URL(req.url ?? "/", "http://x");
      if (req.method === "POST" && url.pathname === "/v1/sandboxes") return sendJson(res, 201, [INFO]);
      if (url.pathname === "/healthz") return sendJson(res, 200, { ok: true });
      if (req.method === "GET" && url.pathname === `/v1/sandboxes/${ID}`) {
        return exists()
          ? sendJson(res, 200, { ...INFO, status: status() })
          : sendJson(res, 404, { error: `no sandbox ${ID}`, code: "not_found" });
      }
      if (req.method === "DELETE" && url.pathname === `/v1/sandboxes/${ID}`) {
        res.writeHead(204);
        return res.end();
      }
      if (req.method === "POST" && url.pathname === `/v1/sandboxes/${ID}/exec/stream`)
        return script(req, res, body);
      if (req.method === "POST" && url.pathname === `/v1/sandboxes/${ID}/eval`) {
        return sendJson(res, 200, {
          result: null,
          error: "ZeroDivisionError: division by zero",
          exit_code: 1,
          error_type: "ZeroDivisionError",
          traceback: "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n",
          stdout: "before\n",
          stderr: "",
          timed_out: false,
        });
      }
      sendJson(res, 404, { error: `no route ${req.method} ${url.pathname}`, code: "not_found" });
    },
    { streamBody: (req) => req.headers["content-type"] === "application/x-ndjson" },
  );
}

function ndjson(res: ServerResponse): (event: unknown) => void {
  res.writeHead(200, { "content-type": "application/x-ndjson" });
  return (event) => res.write(`${JSON.stringify(event)}\n`);
}

const b64 = (data: string | Buffer) => Buffer.from(data).toString("base64");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function sandboxOn(server: TestServer, extra: Record<string, unknown> = {}): Promise<Sandbox> {
  return Sandbox.create({ snapshotTag: "py", url: server.url, env: {}, ...extra });
}

describe("commands.run over the exec stream", () => {
  it("streams output to callbacks as it happens, whole characters only, and returns the collected result", async () => {
    const check = "✓";
    const bytes = Buffer.from(check);
    const server = await daemonWith(async (_req, res) => {
      const send = ndjson(res);
      send({ type: "started", id: ID });
      send({ type: "stdout", data: b64(Buffer.concat([Buffer.from("ok "), bytes.subarray(0, 1)])) });
      await sleep(50);
      send({ type: "stdout", data: b64(Buffer.concat([bytes.subarray(1), Buffer.from("\n")])) });
      send({ type: "stderr", data: b64("warn\n") });
      send({ type: "future-kind", whatever: 1 });
      send({
        type: "exit",
        exit_code: 0,
        signal: null,
        timed_out: false,
        stdout_bytes: 7,
        stderr_bytes: 5,
        duration_ms: 3,
      });
      res.end();
    });
    try {
      const sandbox = await sandboxOn(server);
      const seen: string[] = [];
      const result = await sandbox.commands.run("echo ok", {
        onStdout: (d) => void seen.push(`out:${d}`),
        onStderr: (d) => void seen.push(`err:${d}`),
        envs: { A: "1" },
        cwd: "/tmp",
      });
      assert.deepEqual(seen, ["out:ok ", `out:${check}\n`, "err:warn\n"]);
      assert.deepEqual(result, {
        exitCode: 0,
        stdout: `ok ${check}\n`,
        stderr: "warn\n",
        signal: null,
        timedOut: false,
      });
      const sent = JSON.parse(server.received.at(-1)?.body.toString() ?? "");
      assert.deepEqual(sent, {
        args: ["/bin/bash", "-c", "echo ok"],
        timeout_ms: 60_000,
        env: { A: "1" },
        cwd: "/tmp",
        encoding: "base64",
      });
    } finally {
      await server.close();
    }
  });

  it("a finished command leaves its connection open for the next call (keep-alive)", async () => {
    const server = await daemonWith((_req, res) => {
      const send = ndjson(res);
      send({ type: "stdout", data: b64("x") });
      send({ type: "exit", exit_code: 0, signal: null, timed_out: false });
      res.end();
    });
    try {
      const sandbox = await sandboxOn(server);
      for (let i = 0; i < 3; i++) assert.equal((await sandbox.commands.run("echo x")).stdout, "x");
      await sandbox.kill();
      assert.equal(server.connections(), 1, "one connection served create, three commands and kill");
    } finally {
      await server.close();
    }
  });

  it("an array runs without a shell; timeoutMs 0 is sent as the daemon's maximum", async () => {
    const server = await daemonWith((_req, res) => {
      const send = ndjson(res);
      send({ type: "exit", exit_code: 0, signal: null, timed_out: false });
      res.end();
    });
    try {
      const sandbox = await sandboxOn(server);
      await sandbox.commands.run(["ls", "-la", "a b"], { timeoutMs: 0 });
      const sent = JSON.parse(server.received.at(-1)?.body.toString() ?? "");
      assert.deepEqual(sent.args, ["ls", "-la", "a b"]);
      assert.equal(sent.timeout_ms, 24 * 60 * 60 * 1000);
    } finally {
      await server.close();
    }
  });

  it("a non-zero exit throws CommandExitError carrying stdout, stderr and the exit code", async () => {
    const server = await daemonWith((_req, res) => {
      const send = ndjson(res);
      send({ type: "stdout", data: b64("partial\n") });
      send({ type: "stderr", data: b64("boom: not found\n") });
      send({ type: "exit", exit_code: 3, signal: null, timed_out: false });
      res.end();
    });
    try {
      const sandbox = await sandboxOn(server);
      await assert.rejects(sandbox.commands.run("false"), (err: unknown) => {
        assert.ok(err instanceof CommandExitError);
        assert.ok(err instanceof ForkdSdkError);
        assert.equal(err.exitCode, 3);
        assert.equal(err.stdout, "partial\n");
        assert.equal(err.stderr, "boom: not found\n");
        assert.equal(err.timedOut, false);
        assert.equal(err.message, 'command "false" exited with code 3: boom: not found');
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it("a command killed at its timeout says which setting to raise", async () => {
    const server = await daemonWith((_req, res) => {
      ndjson(res)({ type: "exit", exit_code: 137, signal: "SIGKILL", timed_out: true });
      res.end();
    });
    try {
      const sandbox = await sandboxOn(server);
      await assert.rejects(sandbox.commands.run("sleep 100", { timeoutMs: 50 }), (err: unknown) => {
        assert.ok(err instanceof CommandExitError);
        assert.equal(err.timedOut, true);
        assert.equal(err.signal, "SIGKILL");
        assert.match(err.message, /past its timeoutMs \(pass a larger `timeoutMs`, 0 disables\)/);
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it('an {"type":"error"} line becomes the class of its code; a vanished sandbox becomes SandboxNotFoundError', async () => {
    let exists = true;
    const server = await daemonWith(
      (_req, res) => {
        const send = ndjson(res);
        send({ type: "started", id: ID });
        send({ type: "error", error: "agent channel closed", code: "unavailable" });
        res.end();
      },
      { sandboxExists: () => exists },
    );
    try {
      const sandbox = await sandboxOn(server);
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => {
        assert.ok(err instanceof UnavailableError && !(err instanceof ConnectionError));
        assert.match(err.message, /agent channel closed/);
        return true;
      });
      exists = false;
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => {
        assert.ok(err instanceof SandboxNotFoundError);
        assert.ok(err instanceof NotFoundError);
        assert.match(err.message, new RegExp(`sandbox ${ID} no longer exists .*sandbox\\.setTimeout`));
        assert.ok(err.cause instanceof UnavailableError);
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it("a 409 from a sandbox that is being stopped (lifetime over) is SandboxNotFoundError; other 409s stay", async () => {
    let status = "running";
    const server = await daemonWith(
      (_req, res) => sendJson(res, 409, { error: `sandbox ${ID} is being stopped`, code: "conflict" }),
      { sandboxStatus: () => status },
    );
    try {
      const sandbox = await sandboxOn(server);
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => err instanceof ConflictError);
      status = "stopping";
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => {
        assert.ok(err instanceof SandboxNotFoundError);
        assert.match(
          err.message,
          /is being stopped \(killed, or its lifetime ran out\) while command "true"/,
        );
        assert.ok(err.cause instanceof ConflictError);
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it("a stream cut before the exit is a ConnectionError that says the daemon is still up", async () => {
    const server = await daemonWith((_req, res) => {
      ndjson(res)({ type: "stdout", data: b64("x") });
      setTimeout(() => res.socket?.destroy(), 20);
    });
    try {
      const sandbox = await sandboxOn(server);
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => {
        assert.ok(err instanceof ConnectionError, String(err));
        assert.equal(err.daemonReachable, true);
        assert.match(err.message, /still up/);
        return true;
      });
    } finally {
      await server.close();
    }
  });

  it("aborting the signal rejects with the caller's reason and disconnects (the daemon then kills the command)", async () => {
    let disconnected = false;
    const server = await daemonWith((req, res) => {
      ndjson(res)({ type: "stdout", data: b64("tick\n") });
      res.on("close", () => {
        disconnected = !res.writableFinished;
      });
      void req;
    });
    try {
      const sandbox = await sandboxOn(server);
      const ac = new AbortController();
      await assert.rejects(
        sandbox.commands.run("sleep 100", { signal: ac.signal, onStdout: () => ac.abort() }),
        (err: unknown) => err instanceof DOMException && err.name === "AbortError",
      );
      await waitUntil(() => disconnected, "the server to see the disconnect");
    } finally {
      await server.close();
    }
  });

  it("a callback that throws stops the command and its error is what run throws", async () => {
    let disconnected = false;
    const server = await daemonWith((_req, res) => {
      ndjson(res)({ type: "stdout", data: b64("line\n") });
      res.on("close", () => {
        disconnected = true;
      });
    });
    try {
      const sandbox = await sandboxOn(server);
      const mine = new Error("callback failed");
      await assert.rejects(
        sandbox.commands.run("yes", {
          onStdout: () => {
            throw mine;
          },
        }),
        (err: unknown) => err === mine,
      );
      await waitUntil(() => disconnected, "the server to see the disconnect");
    } finally {
      await server.close();
    }
  });

  it("streams stdin while the command runs: a chunk's echo arrives before the next chunk is produced", async () => {
    const frames: unknown[] = [];
    const server = await daemonWith(async (req, res) => {
      assert.equal(req.headers["content-type"], "application/x-ndjson");
      const send = ndjson(res);
      let buffered = "";
      for await (const chunk of req) {
        buffered += chunk.toString();
        let newline = buffered.indexOf("\n");
        while (newline !== -1) {
          const frame = JSON.parse(buffered.slice(0, newline));
          buffered = buffered.slice(newline + 1);
          frames.push(frame);
          if (typeof frame.stdin_b64 === "string") send({ type: "stdout", data: frame.stdin_b64 });
          if (frame.eof === true) {
            send({ type: "exit", exit_code: 0, signal: null, timed_out: false });
            res.end();
          }
          newline = buffered.indexOf("\n");
        }
      }
    });
    try {
      const sandbox = await sandboxOn(server);
      let echoed = "";
      async function* typing(): AsyncGenerator<string> {
        yield "one\n";
        await waitUntil(() => echoed.includes("one"), "the first chunk's echo");
        yield "two\n";
      }
      const result = await sandbox.commands.run(["cat"], {
        stdin: typing(),
        onStdout: (d) => {
          echoed += d;
        },
      });
      assert.equal(result.stdout, "one\ntwo\n");
      assert.deepEqual(frames, [
        { args: ["cat"], timeout_ms: 60_000, encoding: "base64" },
        { stdin_b64: b64("one\n") },
        { stdin_b64: b64("two\n") },
        { eof: true },
      ]);
    } finally {
      await server.close();
    }
  });

  it("requestTimeoutMs bounds only the start: a daemon that never answers times out, a long stream does not", async () => {
    let silent = true;
    const server = await daemonWith(async (_req, res) => {
      if (silent) return;
      const send = ndjson(res);
      for (let i = 0; i < 4; i++) {
        send({ type: "stdout", data: b64(`${i}`) });
        await sleep(60);
      }
      send({ type: "exit", exit_code: 0, signal: null, timed_out: false });
      res.end();
    });
    try {
      const sandbox = await sandboxOn(server, { requestTimeoutMs: 100 });
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => {
        assert.ok(err instanceof TimeoutError);
        assert.equal(err.setting, "requestTimeoutMs");
        assert.match(err.message, /starting \/bin\/bash did not finish within requestTimeoutMs=100 ms/);
        return true;
      });
      silent = false;
      const result = await sandbox.commands.run("slow");
      assert.equal(result.stdout, "0123");
    } finally {
      await server.close();
    }
  });
});

describe("runCode and disposal", () => {
  it("runCode returns the Python exception as data, E2B-shaped", async () => {
    const server = await daemonWith(() => {});
    try {
      const sandbox = await sandboxOn(server);
      const outcome = await sandbox.runCode("print('before'); 1/0", { timeoutMs: 5_000 });
      assert.equal(outcome.result, null);
      assert.equal(outcome.stdout, "before\n");
      assert.equal(outcome.error?.name, "ZeroDivisionError");
      assert.equal(outcome.error?.value, "division by zero");
      assert.match(outcome.error?.traceback ?? "", /^Traceback/);
      assert.deepEqual(JSON.parse(server.received.at(-1)?.body.toString() ?? ""), {
        code: "print('before'); 1/0",
        timeout_ms: 5_000,
      });
    } finally {
      await server.close();
    }
  });

  it("`await using` kills the sandbox when the block exits, also on a throw", async () => {
    const server = await daemonWith(() => {});
    try {
      const kills = () =>
        server.received.filter((r) => r.method === "DELETE" && r.url === `/v1/sandboxes/${ID}`).length;
      {
        await using sandbox = await sandboxOn(server);
        assert.equal(sandbox.id, ID);
        assert.equal(kills(), 0);
      }
      assert.equal(kills(), 1);
      await assert.rejects(async () => {
        await using _sandbox = await sandboxOn(server);
        throw new Error("agent code failed");
      }, /agent code failed/);
      assert.equal(kills(), 2);
    } finally {
      await server.close();
    }
  });

  it("defines Symbol.asyncDispose where it is missing, as Node's registered symbol, read-only", () => {
    const realm = vm.runInNewContext("Symbol") as SymbolConstructor;
    assert.equal(typeof realm.asyncDispose, "undefined", "a fresh V8 realm of Node 20 lacks it");
    const symbol = installAsyncDisposeSymbol(realm);
    assert.equal(symbol, Symbol.for("nodejs.asyncDispose"));
    assert.equal(realm.asyncDispose, symbol);
    const descriptor = Object.getOwnPropertyDescriptor(realm, "asyncDispose");
    assert.deepEqual(
      {
        writable: descriptor?.writable,
        enumerable: descriptor?.enumerable,
        configurable: descriptor?.configurable,
      },
      { writable: false, enumerable: false, configurable: false },
    );
    assert.equal(installAsyncDisposeSymbol(realm), symbol, "idempotent");
    assert.equal(installAsyncDisposeSymbol(), Symbol.asyncDispose, "leaves an existing symbol alone");
  });
});

async function waitUntil(check: () => boolean, what: string, timeoutMs = 3000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}
