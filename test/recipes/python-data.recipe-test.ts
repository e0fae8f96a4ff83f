/**
 * The python-data recipe (npm run test:recipes: a large Debian build and a ~30 s warm-up under TCG): numpy,
 * pandas and scikit-learn from Debian and tabulate from the machine's configured package index (the pip step
 * has no wheels and no index of its own) are imported in the parent, so children use them without importing.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { runExample } from "../support/examples.js";
import { qemusMentioning, tempHome } from "../support/host.js";

describe("recipe python-data", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-pydata-");
    await createSnapshot(home, { tag: "python-data", template: "python-data" });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("children start with numpy, pandas, scikit-learn and tabulate (from the index) imported", async () => {
    const result = await forkChildren(home, {
      tag: "python-data",
      n: 2,
      eval:
        "import sys\n" +
        "warm = all(m in sys.modules for m in ('numpy', 'pandas', 'sklearn', 'tabulate'))\n" +
        "model = sklearn.linear_model.LinearRegression().fit([[0], [1], [2]], [1, 3, 5])\n" +
        "table = tabulate.tabulate(pandas.DataFrame({'a': [1, 2]}), headers='keys', tablefmt='plain', showindex=False)\n" +
        "(FORKD_WARM_MARKER, warm, tabulate.__version__, table.split(), round(float(model.coef_[0]), 3))",
    });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.result, "('warm', True, '0.9.0', ['a', '1', '2'], 2.0)");
    }
  });

  it("examples/python-data/sweep.ts fits one model per child, every child already warm", async () => {
    const services = await openServices(home);
    try {
      const { stdout } = await runExample(services, home, {
        file: "python-data/sweep.ts",
        snapshotTag: "python-data",
        args: ["0.01", "1"],
      });
      assert.match(stdout, /^2 children spawned in \d+ ms$/m, stdout);
      const accuracies = [...stdout.matchAll(/│\s*(0\.\d+|1)\s*│\s*true\s*│/g)].map((m) => Number(m[1]));
      assert.equal(accuracies.length, 2, `one warm row per C:\n${stdout}`);
      for (const a of accuracies) assert.ok(a > 0.7 && a <= 1, `a learnable data set: accuracy ${a}`);
      assert.match(stdout, /^best C: (0\.01|1) \(held-out accuracy 0\.\d+\)$/m);
      assert.deepEqual(services.sandboxes.list(), [], "the example killed its children");
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
});
