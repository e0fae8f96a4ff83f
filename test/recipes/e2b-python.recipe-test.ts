/**
 * The e2b-python recipe (npm run test:recipes: a Debian build, a push, and an E2B build with apt and pip from
 * the machine's configured indexes, under TCG): the base image is built with forkd from templates/e2b-python/
 * base.toml and its root filesystem (the step cache's OCI layout) pushed to a loopback registry; then the
 * recipe's own build.mjs, run as a user runs it, builds the template through E2B's template API with the
 * unmodified `e2b` SDK against a real daemon. A sandbox of the result answers with its app already serving, the
 * apt and pip packages installed, as the template's user in its working directory.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { Sandbox } from "e2b";
import { buildImage, loadTemplate } from "../../src/image/index.js";
import { STEP_LAYOUT, STEPS_DIR } from "../../src/image/step-cache.js";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";
import { REPO_ROOT } from "../support/examples.js";
import { freePort, Registry } from "../support/registry.js";

const execFileAsync = promisify(execFile);
const RECIPE = path.join(REPO_ROOT, "templates", "e2b-python");

describe("recipe e2b-python (built through E2B's template API)", { timeout: 60 * 60_000 }, () => {
  let dir: string;
  let registry: Registry;
  let daemon: TestDaemon;
  let base: string;
  let sandbox: Sandbox | undefined;

  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-recipe-e2b-python-"));
    registry = new Registry(dir, await freePort());
    await registry.start();
    // The base: forkd's own Debian build, its last step's tree pushed as an ordinary registry image.
    const built = await buildImage(await loadTemplate(path.join(RECIPE, "base.toml"), { allowFiles: true }));
    // image.json records each step's cache key; the last one's entry is the tree after every step.
    const manifest = JSON.parse(await fs.readFile(path.join(built.dir, "image.json"), "utf8")) as {
      steps?: { key: string }[];
    };
    const last = manifest.steps?.at(-1)?.key;
    assert.ok(last, "the base build records its steps");
    const layout = path.join(path.dirname(built.dir), STEPS_DIR, last, STEP_LAYOUT);
    base = `127.0.0.1:${registry.port}/forkd/e2b-python-base:bookworm`;
    await execFileAsync(
      "skopeo",
      ["copy", "--quiet", "--dest-tls-verify=false", `oci:${layout}:image`, `docker://${base}`],
      {
        timeout: 10 * 60_000,
      },
    );
    daemon = await startDaemon();
  });

  after(async () => {
    await sandbox?.kill().catch(() => {});
    if (daemon) {
      const log = daemon.log();
      await daemon.stop().catch((err: unknown) => {
        throw new Error(`${(err as Error).message}\ndaemon log:\n${log.slice(-4000)}`);
      });
    }
    await registry?.stop();
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  it("build.mjs builds the template; its sandboxes serve the app with the packages installed", async () => {
    const env = {
      ...process.env,
      E2B_API_URL: daemon.tcpUrl,
      E2B_SANDBOX_URL: daemon.tcpUrl,
      E2B_API_KEY: daemon.token,
    };
    const { stdout } = await execFileAsync(
      process.execPath,
      [path.join(RECIPE, "build.mjs"), base, "e2b-python:v1"],
      {
        cwd: REPO_ROOT,
        env,
        timeout: 40 * 60_000,
        maxBuffer: 64 * 1024 * 1024,
      },
    ).catch((err: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(
        `build.mjs failed: ${err.message}\n${(err.stdout ?? "").slice(-6000)}\n${err.stderr ?? ""}`,
      );
    });
    assert.match(stdout, /^built e2b-python:v1 template \S+ build \S+$/m, stdout.slice(-4000));
    assert.match(
      stdout,
      /^step \d+\/\d+: run apt-get update && DEBIAN_FRONTEND=noninteractive/m,
      "the aptInstall step",
    );
    assert.match(
      stdout,
      /^step \d+\/\d+: run pip install tabulate==0\.9\.0 \(network\) \([\d.]+ s\)$/m,
      "the pipInstall step",
    );

    const saved = { ...process.env };
    Object.assign(process.env, {
      E2B_API_URL: env.E2B_API_URL,
      E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
      E2B_API_KEY: env.E2B_API_KEY,
    });
    try {
      sandbox = await Sandbox.create("e2b-python", { timeoutMs: 10 * 60_000 });
      const table = await sandbox.commands.run("curl -s http://127.0.0.1:8080/");
      assert.equal(
        table.stdout,
        "| part    |   price |\n|---------|---------|\n| gear    |   12.5  |\n| spring  |    3.2  |\n| bearing |    7.95 |\n",
      );
      const json = await sandbox.commands.run("curl -s http://127.0.0.1:8080/json | jq -r .title");
      assert.equal(json.stdout, "parts\n", "jq from aptInstall, APP_TITLE from setEnvs");
      const who = await sandbox.commands.run(
        "id -un && pwd && python3 -c 'import tabulate; print(tabulate.__version__)'",
      );
      assert.equal(who.stdout, "user\n/home/user/app\n0.9.0\n");
    } finally {
      process.env = saved;
    }
  });
});
