/**
 * A hyperparameter sweep with one child per setting: every child of the `python-data` snapshot starts with
 * numpy, pandas and scikit-learn already imported in its warm interpreter, builds the same data set (same
 * seed), fits a logistic regression with its own regularisation strength and reports its held-out accuracy.
 * No child pays the imports, and none shares state with another.
 *
 *   forkd snapshot --tag python-data --template python-data    # once
 *   forkd daemon &
 *   node --import tsx examples/python-data/sweep.ts [C values...]
 *
 * Settings as in examples/sdk/quickstart.ts (FORKD_URL, FORKD_TOKEN); FORKD_SNAPSHOT overrides the tag.
 */
import { Sandbox } from "../../src/sdk/index.js";

const snapshotTag = process.env.FORKD_SNAPSHOT ?? "python-data";
const strengths = process.argv.length > 2 ? process.argv.slice(2).map(Number) : [0.001, 0.01, 0.1, 1, 10];
if (strengths.some((c) => !(c > 0))) throw new Error("each C must be a positive number");

/** Runs in each child's warm interpreter and prints its result as JSON. */
const trainWith = (c: number) => `
import json, time
t0 = time.perf_counter()
imported_already = all(m in globals() for m in ("numpy", "pandas", "sklearn"))
rng = numpy.random.default_rng(7)
frame = pandas.DataFrame(rng.normal(size=(2000, 8)), columns=[f"x{i}" for i in range(8)])
frame["y"] = ((frame.x0 + 0.5 * frame.x1 - frame.x2 + rng.normal(scale=0.8, size=len(frame))) > 0).astype(int)
train, test = frame.iloc[:1500], frame.iloc[1500:]
features = [f"x{i}" for i in range(8)]
model = sklearn.linear_model.LogisticRegression(C=${c}, max_iter=500).fit(train[features], train.y)
accuracy = float(model.score(test[features], test.y))
print(json.dumps({"accuracy": round(accuracy, 4), "imported_already": imported_already,
                  "fit_ms": round((time.perf_counter() - t0) * 1000)}))
`;

const started = performance.now();
const sandboxes = await Sandbox.createMany(strengths.length, { snapshotTag, timeoutMs: 300_000 });
const spawnedMs = Math.round(performance.now() - started);
try {
  const rows = await Promise.all(
    strengths.map(async (c, i) => {
      const run = await (sandboxes[i] as Sandbox).runCode(trainWith(c), { timeoutMs: 240_000 });
      if (run.error) throw new Error(`C=${c}: ${run.error.name}: ${run.error.value}\n${run.error.traceback}`);
      return {
        C: c,
        ...(JSON.parse(run.stdout) as { accuracy: number; imported_already: boolean; fit_ms: number }),
      };
    }),
  );
  console.log(`${strengths.length} children spawned in ${spawnedMs} ms`);
  console.table(rows);
  const best = rows.reduce((a, b) => (b.accuracy > a.accuracy ? b : a));
  console.log(`best C: ${best.C} (held-out accuracy ${best.accuracy})`);
} finally {
  await Promise.allSettled(sandboxes.map((sandbox) => sandbox.kill()));
}
