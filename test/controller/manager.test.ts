/**
 * The daemon core on real VMs: spawn/exec/eval/files/kill, memory limits, lifetimes, admission, re-attach
 * after a restart, and a daemon killed mid-spawn.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { ForkdError } from "../../src/common/errors.js";
import { REATTACH_TIMEOUT_MS } from "../../src/controller/sandboxes/adopted-sandbox.js";
import { openServices, SandboxManager } from "../../src/controller/sandboxes/manager.js";
import { BRANCH_INTERRUPTED } from "../../src/controller/snapshots/branch.js";
import { StateDb } from "../../src/store/db.js";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const isCode = (code: string) => (err: unknown) => err instanceof ForkdError && err.code === code;

describe("sandbox manager on real VMs", { timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;

  before(async () => {
    home = await tempHome("forkd-manager-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
  });
  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("spawns, serves exec/eval/files, and kills", async () => {
    const services = await openServices(home);
    try {
      const infos = await services.sandboxes.spawn({ snapshotTag: tag, n: 2 });
      assert.equal(infos.length, 2);
      for (const info of infos) {
        assert.equal(info.status, "running");
        assert.equal(info.snapshot_tag, tag);
        assert.ok(info.pid && info.pid > 0);
        assert.equal(info.expires_at_unix_ms, null, "no lifetime unless asked for (as in forkd v0.5)");
      }
      const [a, b] = infos as [(typeof infos)[0], (typeof infos)[0]];
      const ran = await services.sandboxes.exec(a.id, ["sh", "-c", "echo out; echo err >&2; exit 3"]);
      assert.deepEqual([ran.stdout.toString(), ran.stderr.toString(), ran.exitCode], ["out\n", "err\n", 3]);
      assert.equal((await services.sandboxes.eval(b.id, "numpy.arange(3).sum()")).result, "3");
      await services.sandboxes.files.write(a.id, "/tmp/x.bin", Buffer.from([0, 1, 2, 255]));
      assert.deepEqual([...(await services.sandboxes.files.read(a.id, "/tmp/x.bin")).data], [0, 1, 2, 255]);
      assert.equal(services.sandboxes.list().length, 2);
      await services.sandboxes.kill(a.id);
      assert.throws(() => services.sandboxes.get(a.id), isCode("not_found"));
      await assert.rejects(services.sandboxes.exec(a.id, ["true"]), isCode("not_found"));
      await assert.rejects(services.sandboxes.kill(a.id), isCode("not_found"));
      assert.deepEqual(await services.sandboxes.killAll(), [b.id]);
      assert.deepEqual(await entries(home.run), []);
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("rejects bad spawn requests with the right codes", async () => {
    const services = await openServices(home, { limits: { maxSandboxes: 1 } });
    try {
      await assert.rejects(services.sandboxes.spawn({ snapshotTag: "nope", n: 1 }), isCode("not_found"));
      await assert.rejects(
        services.sandboxes.spawn({ snapshotTag: "../x", n: 1 }),
        isCode("invalid_argument"),
      );
      await assert.rejects(services.sandboxes.spawn({ snapshotTag: tag, n: 0 }), isCode("invalid_argument"));
      await assert.rejects(
        services.sandboxes.spawn({ snapshotTag: tag, n: 100000 }),
        isCode("invalid_argument"),
      );
      await assert.rejects(
        services.sandboxes.spawn({ snapshotTag: tag, n: 2 }),
        isCode("unavailable"),
        "over the limit",
      );
      // Two at once against a limit of one: the second sees the first's child before either has started it.
      const raced = await Promise.allSettled([
        services.sandboxes.spawn({ snapshotTag: tag, n: 1 }),
        services.sandboxes.spawn({ snapshotTag: tag, n: 1 }),
      ]);
      assert.deepEqual(
        raced.map((r) => r.status),
        ["fulfilled", "rejected"],
      );
      assert.ok(isCode("unavailable")((raced[1] as PromiseRejectedResult).reason));
      assert.equal(services.sandboxes.list().length, 1);
      await services.sandboxes.killAll();
      await assert.rejects(
        services.sandboxes.spawn({ snapshotTag: tag, n: 1, memoryLimitMiB: 1 }),
        isCode("invalid_argument"),
      );
      assert.throws(() => services.sandboxes.get("sb-000000000000"), isCode("not_found"));
      assert.throws(() => services.sandboxes.get("../../etc"), isCode("invalid_argument"));
      assert.deepEqual(services.sandboxes.list(), []);
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("answers 409 for a snapshot that is still being written", async () => {
    const db = new StateDb(path.join(home.home, "state.db"));
    db.upsertSnapshotJob({
      tag: "half",
      status: "writing",
      kind: "branch",
      started_at_unix: 1,
      error: null,
    });
    const manager = await SandboxManager.open(home, db);
    try {
      await assert.rejects(manager.spawn({ snapshotTag: "half", n: 1 }), isCode("conflict"));
    } finally {
      await manager.close();
      db.deleteSnapshotJob("half");
      db.close();
    }
  });

  it("a kill during a running exec fails that exec as killed, not as a broken connection", async () => {
    const services = await openServices(home);
    try {
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
      const id = (info as { id: string }).id;
      const outcome = services.sandboxes.exec(id, ["sleep", "60"]).then(
        () => new Error("exec finished although its sandbox was killed"),
        (err: unknown) => err,
      );
      await new Promise((r) => setTimeout(r, 500));
      await services.sandboxes.kill(id);
      const err = await outcome;
      assert.ok(isCode("conflict")(err) && /killed while/.test((err as Error).message), String(err));
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("kills a sandbox when its lifetime expires, and extends it on request", async () => {
    const services = await openServices(home, { sweepIntervalMs: 200 });
    try {
      const [short, extended] = await services.sandboxes.spawn({ snapshotTag: tag, n: 2, timeoutMs: 3000 });
      services.sandboxes.setTimeout((extended as { id: string }).id, 60_000);
      await waitFor("expiry", 30_000, async () =>
        services.sandboxes.list().some((s) => s.id === (short as { id: string }).id) ? undefined : true,
      );
      assert.equal(services.sandboxes.get((extended as { id: string }).id).status, "running");
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("limits a sandbox's memory with a cgroup", { skip: false }, async (t) => {
    const services = await openServices(home);
    const root = services.sandboxes.cgroups?.hierarchies.memory;
    if (!root) {
      await services.close();
      return t.skip("no cgroup memory controller on this host");
    }
    try {
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, memoryLimitMiB: 768 });
      const id = (info as { id: string; pid: number }).id;
      const dir = path.join(root.parent, id);
      const limitFile = root.version === 2 ? "memory.max" : "memory.limit_in_bytes";
      assert.equal(Number((await readFile(path.join(dir, limitFile), "utf8")).trim()), 768 * 1024 * 1024);
      const procs = (await readFile(path.join(dir, "cgroup.procs"), "utf8"))
        .split("\n")
        .filter(Boolean)
        .map(Number);
      assert.ok(procs.includes((info as { pid: number }).pid), "QEMU is in the cgroup");
      assert.equal(info?.memory_limit_mib, 768);
      await services.sandboxes.kill(id);
      assert.deepEqual(
        (await entries(root.parent)).filter((n) => n === id),
        [],
        "cgroup removed",
      );
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  it("re-attaches to running sandboxes after a daemon restart", async () => {
    const first = await openServices(home);
    const [info] = await first.sandboxes.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0 });
    const id = (info as { id: string }).id;
    await first.sandboxes.eval(id, "KEEP = 41");
    await first.close();
    const second = await openServices(home);
    try {
      assert.equal(second.sandboxes.get(id).status, "running");
      await second.sandboxes.reattached;
      assert.equal((await second.sandboxes.eval(id, "KEEP + 1")).result, "42", "same VM, same interpreter");
      assert.equal((await second.sandboxes.exec(id, ["hostname"])).stdout.toString(), `${id}\n`);
    } finally {
      await second.close({ killSandboxes: true });
    }
  });

  it("a restart serves at once: sandboxes re-attach in parallel, a hung one only costs its own calls", async () => {
    const first = await openServices(home);
    const infos = await first.sandboxes.spawn({ snapshotTag: tag, n: 3, timeoutMs: 0 });
    const [hung, stopped, marked] = infos.map((i) => i.id) as [string, string, string];
    // One VM left stopped as a daemon dying mid-BRANCH leaves it; one whose BRANCH was cut after its disk switch.
    const stoppedHandle = first.sandboxes.handles().find((h) => h.id === stopped);
    await (await stoppedHandle?.qmp())?.execute("stop");
    const db = new StateDb(path.join(home.home, "state.db"));
    db.updateSandbox(marked, { branch_blocked: `${BRANCH_INTERRUPTED} ${tag}` });
    const hungPid = first.sandboxes.get(hung).pid as number;
    await first.close();
    process.kill(hungPid, "SIGSTOP"); // answers nothing: its re-attach runs into the deadline
    const started = Date.now();
    const second = await openServices(home);
    try {
      assert.ok(
        Date.now() - started < REATTACH_TIMEOUT_MS / 2,
        "the services opened without waiting for re-attaches",
      );
      // A call waits for its own sandbox only: the stopped VM was continued, the marked one answers.
      assert.equal((await second.sandboxes.exec(stopped, ["true"])).exitCode, 0);
      assert.ok(Date.now() - started < REATTACH_TIMEOUT_MS, "not held by the hung sandbox");
      assert.equal((await second.sandboxes.eval(marked, "1+1")).result, "2");
      // Its BRANCH's snapshot exists (the commit happened): the interrupted mark is settled.
      assert.equal(db.sandbox(marked)?.branch_blocked, null);
      await second.sandboxes.reattached;
      assert.equal(second.sandboxes.get(hung).status, "dead");
      assert.match(db.sandbox(hung)?.error ?? "", /could not re-attach/);
    } finally {
      try {
        process.kill(hungPid, "SIGCONT");
      } catch {
        // already killed as dead
      }
      db.close();
      await second.sandboxes.killAll();
      await second.close({ killSandboxes: true });
    }
  });

  it("after a daemon SIGKILLed mid-spawn, the restart kills the orphans and keeps the records", async () => {
    const self = fileURLToPath(import.meta.url);
    const helper = path.join(path.dirname(self), "..", "support", `spawn-then-hang${path.extname(self)}`);
    const child = spawn(process.execPath, [...process.execArgv, helper, tag, "4"], {
      env: { ...process.env, FORKD_HOME: home.home },
      stdio: ["ignore", "pipe", "inherit"],
    });
    await waitFor("a child QEMU", 120_000, async () =>
      (await qemusMentioning(home.run)).length > 0 ? true : undefined,
    );
    child.kill("SIGKILL");
    await new Promise((r) => child.once("exit", r));
    const services = await openServices(home);
    try {
      assert.deepEqual(await qemusMentioning(home.home), [], "orphans killed");
      const rows = services.sandboxes.list();
      assert.ok(rows.length >= 1, "records kept");
      for (const row of rows) assert.equal(row.status, "dead");
      assert.deepEqual(await entries(home.run), []);
      await services.sandboxes.killAll();
      assert.deepEqual(services.sandboxes.list(), []);
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
});
