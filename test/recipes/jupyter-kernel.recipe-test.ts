/**
 * The jupyter-kernel recipe (npm run test:recipes: a Debian build and the kernel's start-up under TCG): the
 * IPython kernel started in the parent is running in every child; a real Jupyter client (jupyter_client, through
 * the image's kernel-exec) executes cells there at once, seeing what the parent's kernel defined and imported.
 * Each child's kernel is its own copy: a name set in one child is not in another, and a failing cell fails.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const TAG = "jupyter-kernel";

describe("recipe jupyter-kernel", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-jupyter-");
    await createSnapshot(home, { tag: TAG, template: TAG });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("every child's running kernel executes cells with the parent's names, each its own copy", async () => {
    const cell = "COUNTER = globals().get('COUNTER', 0) + 1\nWARM_VALUE, int(np.arange(10).sum()), COUNTER";
    const result = await forkChildren(home, { tag: TAG, n: 2, exec: ["kernel-exec", cell] });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, `${child.stdout}\n${child.stderr}`);
      assert.equal(
        child.stdout,
        "('from-the-parent', 45, 1)\n",
        "the parent's kernel state, not a sibling's",
      );
    }
  });

  it("a cell that raises fails with the kernel's error", async () => {
    const result = await forkChildren(home, { tag: TAG, n: 1, exec: ["kernel-exec", "1 / 0"] });
    const child = result.children[0];
    assert.equal(child?.exit_code, 1, `${child?.stdout}\n${child?.stderr}`);
    assert.match(child?.stderr ?? "", /ZeroDivisionError: division by zero/);
  });
});
