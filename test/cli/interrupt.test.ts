/**
 * Ctrl-C during `forkd snapshot` and `forkd fork`, and a template without Python end to end, through the real
 * CLI binary (needs `npm run build`). After an interrupt nothing may remain: no QEMU, no staging directory, no
 * run directory.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { packageRoot } from "../../src/image/package-root.js";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";

const FORKD_BIN = path.join(packageRoot(), "bin", "forkd.js");

function runCli(
  args: string[],
  env: NodeJS.ProcessEnv,
): { child: ChildProcess; done: Promise<{ code: number | null; stdout: string; stderr: string }> } {
  const child = spawn(process.execPath, [FORKD_BIN, ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (d) => {
    stdout += d;
  });
  child.stderr?.on("data", (d) => {
    stderr += d;
  });
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
    child.on("close", (code) => resolve({ code, stdout, stderr })),
  );
  return { child, done };
}

describe("CLI on real VMs (minimal template)", { timeout: 20 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let env: NodeJS.ProcessEnv;

  before(async () => {
    home = await tempHome("forkd-cli-");
    env = { ...process.env, FORKD_HOME: home.home };
  });
  after(async () => {
    await home.cleanup();
  });

  it("Ctrl-C during snapshot leaves no QEMU and no half-written snapshot", async () => {
    const { child, done } = runCli(["snapshot", "--tag", "interrupted", "--template", "minimal"], env);
    await waitFor("the parent QEMU", 600_000, async () =>
      (await qemusMentioning(home.home)).length > 0 ? true : undefined,
    );
    child.kill("SIGINT");
    const { code, stderr } = await done;
    assert.equal(code, 130, stderr);
    assert.deepEqual(await qemusMentioning(home.home), []);
    assert.deepEqual(await entries(home.snapshots), [], "no snapshot and no staging directory");
    assert.deepEqual(await entries(home.run), []);
  });

  it("snapshots and forks a template without Python, running a command in each child", async () => {
    const snap = await runCli(["snapshot", "--tag", "mini", "--template", "minimal", "--json"], env).done;
    assert.equal(snap.code, 0, snap.stderr);
    assert.equal(JSON.parse(snap.stdout).template.interpreter, "none");
    const fork = await runCli(
      ["fork", "--tag", "mini", "-n", "3", "--json", "--exec", "--", "sh", "-c", "echo $(hostname) ok"],
      env,
    ).done;
    assert.equal(fork.code, 0, fork.stderr);
    const out = JSON.parse(fork.stdout);
    assert.equal(out.n, 3);
    assert.ok(out.accelerator === "tcg" || out.accelerator === "kvm");
    for (const c of out.children) {
      assert.equal(c.exit_code, 0);
      assert.equal(c.stdout, `${c.id} ok\n`);
      assert.equal(typeof c.ready_ms, "number");
    }
    const evalInMinimal = await runCli(["fork", "--tag", "mini", "-n", "1", "--json", "--eval", "1+1"], env)
      .done;
    assert.equal(evalInMinimal.code, 1, "eval without an interpreter fails");
    assert.match(JSON.parse(evalInMinimal.stdout).children[0].error, /interpreter|python/i);
  });

  it("Ctrl-C during fork kills every child and removes their run directories", async () => {
    const { child, done } = runCli(["fork", "--tag", "mini", "-n", "30", "--concurrency", "4"], env);
    await waitFor("children", 120_000, async () =>
      (await qemusMentioning(home.run)).length >= 2 ? true : undefined,
    );
    child.kill("SIGINT");
    const { code, stderr } = await done;
    assert.equal(code, 130, stderr);
    assert.deepEqual(await qemusMentioning(home.home), []);
    assert.deepEqual(await entries(home.run), []);
  });

  it("rejects bad arguments with a one-line error and exit code 2", async () => {
    for (const args of [
      ["fork", "--tag", "mini", "-n", "0"],
      ["fork", "--tag", "mini", "-n", "100000"],
      ["fork", "--tag", "../x", "-n", "1"],
      ["snapshot", "--tag", "a/b"],
    ]) {
      const { code, stderr } = await runCli(args, env).done;
      assert.equal(code, 2, `${args.join(" ")}: ${stderr}`);
      assert.match(stderr, /n must be|-n must be|invalid tag|must match/);
    }
    const unknown = await runCli(["fork", "--tag", "nope", "-n", "1"], env).done;
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /snapshot "nope" not found/);
  });
});
