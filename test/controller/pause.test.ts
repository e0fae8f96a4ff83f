/**
 * Pause and resume on real VMs, through the daemon's engine (SandboxManager): a sandbox's processes, pty shell,
 * files and interpreter state continue after a resume under the same id; the RNG is reseeded and the clock is
 * the host's; a paused sandbox has no QEMU and can be forked and branched; killing it removes its layers; 20
 * cycles keep every write with the chain and the disk bounded.
 */
import assert from "node:assert/strict";
import { readdir, stat } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { AgentClient } from "../../src/agent/host/client.js";
import { ForkdError } from "../../src/common/errors.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { MAX_OWN_PAUSE_LAYERS } from "../../src/controller/sandboxes/pause-layer.js";
import { resolveChain } from "../../src/store/chain.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

type Services = Awaited<ReturnType<typeof openServices>>;

const isCode = (code: string) => (err: unknown) => err instanceof ForkdError && err.code === code;

async function until(what: string, probe: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await probe())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("pause and resume on real VMs", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Services;
  let pyagent: string;
  let minimal: string;
  const agentOf = (id: string): AgentClient => {
    const handle = services.sandboxes.handles().find((h) => h.id === id);
    assert.ok(handle, `no running sandbox ${id}`);
    return handle.agent;
  };
  const counter = async (id: string) =>
    Number((await services.sandboxes.files.read(id, "/tmp/counter")).data.toString().trim());

  before(async () => {
    home = await tempHome("forkd-pause-");
    pyagent = await linkSharedSnapshot(home.home, "pyagent");
    minimal = await linkSharedSnapshot(home.home, "minimal");
    services = await openServices(home);
  });
  after(async () => {
    await services?.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("a resumed sandbox continues its processes, pty shell, files and interpreter", async () => {
    const sb = services.sandboxes;
    const [info] = await sb.spawn({ snapshotTag: pyagent, n: 1, timeoutMs: 600_000 });
    const id = (info as { id: string }).id;
    const agent = agentOf(id);
    // A background process counting into a file, started with proc.start (it outlives the call).
    const ticker = agent.procs.start([
      "sh",
      "-c",
      "i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.2; done",
    ]);
    const tickerPid = await ticker.pid;
    await until("the counter", async () => (await counter(id).catch(() => 0)) >= 3);
    // A pty shell with a working directory and a shell variable of its own.
    let screen = "";
    const shell = agent.procs.start(["/bin/bash", "-i"], {
      pty: { cols: 80, rows: 24 },
      onPty: (d) => (screen += d.toString()),
    });
    const shellPid = await shell.pid;
    await agent.procs.input(
      { pid: shellPid },
      "mkdir -p /tmp/work && cd /tmp/work && SHELLVAR=kept-$((6*7))\n",
    );
    await sb.files.write(id, "/root/before-pause.txt", Buffer.from("written before the pause\n"));
    assert.equal((await sb.eval(id, "answer = 41; answer")).result, "41");
    await sb.exec(id, ["sync"]);

    const paused = await sb.pause(id);
    assert.equal(paused.sandbox.status, "paused");
    assert.equal(paused.sandbox.id, id);
    assert.match(paused.tag, new RegExp(`^pause-${id}-`));
    assert.ok(paused.bytes_stored > 0 && paused.bytes_stored <= paused.bytes_captured);
    assert.ok(paused.freed_bytes > 0, "its QEMU's memory was counted");
    assert.equal(sb.get(id).pause_tag, paused.tag);
    assert.deepEqual(await qemusMentioning(path.join(home.run, id)), [], "no QEMU while paused");
    assert.deepEqual(
      sb.list({ status: "paused" }).map((s) => s.id),
      [id],
    );
    await assert.rejects(sb.exec(id, ["true"]), isCode("conflict"));
    await assert.rejects(sb.pause(id), isCode("conflict"), "already paused");

    const hostBefore = Math.floor(Date.now() / 1000);
    const resumed = await sb.resume(id);
    assert.equal(resumed.status, "running");
    assert.equal(resumed.id, id);
    assert.ok(resumed.expires_at_unix_ms !== null && resumed.expires_at_unix_ms > Date.now() + 500_000);
    // The clock is the host's, not the one frozen in the layer.
    const guestNow = Number((await sb.exec(id, ["date", "+%s"])).stdout.toString().trim());
    assert.ok(Math.abs(guestNow - hostBefore) <= 5, `guest clock ${guestNow}, host ${hostBefore}`);
    // The background process is the same process, and counts on.
    const listed = (await agentOf(id).procs.list()).find((p) => p.pid === tickerPid);
    assert.ok(listed?.running, "the counter process still runs");
    const first = await counter(id);
    await until("the counter to advance", async () => (await counter(id)) >= first + 3);
    // The pty shell kept its directory and variable.
    let after = "";
    const attached = agentOf(id).procs.connect({ pid: shellPid }, { onPty: (d) => (after += d.toString()) });
    await attached.pid;
    await agentOf(id).procs.input({ pid: shellPid }, 'echo "at:$(pwd):$SHELLVAR"\n');
    await until("the shell's answer", () => after.includes("at:/tmp/work:kept-42"));
    assert.equal(
      (await sb.files.read(id, "/root/before-pause.txt")).data.toString(),
      "written before the pause\n",
    );
    assert.equal((await sb.eval(id, "answer + 1")).result, "42");
    await agentOf(id).procs.signal({ pid: tickerPid }, "SIGKILL");
    await sb.kill(id);
  });

  it("a paused sandbox forks (fresh entropy per child) and branches; kill removes its layers", async () => {
    const sb = services.sandboxes;
    const [info] = await sb.spawn({ snapshotTag: pyagent, n: 1, timeoutMs: 0 });
    const id = (info as { id: string }).id;
    await sb.eval(id, "state = 'from the paused sandbox'");
    const { tag } = await sb.pause(id);
    const forked = await sb.fork(id, { count: 2 });
    const children = forked.children.map((c) => {
      assert.ok(c.sandbox, `fork failed: ${c.error?.message}`);
      return c.sandbox.id;
    });
    const entropy: string[] = [];
    for (const child of children) {
      assert.equal((await sb.eval(child, "state")).result, "'from the paused sandbox'");
      entropy.push(
        (await sb.exec(child, ["sh", "-c", "head -c 16 /dev/urandom | od -An -tx1"])).stdout.toString(),
      );
    }
    assert.notEqual(entropy[0], entropy[1], "each child's RNG was reseeded");
    const branch = await sb.branch(id, { mode: "diff", tag: "from-paused" });
    assert.equal(branch.parent_tag, tag);
    const [fromBranch] = await sb.spawn({ snapshotTag: "from-paused", n: 1 });
    assert.equal(
      (await sb.eval((fromBranch as { id: string }).id, "state")).result,
      "'from the paused sandbox'",
    );
    assert.equal(sb.get(id).status, "paused", "forking and branching leave it paused");
    for (const child of [...children, (fromBranch as { id: string }).id]) await sb.kill(child);
    await services.snapshots.delete("from-paused");
    await sb.kill(id);
    assert.throws(() => sb.get(id), isCode("not_found"));
    const store = new SnapshotStore(home.snapshots);
    await until("its pause layer to go", async () => !(await store.exists(tag)));
  });

  it("20 pause/resume cycles keep every write, with the chain and the disk bounded", async () => {
    const sb = services.sandboxes;
    const [info] = await sb.spawn({ snapshotTag: minimal, n: 1, timeoutMs: 0 });
    const id = (info as { id: string }).id;
    const store = new SnapshotStore(home.snapshots);
    const depths: number[] = [];
    const ownBytes: number[] = [];
    for (let cycle = 1; cycle <= 20; cycle++) {
      await sb.exec(id, [
        "sh",
        "-c",
        `echo cycle-${cycle} >> /root/cycles.log; dd if=/dev/urandom of=/tmp/blob bs=64k count=16 status=none; sync`,
      ]);
      const { tag } = await sb.pause(id);
      const chain = await resolveChain(store, tag);
      depths.push(chain.length);
      const own = chain.filter((s) => s.tag.startsWith(`pause-${id}-`));
      assert.ok(own.length <= MAX_OWN_PAUSE_LAYERS, `cycle ${cycle}: ${own.length} own layers`);
      ownBytes.push(await bytesOf(own.map((s) => s.dir)));
      await sb.resume(id);
    }
    const log = (await sb.files.read(id, "/root/cycles.log")).data.toString();
    assert.deepEqual(
      log.trim().split("\n"),
      Array.from({ length: 20 }, (_, i) => `cycle-${i + 1}`),
    );
    assert.ok(Math.max(...depths) <= (depths[0] as number) + MAX_OWN_PAUSE_LAYERS - 1, `depths ${depths}`);
    // Every cycle rewrites the same 1 MiB: what is kept stays near one cycle's worth, not twenty.
    const settled = Math.max(...ownBytes.slice(5));
    assert.ok(settled <= 4 * (ownBytes[0] as number), `own layer bytes ${ownBytes}`);
    // Layers merged away were deleted.
    const left = (await readdir(home.snapshots)).filter((n) => n.startsWith(`pause-${id}-`));
    assert.ok(left.length <= MAX_OWN_PAUSE_LAYERS, `pause layers on disk: ${left}`);
    await sb.kill(id);
  });
});

async function bytesOf(dirs: string[]): Promise<number> {
  let total = 0;
  for (const dir of dirs) {
    for (const name of await readdir(dir)) {
      const st = await stat(path.join(dir, name));
      if (st.isFile()) total += st.blocks * 512;
    }
  }
  return total;
}
