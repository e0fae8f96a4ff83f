/**
 * Pause and resume through the unmodified `e2b` and `@e2b/code-interpreter` SDKs against a real forkd daemon
 * with real VMs: pause(), getInfo/list by state, connect() resuming with the interpreter, files, a background
 * command and a pty shell continuing; lifecycle onTimeout 'pause' with autoResume waking on a command and on a
 * WebSocket upgrade to one of its ports (with its token; without one: 502 naming it paused); the
 * filesystem-only pause (keepMemory: false): its files kept, its processes gone, resumed by a cold boot, and what
 * forkd refuses around it answered in E2B's error shape.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { Sandbox, SandboxError } from "@e2b/code-interpreter";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";
import { throughWebSocket as throughDaemonWebSocket, WS_ECHO } from "../support/guest-programs.js";
import { waitFor } from "../support/host.js";

const root = process.getuid?.() === 0;

describe("E2B pause and resume on a real forkd daemon", { timeout: 30 * 60_000 }, () => {
  let daemon: TestDaemon;
  const saved = { ...process.env };

  before(async () => {
    daemon = await startDaemon(["--default-snapshot", "shared-pyagent"]);
    process.env.E2B_API_URL = daemon.tcpUrl;
    process.env.E2B_SANDBOX_URL = daemon.tcpUrl;
    process.env.E2B_API_KEY = daemon.token;
  });
  after(async () => {
    process.env = saved;
    if (daemon) {
      const log = daemon.log();
      await daemon.stop().catch((err: unknown) => {
        throw new Error(`${(err as Error).message}\ndaemon log:\n${log.slice(-4000)}`);
      });
    }
  });

  const throughWebSocket = (headers: Record<string, string>, message: string) =>
    throughDaemonWebSocket(daemon.tcpUrl, headers, message);

  it("pause(), then connect() resumes it where it was", async () => {
    const sbx = await Sandbox.create({ timeoutMs: 600_000, metadata: { suite: "pause" } });
    await sbx.runCode("kept = 'from before the pause'");
    await sbx.files.write("/home/user/note.txt", "written before the pause");
    const ticker = await sbx.commands.run(
      "i=0; while :; do i=$((i+1)); echo $i > /tmp/ticks; sleep 0.2; done",
      { background: true },
    );
    let screen = "";
    const decoder = new TextDecoder();
    const terminal = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (data) => {
        screen += decoder.decode(data, { stream: true });
      },
    });
    await sbx.pty.sendInput(
      terminal.pid,
      new TextEncoder().encode("cd /tmp && PTYVAR=still-$((40+2)) && echo set-$PTYVAR\n"),
    );
    await waitFor("the shell", 30_000, async () => (screen.includes("set-still-42") ? true : undefined));
    await waitFor("ticks", 30_000, async () =>
      (await sbx.files.read("/tmp/ticks").catch(() => "")).trim() ? true : undefined,
    );

    assert.equal(await sbx.pause(), true);
    assert.equal(await sbx.pause(), false, "pausing a paused sandbox answers 409: false");
    const info = await Sandbox.getInfo(sbx.sandboxId);
    assert.equal(info.state, "paused");
    const paused = await Sandbox.list({
      query: { state: ["paused"], metadata: { suite: "pause" } },
    }).nextItems();
    assert.deepEqual(
      paused.map((s) => s.sandboxId),
      [sbx.sandboxId],
    );
    const running = await Sandbox.list({
      query: { state: ["running"], metadata: { suite: "pause" } },
    }).nextItems();
    assert.deepEqual(running, []);
    assert.equal(await sbx.isRunning(), false, "a paused sandbox is not running");

    const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 });
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "running");
    assert.equal((await resumed.runCode("kept")).text, "from before the pause");
    assert.equal(await resumed.files.read("/home/user/note.txt"), "written before the pause");
    const ticks = Number((await resumed.files.read("/tmp/ticks")).trim());
    await waitFor("the ticker to go on", 30_000, async () =>
      Number((await resumed.files.read("/tmp/ticks")).trim()) >= ticks + 3 ? true : undefined,
    );
    assert.ok(
      (await resumed.commands.list()).some((p) => p.pid === ticker.pid),
      "the background command is the same process",
    );
    let after = "";
    await resumed.pty.connect(terminal.pid, {
      onData: (data) => {
        after += decoder.decode(data, { stream: true });
      },
    });
    await resumed.pty.sendInput(terminal.pid, new TextEncoder().encode('echo "at:$(pwd):$PTYVAR"\n'));
    await waitFor("the shell's answer", 30_000, async () =>
      after.includes("at:/tmp:still-42") ? true : undefined,
    );
    assert.equal(await resumed.kill(), true);
  });

  it("lifecycle onTimeout 'pause' pauses at the end of its lifetime; autoResume wakes it on a command", async () => {
    const sbx = await Sandbox.create({
      timeoutMs: 4_000,
      lifecycle: { onTimeout: "pause", autoResume: true },
    });
    await sbx.runCode("survivor = 7 * 6");
    const info = await sbx.getInfo();
    assert.deepEqual(info.lifecycle, { onTimeout: "pause", autoResume: true });
    await waitFor("the lifetime's end to pause it", 120_000, async () =>
      (await Sandbox.getInfo(sbx.sandboxId)).state === "paused" ? true : undefined,
    );
    // Any data-plane call with its token resumes it first.
    const ran = await sbx.commands.run("echo awake");
    assert.equal(ran.stdout, "awake\n");
    // As on E2B, an auto-resumed sandbox's lifetime starts again at the resume and is at least five minutes.
    const left = (await sbx.getInfo()).endAt.getTime() - Date.now();
    assert.ok(left > 4 * 60_000 && left <= 5 * 60_000, `lifetime after the auto-resume: ${left} ms`);
    await sbx.setTimeout(600_000);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "running");
    assert.equal((await sbx.runCode("survivor")).text, "42");
    if (root) {
      // Sandbox ports need networks (root). A WebSocket upgrade wakes it too, when it carries its token.
      await sbx.files.write("/tmp/ws_echo.py", WS_ECHO);
      await sbx.commands.run("python3 /tmp/ws_echo.py 8081", { background: true });
      const port = { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8081" };
      await waitFor(
        "the guest's WebSocket server",
        60_000,
        async () => (await throughWebSocket(port, "up").catch(() => undefined))?.echoed,
      );
      await sbx.pause();
      const refused = await throughWebSocket(port, "no token");
      assert.equal(refused.status, 502, "without its token an upgrade does not wake it");
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "paused");
      const token = (sbx as unknown as { trafficAccessToken: string }).trafficAccessToken;
      const woken = await throughWebSocket({ ...port, "e2b-traffic-access-token": token }, "wake up");
      assert.deepEqual(woken, { echoed: "wake up" }, "the server that was listening at the pause answers");
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "running");
    }
    await sbx.pause();
    assert.equal(await Sandbox.kill(sbx.sandboxId), true, "a paused sandbox can be killed");
    assert.equal((await Sandbox.list({ query: { state: ["paused"] } }).nextItems()).length, 0);
  });

  it("pause({ keepMemory: false }) keeps the files, drops the processes; connect() cold-boots it", async () => {
    const sbx = await Sandbox.create({ timeoutMs: 600_000, envs: { GREETING: "from-create" } });
    const id = sbx.sandboxId;
    await sbx.files.write("/home/user/fs-pause.txt", "written before the pause");
    const sleeper = await sbx.commands.run("sleep 3600", { background: true });
    assert.equal(await sbx.pause({ keepMemory: false }), true);
    assert.equal((await Sandbox.getInfo(id)).state, "paused");
    assert.equal(await sbx.pause({ keepMemory: false }), false, "already paused: 409, the SDK's false");
    const control = (path: string, body: object) =>
      fetch(`${daemon.tcpUrl}${path}`, {
        method: "POST",
        headers: { "x-api-key": daemon.token, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    // It has no memory to restore: asking for it is E2B's 400 shape, and changes nothing.
    const refused = await control(`/sandboxes/${id}/resume`, { memory: true });
    assert.equal(refused.status, 400);
    const error = (await refused.json()) as { code: number; message: string };
    assert.equal(error.code, 400);
    assert.match(error.message, /paused with memory: false/);
    const fork = await control(`/sandboxes/${id}/fork`, { count: 1 });
    assert.equal(fork.status, 409, await fork.clone().text());
    assert.equal((await Sandbox.getInfo(id)).state, "paused");

    const resumed = await Sandbox.connect(id, { timeoutMs: 300_000, onResume: "reboot" });
    assert.equal(resumed.sandboxId, id);
    assert.equal((await Sandbox.getInfo(id)).state, "running");
    assert.equal(await resumed.files.read("/home/user/fs-pause.txt"), "written before the pause");
    const pids = (await resumed.commands.list()).map((p) => p.pid);
    assert.ok(!pids.includes(sleeper.pid), `the process from before the pause is gone (${pids.join(",")})`);
    assert.equal((await resumed.commands.run("echo $GREETING")).stdout, "from-create\n");
    // A cold-booted sandbox's memory is no snapshot's: pausing it with memory is refused (501), without works.
    await assert.rejects(resumed.pause(), (err: unknown) => err instanceof SandboxError);
    assert.equal((await Sandbox.getInfo(id)).state, "running");
    assert.equal(await resumed.kill(), true);
  });

  it("onTimeout {action: 'pause', keepMemory: false} pauses without memory; no request wakes it", async () => {
    const refused = await fetch(`${daemon.tcpUrl}/v2/sandboxes`, {
      method: "POST",
      headers: { "x-api-key": daemon.token, "content-type": "application/json" },
      body: JSON.stringify({
        templateID: "base",
        autoPause: true,
        autoPauseMemory: false,
        autoResume: { enabled: true },
      }),
    });
    assert.equal(
      refused.status,
      400,
      "autoResume cannot wake a filesystem-only pause (the SDK refuses it too)",
    );
    assert.equal(((await refused.json()) as { code: number }).code, 400);
    const sbx = await Sandbox.create({
      timeoutMs: 4_000,
      lifecycle: { onTimeout: { action: "pause", keepMemory: false } },
    });
    const kept = path.join(daemon.home, "kept-disks", sbx.sandboxId, "disk.qcow2");
    // E2B's "paused" includes a pause in progress: its kept disk is there once it has finished.
    await waitFor("the lifetime's end to pause it, keeping its disk", 120_000, async () =>
      (await Sandbox.getInfo(sbx.sandboxId)).state === "paused" && existsSync(kept) ? true : undefined,
    );
    // Only an explicit connect resumes it (a cold boot, the case above): a data-plane call does not.
    await assert.rejects(sbx.commands.run("echo awake", { requestTimeoutMs: 30_000 }));
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, "paused");
    assert.equal(await Sandbox.kill(sbx.sandboxId), true);
    assert.equal(existsSync(path.dirname(kept)), false, "a kill removes the kept disk");
  });
});
