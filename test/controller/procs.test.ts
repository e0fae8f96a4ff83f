/**
 * The agent's v2 process service on real VMs: a background process started with proc.start (its call still
 * streaming) survives a BRANCH, and the branch's child finds it with proc.list and continues it with
 * proc.connect while the source's own follower keeps streaming; a pty round trip (input, output, resize);
 * and commands as the image's default user.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { AgentClient } from "../../src/agent/host/client.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

type Services = Awaited<ReturnType<typeof openServices>>;

async function until(what: string, probe: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await probe())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const lastTick = (text: string) => Number([...text.matchAll(/tick (\d+)/g)].at(-1)?.[1] ?? 0);

describe("agent processes on real VMs", { timeout: 20 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Services;
  let tag: string;
  const agentOf = (id: string): AgentClient => {
    const handle = services.sandboxes.handles().find((h) => h.id === id);
    assert.ok(handle, `no sandbox ${id}`);
    return handle.agent;
  };

  before(async () => {
    home = await tempHome("forkd-procs-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    services = await openServices(home);
  });
  after(async () => {
    await services.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("a background proc.start process survives a BRANCH and the child continues it", async () => {
    const sb = services.sandboxes;
    const [source] = await sb.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0 });
    const sourceId = (source as { id: string }).id;
    const agent = agentOf(sourceId);
    let sourceText = "";
    const ticker = agent.procs.start(
      ["sh", "-c", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done"],
      {
        tag: "ticker",
        onStdout: (d) => (sourceText += d.toString()),
      },
    );
    const pid = await ticker.pid;
    await until("ticks in the source", () => lastTick(sourceText) >= 3);

    const branch = await sb.branch(sourceId, { mode: "diff" });
    const atBranch = lastTick(sourceText);
    const [child] = await sb.spawn({ snapshotTag: branch.tag, n: 1 });
    const childAgent = agentOf((child as { id: string }).id);

    // The child's restore started a new host epoch: the parent host's proc.start call was detached there,
    // but the process itself is in the child's table, running.
    const listed = (await childAgent.procs.list()).find((p) => p.tag === "ticker");
    assert.ok(listed, "the ticker is in the child's process table");
    assert.equal(listed.pid, pid);
    assert.equal(listed.running, true);
    let childText = "";
    const followed = childAgent.procs.connect(
      { tag: "ticker" },
      { onStdout: (d) => (childText += d.toString()) },
    );
    assert.equal(await followed.pid, pid);
    await until("ticks in the child", () => lastTick(childText) > 0);
    assert.ok(
      lastTick(childText) >= atBranch - 5,
      `child continued from ${lastTick(childText)}, branch at ${atBranch}`,
    );
    const childStart = lastTick(childText);
    await until("more ticks in the child", () => lastTick(childText) >= childStart + 3);

    // The source's follower was never disturbed and keeps streaming.
    const sourceNow = lastTick(sourceText);
    await until("more ticks in the source", () => lastTick(sourceText) >= sourceNow + 3);

    await childAgent.procs.signal({ pid }, "SIGTERM");
    assert.equal((await followed.done).signal, "SIGTERM");
    assert.ok((await childAgent.procs.list()).every((p) => p.pid !== pid));
    // Killing it in the child leaves the source's process alone.
    assert.ok((await agent.procs.list()).some((p) => p.pid === pid && p.running));
    await agent.procs.signal({ pid }, "SIGKILL");
    assert.equal((await ticker.done).signal, "SIGKILL");
    await sb.killAll();
  });

  it("a pty round trip, and commands as the image's default user", async () => {
    const sb = services.sandboxes;
    const [box] = await sb.spawn({ snapshotTag: tag, n: 1 });
    const agent = agentOf((box as { id: string }).id);
    let screen = "";
    const shell = agent.procs.start(["/bin/bash", "-i"], {
      pty: { cols: 100, rows: 30 },
      user: "user",
      onPty: (d) => (screen += d.toString()),
    });
    const pid = await shell.pid;
    await agent.procs.input({ pid }, "stty size; echo T=$TERM U=$(id -un) H=$HOME; pwd\n");
    await until("the shell's answer", () => /30 100/.test(screen) && /U=user H=\/home\/user/.test(screen));
    assert.match(screen, /T=xterm-256color/);
    await agent.procs.resize({ pid }, { cols: 132, rows: 43 });
    await agent.procs.input({ pid }, "stty size\n");
    await until("the new size", () => /43 132/.test(screen));
    await agent.procs.input({ pid }, "exit 7\n");
    assert.equal((await shell.done).exitCode, 7);

    const who = await agent.exec(["sh", "-c", 'echo "$(id -u):$(id -g) $HOME $(pwd) $SHELL"'], {
      user: "user",
    });
    assert.equal(who.stdout.toString(), "1000:1000 /home/user /home/user /bin/bash\n");
    await agent.files.write("/home/user/made-by-user.txt", "x", { user: "user" });
    const info = await agent.files.stat("/home/user/made-by-user.txt");
    assert.equal(info.owner, "user");
    await sb.killAll();
  });
});
