/** QmpClient against a real paused QEMU, and against a hostile peer on a real unix socket. */
import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { describe, type TestContext, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { type QemuProcess, spawnQemu } from "../../src/vmm/qemu-process.js";
import { MAX_QMP_LINE_BYTES, QmpClient, QmpError, type QmpEvent } from "../../src/vmm/qmp.js";
import { pausedQemuArgs, tempDir, waitUntil } from "./helpers.js";

async function pausedQemu(t: TestContext): Promise<{ qemu: QemuProcess; qmp: QmpClient }> {
  const dir = tempDir(t);
  const socketPath = path.join(dir, "qmp.sock");
  const qemu = await spawnQemu({ args: pausedQemuArgs(socketPath) });
  t.after(() => qemu.kill({ graceMs: 0 }));
  await waitUntil(
    "QEMU created its QMP socket",
    () => fs.existsSync(socketPath) || qemu.exitStatus !== undefined,
  );
  const qmp = await QmpClient.connect(socketPath, { describeClose: () => qemu.describeSoon() });
  t.after(() => qmp.close());
  return { qemu, qmp };
}

describe("QmpClient with a real QEMU", () => {
  test("greeting, capabilities and query-status of a paused VM", async (t) => {
    const { qmp } = await pausedQemu(t);
    assert.equal(qmp.greeting.version.qemu.major >= 7, true);
    const status = await qmp.execute<{ status: string; running: boolean }>("query-status");
    assert.equal(status.status, "prelaunch");
    assert.equal(status.running, false);
  });

  test("RESUME and STOP events arrive for cont and stop, via waitEvent and the events() iterator", async (t) => {
    const { qmp } = await pausedQemu(t);
    const seen: string[] = [];
    const iterator = qmp.events();
    const collected = (async () => {
      for await (const event of iterator) {
        seen.push(event.event);
        if (event.event === "STOP") break;
      }
    })();
    const resumed = qmp.waitEvent("RESUME");
    await qmp.execute("cont");
    const resume: QmpEvent = await resumed;
    assert.equal(resume.event, "RESUME");
    assert.ok(resume.timestamp.seconds > 0);
    assert.equal((await qmp.execute<{ running: boolean }>("query-status")).running, true);

    const stopped = qmp.waitEvent("STOP", { predicate: (e) => e.event === "STOP" });
    await qmp.execute("stop");
    await stopped;
    await collected;
    assert.deepEqual(seen, ["RESUME", "STOP"]);
    assert.equal((await qmp.execute<{ status: string }>("query-status")).status, "paused");
  });

  test("errors map to QmpError with class, description and a catalogue code", async (t) => {
    const { qmp } = await pausedQemu(t);
    await assert.rejects(qmp.execute("no-such-command"), (err: unknown) => {
      assert.ok(err instanceof QmpError);
      assert.equal(err.qmpClass, "CommandNotFound");
      assert.equal(err.code, "not_implemented");
      assert.match(err.desc, /no-such-command/);
      // The stack points at the caller, not at the socket callback.
      assert.match(err.stack ?? "", /qmp\.test\.[jt]s/);
      return true;
    });
    await assert.rejects(qmp.execute("device_del", { id: "no-such-device" }), (err: unknown) => {
      assert.ok(err instanceof QmpError);
      assert.equal(err.qmpClass, "DeviceNotFound");
      assert.equal(err.code, "not_found");
      return true;
    });
    await assert.rejects(
      qmp.execute("qom-get", { path: "/machine", property: "no-such-property" }),
      (err: unknown) => {
        assert.ok(err instanceof QmpError);
        assert.equal(err.qmpClass, "GenericError");
        return true;
      },
    );
    // The connection is still usable after errors.
    assert.equal((await qmp.execute<{ status: string }>("query-status")).status, "prelaunch");
  });

  test("pending commands and event waits reject with the QEMU exit reason when QEMU is killed", async (t) => {
    const { qemu, qmp } = await pausedQemu(t);
    qemu.signalGroup("SIGSTOP"); // QEMU can no longer answer: the next command stays pending.
    const pending = qmp.execute("query-status");
    const eventWait = qmp.waitEvent("RESUME");
    await new Promise((resolve) => setTimeout(resolve, 100));
    qemu.signalGroup("SIGKILL");
    await assert.rejects(pending, (err: unknown) => {
      assert.ok(err instanceof ForkdError);
      assert.equal(err.code, "unavailable");
      assert.match(
        err.message,
        /query-status got no reply: QMP (connection closed|socket error: .*) \(QEMU \(pid \d+\) was killed by SIGKILL/,
      );
      return true;
    });
    await assert.rejects(eventWait, /RESUME never came/);
    await assert.rejects(qmp.execute("query-status"), /not sent/);
    assert.equal(qmp.closed, true);
  });

  test("an aborted command rejects at once; its late reply is ignored and the client stays usable", async (t) => {
    const { qemu, qmp } = await pausedQemu(t);
    qemu.signalGroup("SIGSTOP");
    const controller = new AbortController();
    const pending = qmp.execute("query-status", undefined, { signal: controller.signal });
    controller.abort(new ForkdError("unavailable", "caller gave up"));
    await assert.rejects(pending, /caller gave up/);
    qemu.signalGroup("SIGCONT");
    assert.equal((await qmp.execute<{ status: string }>("query-name")) !== undefined, true);
    await assert.rejects(
      qmp.execute("query-status", undefined, { timeoutMs: 1, signal: AbortSignal.abort() }),
    );
  });
});

describe("QmpClient with a hostile peer", () => {
  async function fakeQemu(t: TestContext, onConnection: (socket: net.Socket) => void): Promise<string> {
    const socketPath = path.join(tempDir(t), "fake.sock");
    const server = net.createServer(onConnection);
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    t.after(() => server.close());
    return socketPath;
  }
  const greeting = `${JSON.stringify({ QMP: { version: { qemu: { major: 7, minor: 2, micro: 0 } }, capabilities: [] } })}\r\n`;

  test("a line longer than MAX_QMP_LINE_BYTES closes the connection and rejects pending calls", async (t) => {
    const socketPath = await fakeQemu(t, (socket) => {
      socket.write(greeting);
      socket.once("data", () => {
        socket.write(`${JSON.stringify({ return: {}, id: "forkd-1" })}\n`);
        socket.once("data", () => {
          // Never a newline: the client must give up instead of buffering forever.
          socket.write(Buffer.alloc(MAX_QMP_LINE_BYTES + 1024, 0x61));
        });
      });
      socket.on("error", () => {});
    });
    const qmp = await QmpClient.connect(socketPath);
    await assert.rejects(qmp.execute("query-status"), /protocol error from QEMU: line too long/);
    assert.equal(qmp.closed, true);
  });

  test("malformed JSON closes the connection with a protocol error", async (t) => {
    const socketPath = await fakeQemu(t, (socket) => {
      socket.write(greeting);
      socket.once("data", () => socket.write(`${JSON.stringify({ return: {}, id: "forkd-1" })}\n`));
      socket.on("data", (data) => {
        if (data.toString().includes("query-status")) socket.write("{not json\n");
      });
      socket.on("error", () => {});
    });
    const qmp = await QmpClient.connect(socketPath);
    await assert.rejects(qmp.execute("query-status"), /not JSON/);
  });

  test("a peer that never greets fails the handshake within the caller's deadline", async (t) => {
    const socketPath = await fakeQemu(t, (socket) => socket.on("error", () => {}));
    const started = Date.now();
    await assert.rejects(
      QmpClient.connect(socketPath, { signal: AbortSignal.timeout(200) }),
      /deadline exceeded/,
    );
    assert.ok(Date.now() - started < 5000);
  });

  test("invalid command names are refused before anything is sent", async (t) => {
    const socketPath = await fakeQemu(t, (socket) => {
      socket.write(greeting);
      socket.once("data", () => socket.write(`${JSON.stringify({ return: {}, id: "forkd-1" })}\n`));
      socket.on("error", () => {});
    });
    const qmp = await QmpClient.connect(socketPath);
    t.after(() => qmp.close());
    await assert.rejects(qmp.execute('quit", "x": "'), /invalid QMP command name/);
  });
});
