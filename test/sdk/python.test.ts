/**
 * The Python SDK (sdk/python): built into a wheel with the setuptools a venv already has (no index), installed
 * into a clean venv (nothing but pip and setuptools), type-checked with Debian's mypy for Python 3.9, then its
 * unittest suite runs from that venv against a real `forkd daemon` with real VMs: the SDK's own tests, its
 * examples, and forkd v0.5 client code run unmodified (sdk/python/tests/v05_usage.py).
 */
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { cp, mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { packageRoot } from "../../src/image/package-root.js";
import { startDaemon, type TestDaemon } from "./daemon-fixture.js";

const execFileAsync = promisify(execFile);
const SDK = path.join(packageRoot(), "sdk", "python");
/** Debian's interpreter (the one apt's mypy and python3-wheel belong to), unless the caller names another. */
const PYTHON =
  process.env.FORKD_TEST_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");

async function run(file: string, args: string[], options: { cwd?: string; env?: NodeJS.ProcessEnv } = {}) {
  try {
    return await execFileAsync(file, args, { ...options, maxBuffer: 64 * 1024 * 1024 });
  } catch (err) {
    const failed = err as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `${file} ${args.join(" ")} failed: ${failed.message}\n${failed.stdout ?? ""}\n${failed.stderr ?? ""}`,
    );
  }
}

describe("Python SDK", { timeout: 45 * 60_000 }, () => {
  let work: string;
  let venvPython: string;

  before(async () => {
    work = await mkdtemp(path.join(os.tmpdir(), "forkd-python-sdk-"));
    // Built from a copy, so the build's egg-info and build/ never land in the source tree.
    await cp(SDK, path.join(work, "src"), {
      recursive: true,
      filter: (source) => !source.includes("__pycache__") && !source.endsWith(".egg-info"),
    });
  });
  after(async () => {
    await rm(work, { recursive: true, force: true });
  });

  it("builds a wheel and installs with --no-build-isolation, from no index, into a clean venv", async () => {
    // setuptools < 70.1 builds wheels through the `wheel` package: Debian's python3-wheel, seen by this venv only.
    await run(PYTHON, ["-m", "venv", "--system-site-packages", path.join(work, "build-venv")]);
    const buildPip = path.join(work, "build-venv", "bin", "pip");
    const noIndex = ["--no-index", "--disable-pip-version-check", "--quiet"];
    await run(buildPip, [
      "wheel",
      ...noIndex,
      "--no-build-isolation",
      "--no-deps",
      "-w",
      path.join(work, "dist"),
      path.join(work, "src"),
    ]);
    await run(buildPip, ["install", ...noIndex, "--no-build-isolation", path.join(work, "src")]);
    const fromSource = await run(
      path.join(work, "build-venv", "bin", "python"),
      ["-c", "import forkd; print(forkd.__file__)"],
      {
        cwd: work,
      },
    );
    assert.match(fromSource.stdout, /build-venv\/lib\/python3[^/]*\/site-packages\/forkd\/__init__\.py/);

    const [wheel] = (await readdir(path.join(work, "dist"))).filter((f) => f.endsWith(".whl"));
    assert.match(String(wheel), /^forkd-0\.1\.0-py3-none-any\.whl$/);
    await run(PYTHON, ["-m", "venv", path.join(work, "venv")]);
    venvPython = path.join(work, "venv", "bin", "python");
    await run(path.join(work, "venv", "bin", "pip"), [
      "install",
      ...noIndex,
      path.join(work, "dist", String(wheel)),
    ]);
    const installed = await run(path.join(work, "venv", "bin", "pip"), [
      "list",
      "--format=freeze",
      "--disable-pip-version-check",
    ]);
    const names = installed.stdout
      .trim()
      .split("\n")
      .map((line) => line.split("==")[0]?.toLowerCase());
    assert.deepEqual(names.sort(), ["forkd", "pip", "setuptools"], "the wheel pulls in nothing");
  });

  it("type-checks with mypy --strict for Python 3.9 (the package, its examples and its tests)", async () => {
    const mypy = await run("mypy", ["--version"]).catch(() => undefined);
    assert.ok(mypy, "mypy is not installed: scripts/install-deps.sh installs Debian's mypy");
    const src = path.join(work, "src");
    await run(
      "mypy",
      ["--strict", "--python-version", "3.9", "--cache-dir", path.join(work, "mypy-cache"), "forkd"],
      { cwd: src },
    );
    for (const dir of ["examples", "tests"]) {
      await run("mypy", ["--python-version", "3.9", "--cache-dir", path.join(work, "mypy-cache"), dir], {
        cwd: src,
        env: { ...process.env, MYPYPATH: `${src}:${path.join(src, "tests")}` },
      });
    }
  });

  describe("against a real daemon with real VMs", () => {
    let daemon: TestDaemon;

    before(async () => {
      daemon = await startDaemon();
      // v0.5 client code spawns from "pyagent": a flat copy of the shared snapshot (no boot) gives it that tag.
      await daemon.controller.compactSnapshot(daemon.tag, "pyagent");
    });
    after(async () => {
      await daemon?.stop();
    });

    it("passes the SDK's unittest suite: e2e, examples, v0.5 replay, settings, transport", async () => {
      assert.ok(venvPython, "the wheel was installed");
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        FORKD_TEST_URL: daemon.socketUrl,
        FORKD_TEST_TCP_URL: daemon.tcpUrl,
        FORKD_TEST_TOKEN: daemon.token,
        FORKD_TEST_SNAPSHOT: daemon.tag,
        FORKD_TEST_INSTALLED: "1",
        PYTHONDONTWRITEBYTECODE: "1",
      };
      delete env.FORKD_URL;
      delete env.FORKD_TOKEN;
      const { code, output } = await new Promise<{ code: number | null; output: string }>((resolve) => {
        // cwd outside the source tree: `forkd` can only come from the installed wheel.
        const child = spawn(venvPython, ["-m", "unittest", "discover", "-s", path.join(SDK, "tests"), "-v"], {
          cwd: work,
          env,
          stdio: ["ignore", "pipe", "pipe"],
        });
        let text = "";
        child.stdout.on("data", (d) => {
          text += d;
        });
        child.stderr.on("data", (d) => {
          text += d;
        });
        child.on("close", (exitCode) => resolve({ code: exitCode, output: text }));
      });
      console.log(
        output
          .split("\n")
          .filter((l) => / \.\.\. |^Ran |^OK|^FAILED/.test(l))
          .join("\n"),
      );
      assert.equal(code, 0, `${output}\n${daemon.log()}`);
      assert.match(output, /^OK$/m, output);
      assert.doesNotMatch(
        output,
        /skipped/,
        "nothing may be skipped here: the daemon and the wheel are there",
      );
      const ran = Number(/^Ran (\d+) tests/m.exec(output)?.[1]);
      assert.ok(ran >= 30, `ran ${ran} tests`);
      assert.deepEqual(
        await daemon.controller.listSandboxes(),
        [],
        "the Python tests killed their sandboxes",
      );
    });
  });
});
