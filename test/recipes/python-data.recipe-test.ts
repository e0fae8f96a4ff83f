/**
 * The python-data recipe (npm run test:recipes: a large Debian build and a ~30 s warm-up under TCG): numpy,
 * pandas and scikit-learn from Debian and a wheel from the recipe's local wheel directory (pip, no network)
 * are imported in the parent, so children use them without importing.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { createSnapshot } from "../../src/controller/create-snapshot.js";
import { forkChildren } from "../../src/controller/fork.js";
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

  it("children start with numpy, pandas, scikit-learn and the local wheel imported", async () => {
    const result = await forkChildren(home, {
      tag: "python-data",
      n: 2,
      eval:
        "import sys\n" +
        "warm = all(m in sys.modules for m in ('numpy', 'pandas', 'sklearn', 'forkd_demo'))\n" +
        "model = sklearn.linear_model.LinearRegression().fit([[0], [1], [2]], [1, 3, 5])\n" +
        "(FORKD_WARM_MARKER, warm, forkd_demo.describe(pandas.DataFrame({'a': [1, 2]})), round(float(model.coef_[0]), 3))",
    });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.result, "('warm', True, \"2 rows, columns ['a']\", 2.0)");
    }
  });
});
