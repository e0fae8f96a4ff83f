/**
 * Best-of-N for a coding agent: every candidate solution to one task gets a child of the `coding-agent`
 * snapshot (git, pytest and flake8 with the sample project checked out, pytest already imported), is written
 * into the project, and is scored by the hidden tests and the linter, all children at once. The reward per
 * candidate is what an RL rollout or a best-of-N sampler would keep. The candidates here are fixed strings
 * standing in for a model's samples: one right, one wrong on even-length input, one that fails the linter,
 * one that does not even import.
 *
 *   forkd snapshot --tag coding-agent --template coding-agent    # once
 *   forkd daemon &
 *   node --import tsx examples/coding-agent/best-of-n.ts
 *
 * Settings as in examples/sdk/quickstart.ts (FORKD_URL, FORKD_TOKEN); FORKD_SNAPSHOT overrides the tag.
 */
import { CommandExitError, Sandbox } from "../../src/sdk/index.js";

const snapshotTag = process.env.FORKD_SNAPSHOT ?? "coding-agent";
const PROJECT = "/home/user/project";

/** The task: add `median` to the sample project's calc package. The agent never sees these tests. */
const HIDDEN_TESTS = `from calc.stats import median


def test_odd():
    assert median([3, 1, 2]) == 2


def test_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_unsorted_input_is_not_changed():
    values = [3, 1, 2]
    median(values)
    assert values == [3, 1, 2]
`;

const CANDIDATES: Record<string, string> = {
  correct: `def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
`,
  "odd-only": `def median(values):
    values.sort()
    return values[len(values) // 2]
`,
  "lint-fails": `import os
def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
`,
  "syntax-error": `def median(values)
    return sorted(values)[len(values) // 2]
`,
};

/** Runs a command and returns its exit code and output, a non-zero exit included. */
async function attempt(sandbox: Sandbox, cmd: string) {
  try {
    const r = await sandbox.commands.run(cmd, { cwd: PROJECT });
    return { exitCode: r.exitCode, output: r.stdout + r.stderr };
  } catch (err) {
    if (!(err instanceof CommandExitError)) throw err;
    return { exitCode: err.exitCode, output: err.stdout + err.stderr };
  }
}

const names = Object.keys(CANDIDATES);
const started = performance.now();
const sandboxes = await Sandbox.createMany(names.length, { snapshotTag, timeoutMs: 300_000 });
const spawnedMs = Math.round(performance.now() - started);
try {
  const rows = await Promise.all(
    names.map(async (name, i) => {
      const sandbox = sandboxes[i] as Sandbox;
      const t0 = performance.now();
      await sandbox.files.write(`${PROJECT}/calc/stats.py`, CANDIDATES[name] as string);
      await sandbox.files.write(`${PROJECT}/tests/test_stats.py`, HIDDEN_TESTS);
      const tests = await attempt(sandbox, "python3 -m pytest -q -p no:cacheprovider tests/test_stats.py");
      const lint = await attempt(sandbox, "flake8 calc/stats.py");
      const passed = Number(/(\d+) passed/.exec(tests.output)?.[1] ?? 0);
      const lintClean = lint.exitCode === 0;
      return {
        candidate: name,
        tests_passed: `${passed}/3`,
        lint_clean: lintClean,
        reward: (passed / 3) * (lintClean ? 1 : 0.5),
        ms: Math.round(performance.now() - t0),
      };
    }),
  );
  console.log(`${names.length} children spawned in ${spawnedMs} ms`);
  console.table(rows);
  const best = rows.reduce((a, b) => (b.reward > a.reward ? b : a));
  console.log(`best candidate: ${best.candidate} (reward ${best.reward})`);
} finally {
  await Promise.allSettled(sandboxes.map((sandbox) => sandbox.kill()));
}
