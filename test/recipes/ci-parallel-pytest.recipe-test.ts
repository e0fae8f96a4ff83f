/**
 * The ci-parallel-pytest recipe (npm run test:recipes: a Debian build and a warm-up under TCG):
 * examples/ci-parallel-pytest/run.ts, run as a user runs it, gives each of the project's three test files a child
 * of its own; every child starts with pytest and the project imported. A run whose files all pass exits 0 with
 * one row per file; a run where pytest fails in every child (no test selected) exits 1 naming the files.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { runExample } from "../support/examples.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const TAG = "ci-parallel-pytest";

describe("recipe ci-parallel-pytest", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Awaited<ReturnType<typeof openServices>>;

  before(async () => {
    home = await tempHome("forkd-recipe-cipytest-");
    await createSnapshot(home, { tag: TAG, template: TAG });
    services = await openServices(home);
  });

  after(async () => {
    await services?.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("children start with pytest and the project imported", async () => {
    const warm = await forkChildren(home, {
      tag: TAG,
      n: 1,
      eval: "(FORKD_WARM_MARKER, textkit.slugify('Warm Start'), 'pytest' in dir())",
    });
    assert.equal(warm.children[0]?.error, null, warm.children[0]?.error ?? "");
    assert.equal(warm.children[0]?.result, "('warm', 'warm-start', True)");
  });

  it("runs one child per test file and reports each file", async () => {
    const { stdout } = await runExample(services, home, {
      file: "ci-parallel-pytest/run.ts",
      snapshotTag: TAG,
    });
    assert.match(stdout, /^3 test files, 3 children spawned in \d+ ms$/m, stdout);
    for (const [file, passed] of [
      ["tests/test_slugify.py", 4],
      ["tests/test_summary.py", 2],
      ["tests/test_wrap.py", 3],
    ] as const) {
      assert.match(
        stdout,
        new RegExp(`${file.replace(/[./]/g, "\\$&")}'?\\s*│\\s*${passed}\\s*│\\s*0\\s*│[^│]*│\\s*true`),
        stdout,
      );
    }
    assert.match(stdout, /^all 3 files passed \(9 tests\) in \d+ ms$/m);
    assert.deepEqual(services.sandboxes.list(), [], "the runner killed its children");
  });

  it("exits 1 naming the failed files when pytest fails in the children", async () => {
    await assert.rejects(
      runExample(services, home, {
        file: "ci-parallel-pytest/run.ts",
        snapshotTag: TAG,
        args: ["-m", "no_such_marker"],
      }),
      (err: { code?: number; stdout?: string }) => {
        assert.equal(err.code, 1, err.stdout);
        assert.match(
          err.stdout ?? "",
          /^3 of 3 files failed: tests\/test_slugify\.py, tests\/test_summary\.py, tests\/test_wrap\.py$/m,
        );
        return true;
      },
    );
    assert.deepEqual(services.sandboxes.list(), [], "the runner killed its children");
  });
});
