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
import { codeInterpreterTemplate } from "../support/code-interpreter-template.js";
import { e2bPythonVenv, PYTHON_TESTS_DIR, type PythonVenv } from "../support/python-venv.js";
import { INTERNET_HOSTS, startTestInternet, type TestInternet } from "../support/test-internet.js";

const execFileAsync = promisify(execFile);
const root = process.getuid?.() === 0;
const MAX_UPLOAD_MIB = 8;
/** The interpreter tests' template (test/e2b/code-interpreter: matplotlib, e2b_charts, Node.js), linked in as this tag. */
const INTERPRETER_TAG = "shared-code-interpreter";
const EVERY_FILE = [
  "test_sandbox.py",
  "test_code.py",
  "test_charts.py",
  "test_javascript.py",
  "test_network.py",
  "test_frameworks.py",
];
/**
 * What `npm test` runs: one or two tests of each file, each through the sync and the async API (the whole suite,
 * about 4.5 minutes here against 2 for this, is `npm run test:e2b-python`): commands and files, run_code's values,
 * streams and display outputs, a chart, a javascript context, the deny daemon's egress, and one framework.
 */
const REPRESENTATIVE = [
  "test_sandbox.py::test_commands",
  "test_sandbox.py::test_files",
  "test_sandbox.py::test_signed_urls_through_the_sandbox_url",
  "test_sandbox.py::test_filesystem_pause_resumes_by_a_cold_boot",
  "test_code.py::test_values_and_state",
  "test_code.py::test_stdout_and_stderr_stream_per_line",
  "test_code.py::test_display_outputs_and_several_results",
  "test_charts.py::test_plt_show_gives_png_and_line_chart",
  "test_javascript.py::test_javascript_cells_keep_state_and_stream",
  "test_network.py::test_allow_internet_access_true_does_not_widen_a_deny_daemon",
  "test_frameworks.py::test_smolagents_code_agent_runs_its_tool_loop_in_an_e2b_sandbox",
];

describe("E2B's Python SDKs on a real forkd daemon", { timeout: 40 * 60_000 }, () => {
  let venv: PythonVenv;
  let daemon: TestDaemon;
  let internet: TestInternet | undefined;
  let work: string;

  before(async () => {
    venv = await e2bPythonVenv();
    work = await mkdtemp(path.join(os.tmpdir(), "forkd-e2b-python-"));
    if (root) internet = await startTestInternet();
    daemon = await startDaemon(
      [
        "--default-snapshot",
        "shared-pyagent",
        "--e2b-max-upload-mib",
        String(MAX_UPLOAD_MIB),
        ...(internet ? ["--dns-upstream", internet.dns, "--egress", "deny"] : []),
      ],
      [],
      [{ template: await codeInterpreterTemplate(), tag: INTERPRETER_TAG }],
    );
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
        FORKD_TEST_INTERPRETER_TEMPLATE: INTERPRETER_TAG,
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
    // Each test's time (name, seconds), slowest first: what the suite's time goes to.
    const times = [...xml.matchAll(/<testcase [^>]*?\sname="([^"]+)"[^>]*?time="([\d.]+)"/g)]
      .map((m) => [m[1] as string, Number(m[2])] as const)
      .sort((a, b) => b[1] - a[1]);
    return {
      tests: count("tests"),
      failures: count("failures"),
      errors: count("errors"),
      output: result.stdout,
      times,
    };
  }

  it("runs the SDK, code-interpreter, network and framework suites, sync and async", async () => {
    // FORKD_PYTHON_TESTS: pytest node ids to run instead (a developer chasing one test); FORKD_PYTHON_SUITE=full
    // (npm run test:e2b-python): every file; else (npm test) the representative subset.
    const chosen = process.env.FORKD_PYTHON_TESTS?.split(/\s+/).filter(Boolean);
    const full = process.env.FORKD_PYTHON_SUITE === "full";
    const files = chosen ?? (full ? EVERY_FILE : REPRESENTATIVE);
    const counts = await pytest("sdk", files, {
      E2B_API_URL: daemon.tcpUrl,
      E2B_SANDBOX_URL: daemon.tcpUrl,
      E2B_API_KEY: daemon.token,
    });
    assert.equal(counts.failures + counts.errors, 0, counts.output);
    // Every chosen test ran, through both APIs where it takes one (a test that no longer exists fails pytest).
    const expected = chosen !== undefined ? chosen.length : full ? 56 : REPRESENTATIVE.length;
    assert.ok(
      counts.tests >= expected,
      `${counts.tests} tests ran, expected at least ${expected}:\n${counts.output}`,
    );
    process.stdout.write(
      `python: e2b ${venv.versions.e2b}, e2b-code-interpreter ${venv.versions["e2b-code-interpreter"]}: ` +
        `${counts.tests} tests\n` +
        counts.times.map(([name, seconds]) => `${seconds.toFixed(1)} s ${name}\n`).join(""),
    );
  });
});
