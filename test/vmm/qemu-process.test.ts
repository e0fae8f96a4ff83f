/** QEMU processes: process groups, graceful and forced kill, early-exit errors, and no stray QEMU ever. */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { ForkdError } from "../../src/common/errors.js";
import { launchVm } from "../../src/vmm/launch.js";
import { liveQemuProcesses, spawnQemu } from "../../src/vmm/qemu-process.js";
import { QmpClient } from "../../src/vmm/qmp.js";
import { pausedQemuArgs, processAlive, processGroup, tempDir, waitUntil } from "./helpers.js";

const here = fileURLToPath(import.meta.url);
const hostProgram = path.join(path.dirname(here), `host-program${path.extname(here)}`);

/** Runs host-program in its own Node process; resolves with the QEMU pid it started and its exit. */
async function runHostProgram(mode: string, dir: string, onStarted?: (hostPid: number) => void) {
  const loader = path.extname(here) === ".ts" ? ["--import", "tsx"] : [];
  const host = spawn(process.execPath, [...loader, hostProgram, mode, dir], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  host.stderr.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const started = new Promise<{ qemuPid: number; hostPid: number }>((resolve, reject) => {
    host.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
      const line = stdout.split("\n")[0];
      if (stdout.includes("\n") && line) resolve(JSON.parse(line));
    });
    host.once("exit", () => reject(new Error(`host program exited before starting QEMU: ${stderr}`)));
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    host.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const ids = await started;
  onStarted?.(ids.hostPid);
  return { ...ids, exited, stderr: () => stderr };
}

/**
 * Until QEMU's main loop runs, SIGTERM's default action kills it outright (its QMP socket exists before its
 * signal handlers do), so tests of the graceful path first wait for a QMP answer.
 */
async function untilQmpAnswers(t: TestContext, socketPath: string): Promise<void> {
  await waitUntil("QMP socket exists", () => fs.existsSync(socketPath));
  const qmp = await QmpClient.connect(socketPath);
  t.after(() => qmp.close());
  await qmp.execute("query-status");
}

describe("QEMU process", () => {
  test("runs as leader of its own process group; kill() leaves no process behind", async (t) => {
    const dir = tempDir(t);
    const qemu = await spawnQemu({ args: pausedQemuArgs(path.join(dir, "qmp.sock")) });
    t.after(() => qemu.kill({ graceMs: 0 }));
    await untilQmpAnswers(t, path.join(dir, "qmp.sock"));
    assert.equal(processGroup(qemu.pid), qemu.pid);
    assert.notEqual(processGroup(qemu.pid), processGroup(process.pid));
    assert.ok(liveQemuProcesses().includes(qemu));
    const exit = await qemu.kill({ graceMs: 2000 });
    // SIGTERM is graceful for QEMU: it logs "terminating on signal 15" and exits 0.
    assert.deepEqual(exit, { code: 0, signal: null });
    assert.match(qemu.outputTail(), /terminating on signal 15/);
    assert.equal(processAlive(qemu.pid), false);
    assert.ok(!liveQemuProcesses().includes(qemu));
  });

  test("a QEMU that ignores the graceful request is SIGKILLed after graceMs", async (t) => {
    const dir = tempDir(t);
    const qemu = await spawnQemu({ args: pausedQemuArgs(path.join(dir, "qmp.sock")) });
    t.after(() => qemu.kill({ graceMs: 0 }));
    await untilQmpAnswers(t, path.join(dir, "qmp.sock"));
    qemu.signalGroup("SIGSTOP"); // a stopped process cannot act on SIGTERM
    const started = Date.now();
    const exit = await qemu.kill({ graceMs: 300 });
    assert.equal(exit.signal, "SIGKILL");
    assert.ok(Date.now() - started >= 290);
    assert.equal(processAlive(qemu.pid), false);
  });

  test("QEMU failing at start: its stderr explains why", async () => {
    const qemu = await spawnQemu({ args: ["-no-such-option"] });
    const exit = await qemu.exited;
    assert.equal(exit.code, 1);
    assert.match(
      qemu.describe(),
      /exited with code 1; its output ends with: .*-no-such-option: invalid option/,
    );
  });

  test("launchVm: QEMU exiting early rejects QMP and agent waits with its stderr tail", async (t) => {
    const dir = tempDir(t);
    const vm = await launchVm({
      accel: "tcg",
      cpuModel: "max",
      memoryMiB: 64,
      vcpus: 1,
      kernel: path.join(dir, "no-such-kernel"),
      initrd: path.join(dir, "no-such-initrd"),
      kernelCmdline: "console=ttyS0",
      disk: null,
      agent: { socketPath: path.join(dir, "agent.sock") },
      qmpSocketPath: path.join(dir, "qmp.sock"),
      consoleLogPath: path.join(dir, "console.log"),
    });
    t.after(() => vm.kill({ graceMs: 0 }));
    await assert.rejects(vm.qmp(), (err: unknown) => {
      assert.ok(err instanceof ForkdError);
      assert.match(
        err.message,
        /QEMU stopped before QMP was ready: .*exited with code 1.*could not (load|open) kernel/s,
      );
      return true;
    });
    // QEMU connects the agent chardev before it loads the kernel, so the connection itself may have succeeded.
    await vm.agentConnection.then(
      (socket) => socket.destroy(),
      (err: Error) => assert.match(err.message, /could not (load|open) kernel/),
    );
    await vm.exited;
    assert.equal(processAlive(vm.pid), false);
  });

  test("a missing QEMU binary is a clear 'unavailable' error", async () => {
    await assert.rejects(
      spawnQemu({ args: [], binary: "/nonexistent/qemu-system-x86_64" }),
      (err: unknown) => {
        assert.ok(err instanceof ForkdError);
        assert.equal(err.code, "unavailable");
        assert.match(err.message, /ENOENT.*FORKD_QEMU_BINARY/);
        return true;
      },
    );
  });
});

describe("no stray QEMU after the host program ends", () => {
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    test(`${signal} to the host program kills its QEMU and the program still dies of ${signal}`, async (t) => {
      const dir = tempDir(t);
      const run = await runHostProgram("wait", dir);
      t.after(() => {
        if (processAlive(run.qemuPid)) process.kill(run.qemuPid, "SIGKILL");
      });
      assert.equal(processAlive(run.qemuPid), true);
      process.kill(run.hostPid, signal);
      const exit = await run.exited;
      assert.equal(exit.signal, signal, `host program stderr: ${run.stderr()}`);
      await waitUntil(`QEMU pid ${run.qemuPid} is gone`, () => !processAlive(run.qemuPid), 5000);
    });
  }

  test("a signal the host program handles itself (the daemon's SIGHUP) leaves its QEMU running", async (t) => {
    const dir = tempDir(t);
    const run = await runHostProgram("handle-hup", dir);
    t.after(() => {
      if (processAlive(run.hostPid)) process.kill(run.hostPid, "SIGKILL");
      if (processAlive(run.qemuPid)) process.kill(run.qemuPid, "SIGKILL");
    });
    process.kill(run.hostPid, "SIGHUP");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(processAlive(run.hostPid), true, "the program handled it and runs on");
    assert.equal(processAlive(run.qemuPid), true, "its QEMU was not killed");
    process.kill(run.hostPid, "SIGTERM");
    assert.equal((await run.exited).signal, "SIGTERM");
    await waitUntil(`QEMU pid ${run.qemuPid} is gone`, () => !processAlive(run.qemuPid), 5000);
  });

  for (const mode of ["exit", "throw"]) {
    test(`host program ending by ${mode === "exit" ? "process.exit()" : "an uncaught exception"} kills its QEMU`, async (t) => {
      const dir = tempDir(t);
      const run = await runHostProgram(mode, dir);
      t.after(() => {
        if (processAlive(run.qemuPid)) process.kill(run.qemuPid, "SIGKILL");
      });
      const exit = await run.exited;
      assert.notEqual(exit.code, 0);
      await waitUntil(`QEMU pid ${run.qemuPid} is gone`, () => !processAlive(run.qemuPid), 5000);
    });
  }
});
