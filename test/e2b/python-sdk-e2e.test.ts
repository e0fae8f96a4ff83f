/**
 * The newest `e2b` and `e2b-code-interpreter` from PyPI, unmodified, in a venv (test/support/python-venv.ts),
 * against a real forkd daemon with real VMs: the pytest suite in test/e2b/python/ (every test through the sync
 * and the async API), configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. The daemon has no
 * --e2b-domain, so getHost names the daemon's own domain. As root the sandboxes have networks, the daemon's
 * default egress is deny (what test_network.py checks the SDKs cannot widen) and the tests' own "internet"
 * (test/support/test-internet.ts) is what they reach. One daemon, two long-lived sandboxes (one per API) for
 * most tests; the frameworks and the network tests make their own.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";
import { e2bPythonVenv, PYTHON_TESTS_DIR, type PythonVenv } from "../support/python-venv.js";
import { INTERNET_HOSTS, startTestInternet, type TestInternet } from "../support/test-internet.js";

const execFileAsync = promisify(execFile);
const root = process.getuid?.() === 0;
const MAX_UPLOAD_MIB = 8;

describe("E2B's Python SDKs on a real forkd daemon", { timeout: 40 * 60_000 }, () => {
  let venv: PythonVenv;
  let daemon: TestDaemon;
  let internet: TestInternet | undefined;
  let work: string;

  before(async () => {
    venv = await e2bPythonVenv();
    work = await mkdtemp(path.join(os.tmpdir(), "forkd-e2b-python-"));
    if (root) internet = await startTestInternet();
    daemon = await startDaemon([
      "--default-snapshot",
      "shared-pyagent",
      "--e2b-max-upload-mib",
      String(MAX_UPLOAD_MIB),
      ...(internet ? ["--dns-upstream", internet.dns, "--egress", "deny"] : []),
    ]);
  });

  after(async () => {
    if (daemon) {
      const log = daemon.log();
      await daemon.stop().catch((err: unknown) => {
        throw new Error(`${(err as Error).message}\ndaemon log:\n${log.slice(-4000)}`);
      });
    }
    await internet?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  /** Runs pytest on `files`; resolves with the counts from its JUnit report, failing with its output. */
  async function pytest(name: string, files: string[], env: Record<string, string>) {
    const report = path.join(work, `${name}.xml`);
    const args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", `--junitxml=${report}`, ...files];
    const result = await execFileAsync(venv.python, args, {
      cwd: PYTHON_TESTS_DIR,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/root",
        PYTHONDONTWRITEBYTECODE: "1",
        FORKD_TEST_NETWORKS: root ? "1" : "0",
        FORKD_TEST_INTERNET: JSON.stringify(INTERNET_HOSTS),
        ...env,
      },
      maxBuffer: 64 * 1024 * 1024,
      timeout: 30 * 60_000,
    }).catch((err: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(
        `pytest ${files.join(" ")} failed:\n${err.stdout ?? ""}\n${err.stderr ?? ""}\n${err.message}`,
      );
    });
    const xml = await readFile(report, "utf8");
    const count = (attr: string) => Number(new RegExp(`${attr}="(\\d+)"`).exec(xml)?.[1] ?? Number.NaN);
    return {
      tests: count("tests"),
      failures: count("failures"),
      errors: count("errors"),
      output: result.stdout,
    };
  }

  it("runs the SDK, code-interpreter, network and framework suites, sync and async", async () => {
    // FORKD_PYTHON_TESTS: pytest node ids to run instead of every file (a developer chasing one test).
    const chosen = process.env.FORKD_PYTHON_TESTS?.split(/\s+/).filter(Boolean);
    const files = chosen ?? ["test_sandbox.py", "test_code.py", "test_network.py", "test_frameworks.py"];
    const counts = await pytest("sdk", files, {
      E2B_API_URL: daemon.tcpUrl,
      E2B_SANDBOX_URL: daemon.tcpUrl,
      E2B_API_KEY: daemon.token,
    });
    assert.equal(counts.failures + counts.errors, 0, counts.output);
    assert.ok(
      chosen !== undefined || counts.tests >= 40,
      `every test ran, for both APIs (${counts.tests}):\n${counts.output}`,
    );
    process.stdout.write(
      `# python: e2b ${venv.versions.e2b}, e2b-code-interpreter ${venv.versions["e2b-code-interpreter"]}: ` +
        `${counts.tests} tests\n`,
    );
  });
});
