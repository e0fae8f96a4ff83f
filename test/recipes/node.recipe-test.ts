/**
 * The node recipe (npm run test:recipes): a Node.js evaluator started in the parent keeps running in every
 * child, so `node-eval` answers from the parent's warm process (the same pid in every child) and keeps state
 * per child.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { qemusMentioning, tempHome } from "../support/host.js";

describe("recipe node", { timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-node-");
    await createSnapshot(home, { tag: "node", template: "node" });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("every child evaluates in the parent's warm Node.js process, with state of its own", async () => {
    const services = await openServices(home);
    try {
      const children = await services.sandboxes.spawn({ snapshotTag: "node", n: 2, timeoutMs: 0 });
      const ids = children.map((c) => (c as { id: string }).id);
      const pids = new Set<string>();
      for (const [i, id] of ids.entries()) {
        const r = await services.sandboxes.exec(id, [
          "node-eval",
          `globalThis.mine = ${i}; [process.pid, [1, 2, 3].map((x) => x * 2)]`,
        ]);
        assert.equal(r.exitCode, 0, r.stderr.toString());
        const m = /^\[ (\d+), \[ 2, 4, 6 \] \]$/m.exec(r.stdout.toString());
        assert.ok(m, r.stdout.toString());
        pids.add(m[1] as string);
      }
      assert.equal(pids.size, 1, "one evaluator process, started in the parent, in every child");
      for (const [i, id] of ids.entries()) {
        const r = await services.sandboxes.exec(id, ["node-eval", "mine"]);
        assert.equal(r.stdout.toString().trim(), String(i), "state stays in its child");
      }
      const failed = await services.sandboxes.exec(ids[0] as string, [
        "node-eval",
        "throw new TypeError('nope')",
      ]);
      assert.equal(failed.exitCode, 1);
      assert.match(failed.stdout.toString(), /TypeError: nope/);
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
});
