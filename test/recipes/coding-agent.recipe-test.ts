/**
 * The coding-agent recipe (npm run test:recipes): git, pytest and flake8 with a sample project in E2B's default
 * user's home; a child commits a change, runs the tests and the linter there as that user.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { runExample } from "../support/examples.js";
import { qemusMentioning, tempHome } from "../support/host.js";

describe("recipe coding-agent", { timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-recipe-coding-");
    await createSnapshot(home, { tag: "coding-agent", template: "coding-agent" });
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  it("a child changes the project, runs pytest and flake8, and commits, in the project's directory", async () => {
    const script = [
      "set -e",
      "pwd",
      "git log --oneline | wc -l",
      "printf '\\n\\ndef double(x):\\n    return 2 * x\\n' >> calc/__init__.py",
      "python3 -m pytest -q",
      "flake8 . && echo lint-clean",
      "git commit -qam 'add double' && git log --oneline | wc -l",
    ].join("\n");
    const result = await forkChildren(home, { tag: "coding-agent", n: 2, exec: ["sh", "-c", script] });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, `${child.stdout}\n${child.stderr}`);
      assert.match(child.stdout, /^\/home\/user\/project$/m);
      assert.match(child.stdout, /3 passed/);
      assert.match(child.stdout, /^lint-clean$/m);
      assert.match(child.stdout, /^2$/m, "the commit went on top of the image's own");
    }
    const warm = await forkChildren(home, {
      tag: "coding-agent",
      n: 1,
      eval: "(FORKD_WARM_MARKER, 'pytest' in dir())",
    });
    assert.equal(warm.children[0]?.result, "('warm', True)");
  });

  it("examples/coding-agent/best-of-n.ts scores each candidate in a child of its own", async () => {
    const services = await openServices(home);
    try {
      const { stdout } = await runExample(services, home, {
        file: "coding-agent/best-of-n.ts",
        snapshotTag: "coding-agent",
      });
      const row = (name: string) =>
        new RegExp(`'${name}'\\s*│\\s*'([0-3])/3'\\s*│\\s*(true|false)`).exec(stdout);
      assert.deepEqual(row("correct")?.slice(1), ["3", "true"], stdout);
      assert.deepEqual(row("odd-only")?.slice(1), ["1", "true"], stdout);
      assert.deepEqual(row("lint-fails")?.slice(1), ["3", "false"], stdout);
      assert.deepEqual(row("syntax-error")?.slice(1), ["0", "false"], stdout);
      assert.match(stdout, /^best candidate: correct \(reward 1\)$/m);
      assert.deepEqual(services.sandboxes.list(), [], "the example killed its children");
      // The template's [egress] is what a spawn that names no policy gets.
      const [child] = await services.sandboxes.spawn({ snapshotTag: "coding-agent", n: 1, timeoutMs: 0 });
      const policy = {
        default: "deny",
        allowOut: [
          "*.githubusercontent.com",
          "codeload.github.com",
          "files.pythonhosted.org",
          "github.com",
          "pypi.org",
        ],
        denyOut: [],
      };
      assert.deepEqual(child?.network.policy, policy);
      assert.deepEqual((await services.snapshots.get("coding-agent")).egress_default, policy);
      await services.sandboxes.kill((child as { id: string }).id);
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
});
