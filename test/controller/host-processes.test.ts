/**
 * Signalling processes the daemon did not start: only a process whose identity (pid, start time, boot) matches
 * the record is signalled, a zombie counts as gone, and a reused pid is left alone.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { after, describe, it } from "node:test";
import { currentBootId, identityOf, isAlive, procStatFields } from "../../src/common/processes.js";
import { killAndWait, processesMentioning, signalIfOurs } from "../../src/controller/host/processes.js";
import { waitFor } from "../support/host.js";

const children: ChildProcess[] = [];
// Each in a process group of its own, killed whole at the end: a `sleep` left behind by its killed `sh` held the
// stdout pipe open, and this file's process then waited 300 s for it to exit.
const start = (command: string, args: string[]) => {
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "ignore"], detached: true });
  children.push(child);
  return child;
};

describe("host processes", () => {
  after(() => {
    for (const child of children) {
      try {
        process.kill(-(child.pid as number), "SIGKILL");
      } catch {
        // the group is gone already
      }
      child.stdout?.destroy();
    }
  });

  it("signals a process only while its identity matches", async () => {
    const child = start("sleep", ["300"]);
    await once(child, "spawn");
    const identity = await identityOf(child.pid as number);
    assert.ok(identity, "a running process has an identity");
    const reused = { ...identity, startTime: identity.startTime + 1 };
    assert.equal(await signalIfOurs(reused, "SIGKILL"), false, "another start time: another process");
    assert.equal(await signalIfOurs({ ...identity, bootId: "not-this-boot" }, "SIGKILL"), false);
    await killAndWait(reused);
    assert.equal(child.exitCode, null);
    assert.ok(await isAlive(identity), "still running after the refused kills");
    const exited = once(child, "exit");
    await killAndWait(identity);
    assert.deepEqual(await exited, [null, "SIGKILL"]);
    assert.equal(await signalIfOurs(identity, "SIGKILL"), false, "gone: nothing to signal");
  });

  it("a zombie is gone: not alive, not signalled, killAndWait returns at once", async () => {
    // A parent that never reaps: its exited child stays a zombie (as orphans do under a PID 1 that does not reap).
    const parent = start("python3", [
      "-c",
      "import os,sys,time\npid=os.fork()\nif pid==0: os._exit(0)\nprint(pid,flush=True)\ntime.sleep(300)",
    ]);
    const [line] = (await once(parent.stdout as NodeJS.ReadableStream, "data")) as [Buffer];
    const zombie = Number(line.toString().trim());
    await waitFor("the child to exit", 10_000, async () =>
      (await procStatFields(zombie))?.[0] === "Z" ? true : undefined,
    );
    const fields = (await procStatFields(zombie)) as string[];
    const recorded = { pid: zombie, startTime: Number(fields[19]), bootId: currentBootId() };
    assert.equal(await identityOf(zombie), null);
    assert.equal(await isAlive(recorded), false);
    assert.equal(await signalIfOurs(recorded, "SIGKILL"), false);
    const started = Date.now();
    await killAndWait(recorded);
    assert.ok(Date.now() - started < 1000, "no waiting for a zombie nobody will reap");
  });

  it("finds processes by what their command line mentions, with their identities", async () => {
    const marker = `/tmp/forkd-marker-${process.pid}-${Date.now()}`;
    const child = start("sh", ["-c", "sleep 300", marker]);
    await once(child, "spawn");
    const found = await processesMentioning(marker);
    assert.deepEqual(
      found.map((p) => p.pid),
      [child.pid],
    );
    assert.ok(await isAlive(found[0] as NonNullable<(typeof found)[0]>));
  });
});
