/**
 * A parallel CI run with one child per test file: children of the `ci-parallel-pytest` snapshot start with
 * pytest and the project already imported; the runner lists the project's test files in the first child, gives
 * every file a child of its own (the first keeps the first file), runs `pytest` on it there and prints one row
 * per file. It exits 1 when any file failed, like a CI job.
 *
 *   forkd snapshot --tag ci-parallel-pytest --template ci-parallel-pytest    # once
 *   forkd daemon &
 *   node --import tsx examples/ci-parallel-pytest/run.ts [pytest arguments...]
 *
 * Settings as in examples/sdk/quickstart.ts (FORKD_URL, FORKD_TOKEN); FORKD_SNAPSHOT overrides the tag.
 */
import { CommandExitError, Sandbox } from "../../src/sdk/index.js";

const snapshotTag = process.env.FORKD_SNAPSHOT ?? "ci-parallel-pytest";
const pytestArgs = process.argv.slice(2);
const PROJECT = "/srv/project";

interface FileResult {
  file: string;
  passed: number;
  failed: number;
  seconds: number;
  ok: boolean;
}

/** pytest's counts from its last summary line ("3 passed, 1 failed in 0.12s"). */
function countsOf(output: string): { passed: number; failed: number } {
  const count = (what: string) => Number(new RegExp(`(\\d+) ${what}`).exec(output)?.[1] ?? 0);
  return { passed: count("passed"), failed: count("failed") + count("error") };
}

async function runFile(sandbox: Sandbox, file: string): Promise<FileResult> {
  const started = performance.now();
  const argv = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", ...pytestArgs, file];
  let output: string;
  let ok = true;
  try {
    const result = await sandbox.commands.run(argv, { cwd: PROJECT, timeoutMs: 600_000 });
    output = result.stdout;
  } catch (err) {
    if (!(err instanceof CommandExitError)) throw err;
    output = `${err.stdout}\n${err.stderr}`;
    ok = false;
  }
  const seconds = Math.round((performance.now() - started) / 100) / 10;
  return { file, ...countsOf(output), seconds, ok };
}

const started = performance.now();
const [collector] = await Sandbox.createMany(1, { snapshotTag, timeoutMs: 900_000 });
const sandboxes: Sandbox[] = [collector as Sandbox];
try {
  const listing = await (collector as Sandbox).commands.run(["sh", "-c", "ls tests/test_*.py"], {
    cwd: PROJECT,
  });
  const files = listing.stdout.split("\n").filter(Boolean);
  if (files.length === 0) throw new Error(`no test files under ${PROJECT}/tests`);
  if (files.length > 1)
    sandboxes.push(...(await Sandbox.createMany(files.length - 1, { snapshotTag, timeoutMs: 900_000 })));
  const spawnedMs = Math.round(performance.now() - started);
  const rows = await Promise.all(files.map((file, i) => runFile(sandboxes[i] as Sandbox, file)));
  console.log(`${files.length} test files, ${sandboxes.length} children spawned in ${spawnedMs} ms`);
  console.table(rows);
  const failed = rows.filter((r) => !r.ok);
  const total = rows.reduce((sum, r) => sum + r.passed, 0);
  console.log(
    failed.length === 0
      ? `all ${files.length} files passed (${total} tests) in ${Math.round(performance.now() - started)} ms`
      : `${failed.length} of ${files.length} files failed: ${failed.map((r) => r.file).join(", ")}`,
  );
  process.exitCode = failed.length === 0 ? 0 : 1;
} finally {
  await Promise.allSettled(sandboxes.map((sandbox) => sandbox.kill()));
}
