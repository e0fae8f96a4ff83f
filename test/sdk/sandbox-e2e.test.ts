/**
 * The SDK end to end: a real `forkd daemon` (Unix socket + TCP with a token) serving real QEMU sandboxes forked
 * from a warm pyagent snapshot. Every sandbox a test makes is killed even when the test fails, and its id is
 * printed with the daemon's log on failure; the daemon's stop asserts no QEMU is left.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import path from "node:path";
import { after, before, describe, it, type TestContext } from "node:test";
import { promisify } from "node:util";
import {
  AuthenticationError,
  CommandExitError,
  ConflictError,
  Controller,
  NotFoundError,
  Sandbox,
  SandboxNotFoundError,
} from "../../src/sdk/index.js";
import { REPO_ROOT } from "../support/examples.js";
import { qemusMentioning } from "../support/host.js";
import { startDaemon, type TestDaemon } from "./daemon-fixture.js";

describe("SDK against a real daemon and real VMs", { timeout: 20 * 60_000 }, () => {
  let daemon: TestDaemon;

  before(async () => {
    daemon = await startDaemon();
  });

  after(async () => {
    await daemon?.stop();
  });

  /** Creates a sandbox over the Unix socket, logs its id if the test fails, always kills it. */
  async function withSandbox<T>(t: TestContext, body: (sandbox: Sandbox) => Promise<T>): Promise<T> {
    const sandbox = await Sandbox.create({ snapshotTag: daemon.tag, url: daemon.socketUrl, env: {} });
    try {
      return await body(sandbox);
    } catch (err) {
      t.diagnostic(`sandbox ${sandbox.id} failed; daemon log:\n${daemon.log()}`);
      throw err;
    } finally {
      await sandbox.kill();
    }
  }

  it("creates a sandbox from a snapshot and reports it running", async (t) => {
    await withSandbox(t, async (sandbox) => {
      assert.match(sandbox.id, /^sb-[0-9a-f]{12}$/);
      assert.equal(sandbox.sandboxId, sandbox.id);
      assert.equal(sandbox.info.snapshot_tag, daemon.tag);
      assert.equal(sandbox.info.status, "running");
      const expires = sandbox.info.expires_at_unix_ms ?? 0;
      assert.ok(
        expires > Date.now() + 200_000 && expires <= Date.now() + 300_000,
        "default lifetime is 5 minutes",
      );
      assert.equal(await sandbox.isRunning(), true);
      const ping = await sandbox.ping();
      assert.equal(ping.pong, true);
      assert.equal(ping.sandbox_id, sandbox.id);
      const again = await Sandbox.connect(sandbox.id, { url: daemon.socketUrl, env: {} });
      assert.equal((await again.commands.run("hostname")).exitCode, 0);
    });
  });

  it("commands.run streams output to the callbacks while the command runs", async (t) => {
    await withSandbox(t, async (sandbox) => {
      const arrivals: { stream: string; data: string; at: number }[] = [];
      const started = Date.now();
      const result = await sandbox.commands.run(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.5; done; echo ünïcødé",
        {
          onStdout: (data) => void arrivals.push({ stream: "out", data, at: Date.now() }),
          onStderr: (data) => void arrivals.push({ stream: "err", data, at: Date.now() }),
        },
      );
      const finished = Date.now();
      assert.equal(result.exitCode, 0);
      assert.equal(result.stdout, "out1\nout2\nout3\nünïcødé\n");
      assert.equal(result.stderr, "err1\nerr2\nerr3\n");
      assert.equal(
        arrivals
          .filter((a) => a.stream === "out")
          .map((a) => a.data)
          .join(""),
        result.stdout,
      );
      const first = arrivals.find((a) => a.data.includes("out1"));
      assert.ok(first, "out1 arrived through the callback");
      assert.ok(
        finished - first.at >= 800,
        `out1 arrived ${finished - first.at} ms before the end (not streamed?)`,
      );
      t.diagnostic(`first chunk after ${first.at - started} ms, command done after ${finished - started} ms`);
    });
  });

  it("a non-zero exit throws CommandExitError with the command's output; a timeout kills it", async (t) => {
    await withSandbox(t, async (sandbox) => {
      await assert.rejects(sandbox.commands.run("echo partial; echo oops >&2; exit 7"), (err: unknown) => {
        assert.ok(err instanceof CommandExitError);
        assert.equal(err.exitCode, 7);
        assert.equal(err.stdout, "partial\n");
        assert.equal(err.stderr, "oops\n");
        assert.match(err.message, /exited with code 7: oops/);
        return true;
      });
      await assert.rejects(sandbox.commands.run(["sleep", "30"], { timeoutMs: 1_000 }), (err: unknown) => {
        assert.ok(err instanceof CommandExitError);
        assert.equal(err.timedOut, true);
        assert.notEqual(err.exitCode, 0);
        return true;
      });
      const env = await sandbox.commands.run("echo $GREETING; pwd", {
        envs: { GREETING: "hi there" },
        cwd: "/tmp",
      });
      assert.equal(env.stdout, "hi there\n/tmp\n");
    });
  });

  it("stdin reaches the command, whole or streamed while it runs", async (t) => {
    await withSandbox(t, async (sandbox) => {
      assert.equal((await sandbox.commands.run(["wc", "-c"], { stdin: "12345" })).stdout.trim(), "5");
      let echoed = "";
      async function* lines(): AsyncGenerator<string> {
        yield "first\n";
        const deadline = Date.now() + 30_000;
        while (!echoed.includes("first") && Date.now() < deadline)
          await new Promise((r) => setTimeout(r, 20));
        yield "second\n";
      }
      const result = await sandbox.commands.run(["cat"], {
        stdin: lines(),
        onStdout: (data) => {
          echoed += data;
        },
      });
      assert.equal(result.stdout, "first\nsecond\n");
    });
  });

  it("aborting a command disconnects and the daemon kills it in the guest", async (t) => {
    await withSandbox(t, async (sandbox) => {
      const ac = new AbortController();
      const running = sandbox.commands.run("echo started; exec sleep 1000", {
        signal: ac.signal,
        onStdout: () => ac.abort(),
      });
      await assert.rejects(
        running,
        (err: unknown) => err instanceof DOMException && err.name === "AbortError",
      );
      let left = "?";
      for (let i = 0; i < 50 && left !== ""; i++) {
        left = (await sandbox.commands.run("pgrep -x sleep || true")).stdout.trim();
        if (left !== "") await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(left, "", "the aborted command's process is gone");
    });
  });

  it("runCode evaluates in the warm interpreter and returns Python errors as data", async (t) => {
    await withSandbox(t, async (sandbox) => {
      const ok = await sandbox.runCode("x = 6 * 7\nprint('hi')\nx");
      assert.deepEqual(ok, { result: "42", stdout: "hi\n", stderr: "", error: null });
      const numpy = await sandbox.runCode("import numpy\nint(numpy.arange(5).sum())");
      assert.equal(numpy.result, "10");
      const failed = await sandbox.runCode("print('before')\n1/0");
      assert.equal(failed.stdout, "before\n");
      assert.equal(failed.result, null);
      assert.equal(failed.error?.name, "ZeroDivisionError");
      assert.equal(failed.error?.value, "division by zero");
      assert.match(failed.error?.traceback ?? "", /ZeroDivisionError/);
    });
  });

  it("files: binary round trip, text, list, stat, remove; a missing file is not a missing sandbox", async (t) => {
    await withSandbox(t, async (sandbox) => {
      const bytes = Buffer.concat([
        Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
        randomBytes(1 << 20),
      ]);
      const written = await sandbox.files.write("/tmp/sdk/data.bin", bytes, { mode: 0o640 });
      assert.deepEqual(written, { path: "/tmp/sdk/data.bin", bytes: bytes.length });
      const back = await sandbox.files.read("/tmp/sdk/data.bin", { format: "bytes" });
      assert.ok(Buffer.from(back).equals(bytes), "bytes read back equal the bytes written");
      const sum = await sandbox.commands.run(["sha256sum", "/tmp/sdk/data.bin"]);
      assert.equal(
        sum.stdout.split(" ")[0],
        (await import("node:crypto")).createHash("sha256").update(bytes).digest("hex"),
      );

      await sandbox.files.write("/tmp/sdk/note.txt", "grüße ✓\n");
      assert.equal(await sandbox.files.read("/tmp/sdk/note.txt"), "grüße ✓\n");

      const info = await sandbox.files.stat("/tmp/sdk/data.bin");
      assert.equal(info.type, "file");
      assert.equal(info.size, bytes.length);
      assert.equal(info.mode & 0o777, 0o640);
      assert.ok(info.modifiedTime instanceof Date);
      const names = (await sandbox.files.list("/tmp/sdk")).map((e) => `${e.name}:${e.type}:${e.path}`).sort();
      assert.deepEqual(names, ["data.bin:file:/tmp/sdk/data.bin", "note.txt:file:/tmp/sdk/note.txt"]);

      await sandbox.files.remove("/tmp/sdk", { recursive: true });
      assert.equal(await sandbox.files.exists("/tmp/sdk/data.bin"), false);
      await assert.rejects(sandbox.files.read("/tmp/sdk/data.bin"), (err: unknown) => {
        assert.ok(err instanceof NotFoundError);
        assert.ok(!(err instanceof SandboxNotFoundError), "the sandbox is still there");
        return true;
      });
    });
  });

  it("`await using` kills the sandbox when the block ends, and its QEMU is gone", async () => {
    let id = "";
    {
      await using sandbox = await Sandbox.create({ snapshotTag: daemon.tag, url: daemon.socketUrl, env: {} });
      id = sandbox.id;
      assert.equal((await sandbox.commands.run("echo alive")).stdout, "alive\n");
      assert.ok((await qemusMentioning(id)).length > 0, "its QEMU runs inside the block");
    }
    await assert.rejects(daemon.controller.getSandbox(id), NotFoundError);
    assert.deepEqual(await qemusMentioning(id), []);
  });

  it("setTimeout shortens the lifetime; a call after expiry says the sandbox is gone and why", async (t) => {
    const sandbox = await Sandbox.create({
      snapshotTag: daemon.tag,
      url: daemon.socketUrl,
      env: {},
      timeoutMs: 0,
    });
    try {
      assert.equal(sandbox.info.expires_at_unix_ms, null, "timeoutMs 0 = no lifetime limit");
      await sandbox.setTimeout(1_000);
      const deadline = Date.now() + 30_000;
      while ((await sandbox.isRunning()) && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 200));
      assert.equal(await sandbox.isRunning(), false, "expired sandbox was killed");
      await assert.rejects(sandbox.commands.run("true"), (err: unknown) => {
        assert.ok(err instanceof SandboxNotFoundError, String(err));
        assert.match(
          err.message,
          /(no longer exists|is being stopped) \(killed, or its lifetime ran out\).*sandbox\.setTimeout/,
        );
        return true;
      });
    } catch (err) {
      t.diagnostic(`sandbox ${sandbox.id}; daemon log:\n${daemon.log()}`);
      throw err;
    } finally {
      await sandbox.kill();
    }
  });

  it("pause() then Sandbox.connect resumes it where it was; Sandbox.resume of a running one is a conflict", async (t) => {
    await withSandbox(t, async (sandbox) => {
      await sandbox.runCode("kept = [1, 2, 3]");
      await sandbox.files.write("/root/before-pause", "written\n");
      const paused = await sandbox.pause();
      assert.equal(paused.sandbox.status, "paused");
      assert.equal(paused.sandbox.id, sandbox.id);
      assert.ok(paused.bytes_stored > 0 && paused.freed_bytes > 0, JSON.stringify(paused));
      assert.equal(await sandbox.isRunning(), false);
      const listed = await Sandbox.list({ status: "paused", url: daemon.socketUrl, env: {} });
      assert.deepEqual(
        listed.map((s) => s.id),
        [sandbox.id],
      );
      await assert.rejects(sandbox.runCode("kept"), (err: unknown) => {
        assert.ok(err instanceof ConflictError, `${err}`);
        assert.match(err.message, /paused/);
        return true;
      });
      await assert.rejects(sandbox.pause(), ConflictError);
      const again = await Sandbox.connect(sandbox.id, { url: daemon.socketUrl, env: {} });
      assert.equal(again.id, sandbox.id);
      assert.equal(again.info.status, "running");
      assert.equal((await again.runCode("kept")).result, "[1, 2, 3]");
      assert.equal(await again.files.read("/root/before-pause"), "written\n");
      await assert.rejects(Sandbox.resume(sandbox.id, { url: daemon.socketUrl, env: {} }), ConflictError);
      await assert.rejects(
        Sandbox.resume("sb-000000000000", { url: daemon.socketUrl, env: {} }),
        SandboxNotFoundError,
      );
    });
  });

  it("over TCP: works with the token, names FORKD_TOKEN without one, refuses a wrong one", async (t) => {
    const sandbox = await Sandbox.create({
      snapshotTag: daemon.tag,
      url: daemon.tcpUrl,
      token: daemon.token,
      env: {},
    });
    try {
      assert.equal((await sandbox.commands.run("echo over tcp")).stdout, "over tcp\n");
      assert.equal((await sandbox.runCode("1 + 1")).result, "2");
    } catch (err) {
      t.diagnostic(`sandbox ${sandbox.id}; daemon log:\n${daemon.log()}`);
      throw err;
    } finally {
      await sandbox.kill();
    }
    await assert.rejects(new Controller({ url: daemon.tcpUrl, env: {} }).listSandboxes(), (err: unknown) => {
      assert.ok(err instanceof AuthenticationError);
      assert.match(err.message, /no token was sent: set FORKD_TOKEN/);
      return true;
    });
    await assert.rejects(
      new Controller({ env: { FORKD_URL: daemon.tcpUrl, FORKD_TOKEN: "x".repeat(32) } }).listSandboxes(),
      (err: unknown) =>
        err instanceof AuthenticationError && /the token from FORKD_TOKEN was refused/.test(err.message),
    );
    assert.ok(await new Controller({ url: daemon.tcpUrl, env: {} }).isReachable(), "/healthz needs no token");
  });

  it("Controller: snapshots, spawn of several, exec/eval compatible shapes, kill", async () => {
    const controller = daemon.controller;
    const snapshots = await controller.listSnapshots();
    assert.ok(snapshots.some((s) => s.tag === daemon.tag && s.status === "ready" && s.bootable));
    const detail = await controller.getSnapshot(daemon.tag);
    assert.equal(detail.chain_depth, 0);
    const spawned = await controller.spawnSandboxes({ snapshotTag: daemon.tag, n: 2, timeoutMs: 120_000 });
    try {
      assert.equal(spawned.length, 2);
      const [a, b] = spawned.map((s) => s.id) as [string, string];
      const listed = (await controller.listSandboxes({ snapshotTag: daemon.tag })).map((s) => s.id);
      assert.ok(listed.includes(a) && listed.includes(b));
      const exec = await controller.execCommand(a, ["python3", "-c", "print(2+2)"], { timeoutSecs: 30 });
      assert.equal(exec.stdout, "4\n");
      assert.equal(exec.exit_code, 0);
      const evaluated = await controller.evalCode(b, "import numpy; numpy.zeros(5).sum()");
      assert.deepEqual([evaluated.result, evaluated.error, evaluated.exit_code], ["0.0", null, 0]);
      await assert.rejects(controller.spawnSandboxes({ snapshotTag: "no-such-tag" }), NotFoundError);
      await assert.rejects(
        Sandbox.connect("sb-000000000000", { url: daemon.socketUrl, env: {} }),
        SandboxNotFoundError,
      );
    } finally {
      for (const s of spawned) await controller.killSandbox(s.id).catch(() => {});
    }
    await assert.rejects(controller.killSandbox(spawned[0]?.id ?? ""), NotFoundError);
  });

  it("the examples in examples/sdk run against the daemon", async () => {
    const root = REPO_ROOT;
    const env = { ...process.env, FORKD_URL: daemon.socketUrl, FORKD_SNAPSHOT: daemon.tag };
    const run = (file: string, ...args: string[]) =>
      promisify(execFile)(
        process.execPath,
        ["--import", "tsx", path.join(root, "examples/sdk", file), ...args],
        {
          env,
          cwd: root,
          timeout: 5 * 60_000,
        },
      );
    const quick = await run("quickstart.ts");
    assert.match(quick.stdout, /sandbox sb-[0-9a-f]{12} is running/);
    assert.match(quick.stdout, /\| tick 3/);
    assert.match(quick.stdout, /failed as expected: exit 3/);
    assert.match(quick.stdout, /runCode: result=45 stdout="computing\\n" error=null/);
    assert.match(quick.stdout, /file round trip: 256 bytes, equal=true/);
    const fan = await run("fan-out.ts", "3");
    assert.equal((fan.stdout.match(/sb-[0-9a-f]{12}/g) ?? []).length, 3, fan.stdout);
    assert.deepEqual(await daemon.controller.listSandboxes(), [], "the examples killed their sandboxes");
  });

  it("Sandbox.create({ template }) builds the template's snapshot once, even when two ask at once", async (t) => {
    const settings = { url: daemon.socketUrl, env: {} };
    const started = Date.now();
    const created = await Promise.allSettled([
      Sandbox.create("pyagent", settings),
      Sandbox.create({ template: "pyagent", ...settings }),
    ]);
    const sandboxes = created.flatMap((c) => (c.status === "fulfilled" ? [c.value] : []));
    try {
      for (const c of created) if (c.status === "rejected") throw c.reason;
      t.diagnostic(`two creates from a template without a snapshot took ${Date.now() - started} ms`);
      for (const sandbox of sandboxes) {
        assert.equal(sandbox.info.snapshot_tag, "pyagent");
        assert.equal((await sandbox.runCode("FORKD_WARM_MARKER")).result, "'warm'");
      }
      const snapshot = await daemon.controller.getSnapshot("pyagent");
      assert.equal(snapshot.template, "pyagent");
      assert.equal(snapshot.status, "ready");
    } finally {
      for (const sandbox of sandboxes) await sandbox.kill();
    }
    await daemon.controller.deleteSnapshot("pyagent");
  });

  it("sandbox.branch: a child of the branch continues the source's Python state; the branch outlives its source", async (t) => {
    let tag = "";
    await withSandbox(t, async (source) => {
      await source.runCode("answer = 41");
      const branched = await source.branch({ mode: "diff" });
      tag = branched.tag;
      await using child = await Sandbox.create({ snapshotTag: branched.tag, url: daemon.socketUrl, env: {} });
      assert.equal((await child.runCode("answer + 1")).result, "42");
      assert.equal((await source.runCode("answer")).result, "41", "the source keeps running");
      // While the source runs, its disk runs through the branch's layer: the branch cannot be deleted.
      await assert.rejects(daemon.controller.deleteSnapshot(branched.tag), ConflictError);
      await child.kill();
    });
    await daemon.controller.deleteSnapshot(tag);
  });
});
