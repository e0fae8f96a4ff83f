/**
 * BRANCH on real VMs: a sandbox with in-flight state (a Python dict in the warm interpreter, a file on disk, a
 * background process counting) is branched mid-work; children of the branch continue all of it and diverge;
 * the source continues unaffected; repeated branches do not slow down.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

type Services = Awaited<ReturnType<typeof openServices>>;

const COUNTER =
  // Written to a temp file and renamed, so a reader never sees the file truncated mid-write.
  "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done' >/dev/null 2>&1 </dev/null &";

async function buildState(services: Services, id: string): Promise<void> {
  const sb = services.sandboxes;
  assert.equal((await sb.eval(id, "STATE = {'step': 1, 'items': list(range(5))}\nlen(STATE)")).result, "2");
  await sb.files.write(id, "/root/work.txt", Buffer.from("draft 1\n"));
  const started = await sb.exec(id, ["sh", "-c", COUNTER]);
  assert.equal(started.exitCode, 0);
  await new Promise((r) => setTimeout(r, 1500));
}

async function counter(services: Services, id: string): Promise<number> {
  const out = await services.sandboxes.exec(id, ["cat", "/tmp/counter"]);
  return Number(out.stdout.toString().trim());
}

/** Checks one child of a branch: memory, disk and process state as at the branch point. */
async function probe(
  services: Services,
  id: string,
  counterAtBranch: number,
): Promise<{ memory: boolean; disk: boolean; process: boolean }> {
  const sb = services.sandboxes;
  const memory = (await sb.eval(id, "STATE['step'], STATE['items'][-1]")).result === "(1, 4)";
  const disk = (await sb.files.read(id, "/root/work.txt")).data.toString() === "draft 1\n";
  const first = await counter(services, id);
  await new Promise((r) => setTimeout(r, 600));
  const second = await counter(services, id);
  // The counter process was running at the branch: it continues from about where it was, and keeps counting.
  const process = first >= counterAtBranch && second > first;
  return { memory, disk, process };
}

describe("BRANCH on real VMs", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Services;
  let tag: string;

  before(async () => {
    home = await tempHome("forkd-branch-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    services = await openServices(home);
  });
  after(async () => {
    await services.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  for (const mode of ["diff", "full", "live"] as const) {
    it(`${mode}: children continue the source's memory, disk and processes, and diverge; the source is unaffected`, async () => {
      const sb = services.sandboxes;
      const [source] = await sb.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0, liveFork: mode === "live" });
      const sourceId = (source as { id: string }).id;
      await buildState(services, sourceId);
      const before = await counter(services, sourceId);
      const branch = await sb.branch(sourceId, { mode });
      assert.equal(branch.mode, mode);
      assert.equal(branch.status, "ready");
      // A full branch stands alone (flat memory, one disk layer); diff and live layer on the base.
      const expectedParent = mode === "full" ? null : tag;
      assert.equal(branch.parent_tag, expectedParent);
      assert.equal(branch.snapshot.status, "ready");
      assert.equal(branch.snapshot.parent_tag, expectedParent);
      assert.ok(branch.pause_ms > 0 && branch.pause_ms < 5000, `pause ${branch.pause_ms} ms`);
      assert.ok(branch.bytes_captured > 0);

      // The source keeps running with its state, and writes more after the branch point.
      assert.ok((await counter(services, sourceId)) >= before);
      await sb.eval(sourceId, "STATE['after'] = True");
      await sb.files.write(sourceId, "/root/after.txt", Buffer.from("later"));

      const children = await sb.spawn({ snapshotTag: branch.tag, n: 3 });
      const results = [];
      for (const [i, child] of children.entries()) {
        const got = await probe(services, child.id, before);
        results.push(got);
        assert.deepEqual(got, { memory: true, disk: true, process: true }, `child ${i} of ${mode} branch`);
        assert.equal(
          (await sb.eval(child.id, "'after' in STATE")).result,
          "False",
          "source's later writes invisible",
        );
        await assert.rejects(sb.files.stat(child.id, "/root/after.txt"), /ENOENT|not found|no such/i);
        // Diverge: each child takes a different input.
        await sb.eval(child.id, `STATE['child'] = ${i}`);
        await sb.files.write(child.id, "/root/work.txt", Buffer.from(`child ${i}\n`));
      }
      for (const [i, child] of children.entries()) {
        assert.equal((await sb.eval(child.id, "STATE['child']")).result, String(i));
        assert.equal((await sb.files.read(child.id, "/root/work.txt")).data.toString(), `child ${i}\n`);
      }
      assert.equal((await sb.eval(sourceId, "'child' in STATE, STATE['after']")).result, "(False, True)");
      assert.equal((await sb.files.read(sourceId, "/root/work.txt")).data.toString(), "draft 1\n");
      console.log(
        `${mode}: pause ${branch.pause_ms} ms, captured ${(branch.bytes_captured / 2 ** 20).toFixed(1)} MiB, wrote ${(branch.bytes_written / 2 ** 20).toFixed(1)} MiB; probes ${results.length * 3}/${results.length * 3}`,
      );
      await sb.killAll();
    });
  }

  it("a full branch stands alone, and a diff branch taken after it builds on it", async () => {
    const sb = services.sandboxes;
    const [source] = await sb.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0 });
    const sourceId = (source as { id: string }).id;
    await sb.eval(sourceId, "LOG = ['before full']");
    await sb.files.write(sourceId, "/root/a.txt", Buffer.from("a"));
    const full = await sb.branch(sourceId, { tag: "alone" });
    assert.deepEqual([full.mode, full.parent_tag], ["full", null], "full is the default, with no parent");
    const stored = await services.snapshots.store.get("alone");
    assert.equal(stored.manifest.parent, null);
    assert.equal(stored.manifest.memory.format, "flat");
    await sb.eval(sourceId, "LOG.append('before diff')");
    await sb.files.write(sourceId, "/root/b.txt", Buffer.from("b"));
    const diff = await sb.branch(sourceId, { tag: "on-alone", mode: "diff" });
    assert.equal(diff.parent_tag, "alone", "the source's next branch chains onto the full one");
    assert.equal(sb.get(sourceId).branch_count, 2);
    const [child] = await sb.spawn({ snapshotTag: "on-alone", n: 1 });
    const childId = (child as { id: string }).id;
    assert.equal((await sb.eval(childId, "LOG")).result, "['before full', 'before diff']");
    const read = async (file: string) => (await sb.files.read(childId, file)).data.toString();
    assert.deepEqual([await read("/root/a.txt"), await read("/root/b.txt")], ["a", "b"]);
    await sb.killAll();
    // Nothing but the diff depends on the full snapshot, and the full one on nothing.
    await assert.rejects(
      services.snapshots.delete("alone"),
      (err: unknown) => err instanceof ForkdError && err.code === "conflict",
    );
    await services.snapshots.delete("on-alone");
    await services.snapshots.delete("alone");
  });

  it("repeated BRANCHes of one source chain onto each other and the pause does not grow", async () => {
    const sb = services.sandboxes;
    const [source] = await sb.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0 });
    const sourceId = (source as { id: string }).id;
    await buildState(services, sourceId);
    const pauses: number[] = [];
    let parent = tag;
    for (let i = 0; i < 10; i++) {
      await sb.eval(sourceId, `STATE['round'] = ${i}`);
      const branch = await sb.branch(sourceId, { mode: "diff", tag: `round-${i}` });
      assert.equal(branch.parent_tag, parent, "each branch chains onto the previous one");
      const stored = (await services.snapshots.store.get(branch.tag)).manifest.memory.pages;
      if (i > 0) {
        // Layers hold what changed since their parent, not everything changed since the source's restore.
        assert.ok(
          stored < branch.bytes_captured / 4096,
          `round ${i}: ${stored} pages stored of ${branch.bytes_captured / 4096} private`,
        );
      }
      parent = branch.tag;
      pauses.push(branch.pause_ms);
    }
    const sorted = [...pauses].sort((a, b) => a - b);
    const median = sorted[Math.floor(sorted.length / 2)] as number;
    const lastThree = pauses.slice(-3);
    console.log(`pauses (ms): ${pauses.join(", ")}`);
    assert.ok(Math.max(...lastThree) <= 3 * median + 50, `pause grew: ${pauses.join(", ")}`);
    // The 10th branch is a 10-deep chain whose children see the 10th round.
    const [child] = await sb.spawn({ snapshotTag: "round-9", n: 1 });
    assert.equal((await sb.eval((child as { id: string }).id, "STATE['round']")).result, "9");
    await assert.rejects(
      services.snapshots.delete("round-4"),
      (err: unknown) => err instanceof ForkdError && err.code === "conflict",
    );
    await sb.killAll();
  });

  it("live with wait:false answers once the source runs again; the snapshot moves from writing to ready", async () => {
    const sb = services.sandboxes;
    const [source] = await sb.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0, liveFork: true });
    const sourceId = (source as { id: string }).id;
    await buildState(services, sourceId);
    const branch = await sb.branch(sourceId, { mode: "live", wait: false, tag: "live-bg" });
    assert.equal(branch.status, "writing");
    assert.ok(branch.pause_ms > 0);
    assert.equal((await services.snapshots.get("live-bg")).status, "writing");
    await assert.rejects(
      sb.spawn({ snapshotTag: "live-bg", n: 1 }),
      (err: unknown) => err instanceof ForkdError && err.code === "conflict",
    );
    await waitFor("the background write", 300_000, async () =>
      (await services.snapshots.get("live-bg")).status === "ready" ? true : undefined,
    );
    const [child] = await sb.spawn({ snapshotTag: "live-bg", n: 1 });
    assert.equal((await sb.eval((child as { id: string }).id, "STATE['step']")).result, "1");
    await sb.killAll();
  });

  it("live needs a source spawned with live_fork", async () => {
    const sb = services.sandboxes;
    const [source] = await sb.spawn({ snapshotTag: tag, n: 1 });
    await assert.rejects(
      sb.branch((source as { id: string }).id, { mode: "live" }),
      (err: unknown) =>
        err instanceof ForkdError && err.code === "conflict" && /live_fork/.test((err as Error).message),
    );
    await sb.killAll();
  });

  it("rejects bad BRANCH requests", async () => {
    const sb = services.sandboxes;
    const [source] = await sb.spawn({ snapshotTag: tag, n: 1 });
    const id = (source as { id: string }).id;
    const isCode = (code: string) => (err: unknown) => err instanceof ForkdError && err.code === code;
    await assert.rejects(sb.branch(id, { tag: "../x" }), isCode("invalid_argument"));
    await assert.rejects(sb.branch(id, { tag }), isCode("conflict"), "tag exists");
    await assert.rejects(sb.branch(id, { mode: "diff", wait: false }), isCode("invalid_argument"));
    await assert.rejects(sb.branch("sb-000000000000", {}), isCode("not_found"));
    await sb.killAll();
  });
});
