/**
 * The unmodified `e2b` and `@e2b/code-interpreter` packages against a real forkd daemon (TCP listener, token)
 * with real VMs, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. Few sandboxes, many
 * assertions each: one source sandbox, two forks of it, one locked-down sandbox for the network options. As
 * root the sandboxes have networks: egress against the tests' own "internet" (test/support/test-internet.ts)
 * and servers started in them reached through getHost(port).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  ALL_TRAFFIC,
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  type FilesystemEvent,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from "@e2b/code-interpreter";
import { Sandbox as BaseSandbox } from "e2b";
import { Filesystem } from "../../src/e2b/envd/gen/filesystem/filesystem_pb.js";
import { Process } from "../../src/e2b/envd/gen/process/process_pb.js";
import { send } from "../api/raw-http.js";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";
import { codeInterpreterTemplate } from "../support/code-interpreter-template.js";
import {
  FETCH_DEF,
  HTTP_ECHO,
  throughWebSocket as throughDaemonWebSocket,
  WS_ECHO,
} from "../support/guest-programs.js";
import { waitFor } from "../support/host.js";
import { INTERNET_HOSTS, startTestInternet, type TestInternet } from "../support/test-internet.js";

const execFileAsync = promisify(execFile);
const LIFETIME_MS = 20 * 60_000;
const MAX_UPLOAD_MIB = 8;
/** Sandbox networks need root (namespaces, nftables); without it the network tests are skipped. */
const root = process.getuid?.() === 0;
const needsNetworks = { skip: !root && "needs root: sandbox networks" };
const E2B_DOMAIN = "e2b.forkd.test";
const HTTPS_PORT = 8443;
// biome-ignore lint/suspicious/noTemplateCurlyInString: E2B's literal placeholder for the port.
const MASK = "app-${PORT}.internal";
/** The interpreter tests' template (test/e2b/code-interpreter: matplotlib, e2b_charts, Node.js), linked in as this tag. */
const INTERPRETER_TAG = "shared-code-interpreter";
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

interface Echoed {
  path: string;
  host: string;
  headers: Record<string, string>;
  body: string;
  tls: boolean;
}

describe("E2B SDKs on a real forkd daemon", { timeout: 30 * 60_000 }, () => {
  let daemon: TestDaemon;
  let sbx: Sandbox;
  let internet: TestInternet | undefined;
  /** Created without internet, public traffic or the request's Host; its network changes while it runs. */
  let locked: Sandbox | undefined;
  const saved = { ...process.env };

  before(async () => {
    if (root) internet = await startTestInternet();
    daemon = await startDaemon(
      [
        "--default-snapshot",
        "shared-pyagent",
        "--e2b-max-upload-mib",
        String(MAX_UPLOAD_MIB),
        "--e2b-domain",
        E2B_DOMAIN,
        ...(internet ? ["--dns-upstream", internet.dns] : []),
      ],
      [],
      [{ template: await codeInterpreterTemplate(), tag: INTERPRETER_TAG }],
    );
    // The three variables, as a user switching from E2B sets them.
    process.env.E2B_API_URL = daemon.tcpUrl;
    process.env.E2B_SANDBOX_URL = daemon.tcpUrl;
    process.env.E2B_API_KEY = daemon.token;
    sbx = await Sandbox.create({
      envs: { GREETING: "from-create" },
      metadata: { suite: "e2b-e2e", run: randomBytes(4).toString("hex") },
      timeoutMs: LIFETIME_MS,
      // A deny list (the internet but one address) and one port serving HTTPS.
      ...(root ? { network: { denyOut: [INTERNET_HOSTS.denied], httpsPorts: [HTTPS_PORT] } } : {}),
    });
  });

  after(async () => {
    process.env = saved;
    await locked?.kill().catch(() => {});
    await (await interpreterSandbox?.catch(() => undefined))?.kill().catch(() => {});
    if (daemon) {
      const log = daemon.log();
      await daemon.stop().catch((err: unknown) => {
        throw new Error(`${(err as Error).message}\ndaemon log:\n${log.slice(-4000)}`);
      });
    }
    await internet?.stop();
  });

  /** What `fetch(url)` (FETCH_DEF) in the sandbox's interpreter prints: "OK <body>" or "ERR <why>". */
  const fetchIn = async (sandbox: Sandbox, url: string, timeout = 8) => {
    const run = await sandbox.runCode(`print(fetch(${JSON.stringify(url)}, ${timeout}))`, {
      timeoutMs: (timeout + 30) * 1000,
    });
    assert.equal(run.error, undefined, JSON.stringify(run.error));
    return run.logs.stdout.join("").trim();
  };
  /** A request to the daemon's listener with exactly these headers (a Host of getHost(port), say). */
  const toListener = (pathAndQuery: string, headers: Record<string, string>, body?: string) => {
    const { hostname, port } = new URL(daemon.tcpUrl);
    return send({ host: hostname, port: Number(port) }, body === undefined ? "GET" : "POST", pathAndQuery, {
      headers,
      body,
    });
  };
  const throughWebSocket = (headers: Record<string, string>, message: string) =>
    throughDaemonWebSocket(daemon.tcpUrl, headers, message);
  const trafficToken = (s: Sandbox) => (s as unknown as { trafficAccessToken: string }).trafficAccessToken;
  /** Starts a guest program in the background, as E2B code does: commands.run(..., { background: true }). */
  const serve = async (sandbox: Sandbox, name: string, program: string, args: string) => {
    await sandbox.files.write(`/tmp/${name}.py`, program);
    const handle = await sandbox.commands.run(`python3 /tmp/${name}.py ${args}`, { background: true });
    assert.ok(handle.pid > 0);
  };

  it("runs code in the warm interpreter: values, state across cells, output, errors, env, contexts", async () => {
    // numpy was imported before the snapshot: no import here.
    assert.equal((await sbx.runCode("numpy.arange(10).sum()")).text, "45");
    await sbx.runCode("counter = 41");
    assert.equal((await sbx.runCode("counter + 1")).text, "42");

    const printed: string[] = [];
    const run = await sbx.runCode(
      "print('line one'); print('line', 'two'); import sys; print('to stderr', file=sys.stderr); 7",
      {
        onStdout: (m) => {
          printed.push(m.line);
        },
      },
    );
    assert.equal(run.text, "7");
    assert.deepEqual(run.logs.stdout, ["line one\n", "line two\n"], "one event per line, as Jupyter streams");
    assert.deepEqual(run.logs.stderr, ["to stderr\n"]);
    assert.deepEqual(printed, ["line one\n", "line two\n"]);
    assert.ok((run.executionCount ?? 0) >= 1, "the execution count is reported");

    const failed = await sbx.runCode("1 / 0");
    assert.equal(failed.error?.name, "ZeroDivisionError");
    assert.match(failed.error?.value ?? "", /division by zero/);
    assert.match(failed.error?.traceback ?? "", /ZeroDivisionError/);

    const html = await sbx.runCode(
      "class Bold:\n    def _repr_html_(self):\n        return '<b>bold</b>'\n    def __repr__(self):\n        return 'Bold()'\nBold()",
    );
    assert.equal(html.text, "Bold()");
    assert.equal(html.results[0]?.html, "<b>bold</b>");
    const shown = await sbx.runCode("display(Bold()); display('two'); 3");
    assert.deepEqual(
      shown.results.map((r) => [r.isMainResult, r.text, r.html]),
      [
        [false, "Bold()", "<b>bold</b>"],
        [false, "two", undefined],
        [true, "3", undefined],
      ],
      "display() outputs, then the cell's value",
    );

    // Sandbox-level envVars reach the interpreter; runCode's own envs lie over them for one cell.
    assert.equal((await sbx.runCode("import os; os.environ['GREETING']")).text, "from-create");
    const envs = await sbx.runCode("os.environ['GREETING'] + ' ' + os.environ['ONLY_HERE']", {
      envs: { GREETING: "per-cell", ONLY_HERE: "yes" },
    });
    assert.equal(envs.text, "per-cell yes");

    const context = await sbx.createCodeContext({ cwd: "/tmp" });
    assert.equal(context.language, "python");
    const isolated = await sbx.runCode("counter", { context });
    assert.equal(isolated.error?.name, "NameError", "a new context does not see the default one's names");
    assert.equal((await sbx.runCode("import os; os.getcwd()", { context })).text, "/tmp");
    assert.equal(
      (await sbx.runCode("numpy.arange(3).sum()", { context })).text,
      "3",
      "warm names in a new context",
    );
    const listed = await sbx.listCodeContexts();
    assert.ok(listed.some((c) => c.id === context.id));
    await sbx.runCode("in_context = 1", { context });
    await sbx.restartCodeContext(context);
    assert.equal((await sbx.runCode("in_context", { context })).error?.name, "NameError");
    await sbx.removeCodeContext(context);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === context.id));
  });

  /** A sandbox of the interpreter tests' template (matplotlib, e2b_charts, Node.js), made on first use. */
  let interpreterSandbox: Promise<Sandbox> | undefined;
  const interpreter = () => {
    interpreterSandbox ??= Sandbox.create(INTERPRETER_TAG, { timeoutMs: 10 * 60_000 });
    return interpreterSandbox;
  };

  it("shows matplotlib figures as PNG results with E2B's chart data (plt.show() and at the cell's end)", async () => {
    const charts = await interpreter();
    const figureOf = (run: Awaited<ReturnType<Sandbox["runCode"]>>) => {
      assert.equal(run.error, undefined, JSON.stringify(run.error));
      assert.deepEqual(
        run.results.map((r) => r.isMainResult),
        [false],
        "one display result, no main result",
      );
      const [figure] = run.results;
      assert.ok(figure?.png && Buffer.from(figure.png, "base64").subarray(0, 8).equals(PNG_MAGIC));
      assert.match(figure.text ?? "", /^<Figure size/);
      assert.ok(figure.chart, "e2b_charts' data");
      return figure.chart as unknown as Record<string, unknown> & { elements: Record<string, unknown>[] };
    };
    const line = await charts.runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9], label='squares')\n" +
        "plt.title('Squares'); plt.xlabel('n'); plt.ylabel('n squared'); plt.legend()\nplt.show()\nprint('after')",
    );
    assert.deepEqual(line.logs, { stdout: ["after\n"], stderr: [] }, "plt.show() displays: no Agg warning");
    const lineChart = figureOf(line);
    assert.equal(lineChart.type, "line");
    assert.deepEqual([lineChart.title, lineChart.x_label, lineChart.y_label], ["Squares", "n", "n squared"]);
    assert.deepEqual(
      lineChart.elements.map((e) => [e.label, (e.points as number[][]).map((p) => p.map(Number))]),
      [
        [
          "squares",
          [
            [1, 1],
            [2, 4],
            [3, 9],
          ],
        ],
      ],
    );
    assert.equal((await charts.runCode("len(plt.get_fignums())")).text, "0", "plt.show() closed it");
    const bar = figureOf(
      await charts.runCode(
        "figure, axes = plt.subplots()\nbars = axes.bar(['apples', 'pears'], [3, 5], label='fruit')",
      ),
    );
    assert.equal(bar.type, "bar");
    assert.deepEqual(
      bar.elements.map((e) => [e.label, Number(e.value), e.group]),
      [
        ["apples", 3, "fruit"],
        ["pears", 5, "fruit"],
      ],
    );
  });

  it("runs javascript contexts where the image has node; elsewhere the error names what it lacks", async () => {
    const js = await interpreter();
    const first = await js.runCode("const greeting = 'hi'; console.log(greeting); 40 + 2", {
      language: "javascript",
    });
    assert.equal(first.error, undefined, JSON.stringify(first.error));
    assert.equal(first.text, "42");
    assert.deepEqual(first.logs.stdout, ["hi\n"]);
    const again = await js.runCode("greeting + '!'", { language: "javascript" });
    assert.equal(again.text, "hi!", "the default javascript context keeps its names");
    const thrown = await js.runCode("console.log('before'); null.x", { language: "javascript" });
    assert.equal(thrown.error?.name, "TypeError");
    assert.match(thrown.error?.traceback ?? "", /TypeError/);
    assert.deepEqual(thrown.logs.stdout, ["before\n"]);
    const awaited = await js.runCode("new Promise((resolve) => setTimeout(() => resolve(7), 20))", {
      language: "javascript",
    });
    assert.equal(awaited.text, "7", "a promise's value, once it settles");
    const topLevel = await js.runCode(
      "const slept = await new Promise((r) => setTimeout(() => r(5), 20)); slept * 2",
      {
        language: "javascript",
      },
    );
    assert.equal(topLevel.text, "10", "top-level await, as E2B's kernel has it");
    assert.equal((await js.runCode("slept", { language: "javascript" })).text, "5", "its names stay");
    const envs = await js.runCode("process.env.ONLY_HERE", {
      language: "javascript",
      envs: { ONLY_HERE: "yes" },
    });
    assert.equal(envs.text, "yes");
    const context = await js.createCodeContext({ language: "javascript", cwd: "/tmp" });
    assert.equal(context.language, "javascript");
    assert.equal(
      (await js.runCode("typeof greeting", { context })).text,
      "undefined",
      "a context of its own",
    );
    assert.equal((await js.runCode("process.cwd()", { context })).text, "/tmp");
    await assert.rejects(js.runCode("while (true) {}", { context, timeoutMs: 3000 }), TimeoutError);
    assert.equal(
      (await js.runCode("1 + 1", { context })).text,
      "2",
      "an interrupted cell leaves the context usable",
    );
    await js.removeCodeContext(context);

    const bash = await js.runCode("echo $((6 * 7))", { language: "bash" });
    assert.deepEqual(bash.logs.stdout, ["42\n"], "bash beside javascript in one sandbox");
    // The JS SDK shows only the status of a refused cell (the Python test reads the message naming the
    // languages this interpreter runs, and what an image lacks).
    await assert.rejects(js.runCode("1", { language: "typescript" }), (err: Error) => {
      assert.match(err.message, /^400/);
      return true;
    });

    // The pyagent image has no Node.js: 501 (its message names what the image lacks).
    await assert.rejects(sbx.runCode("1", { language: "javascript" }), (err: Error) => {
      assert.match(err.message, /^501/);
      return true;
    });
  });

  it("runs commands: exit codes, streaming, users and their homes, background processes, stdin, kill", async () => {
    const who = await sbx.commands.run("whoami; pwd; echo $HOME; echo $GREETING");
    assert.equal(who.stdout, "user\n/home/user\n/home/user\nfrom-create\n");
    assert.equal((await sbx.commands.run("whoami", { user: "root" })).stdout, "root\n");

    const failure = await sbx.commands.run("echo out; echo err >&2; exit 3").catch((e: unknown) => e);
    assert.ok(failure instanceof CommandExitError);
    assert.equal(failure.exitCode, 3);
    assert.equal(failure.stdout, "out\n");
    assert.equal(failure.stderr, "err\n");

    const chunks: string[] = [];
    const streamed = await sbx.commands.run("for i in 1 2 3; do echo tick $i; sleep 0.2; done", {
      onStdout: (d) => {
        chunks.push(d);
      },
      cwd: "/tmp",
      envs: { EXTRA: "x" },
    });
    assert.equal(streamed.stdout, "tick 1\ntick 2\ntick 3\n");
    assert.equal(chunks.join(""), streamed.stdout);

    const sleeper = await sbx.commands.run("sleep 600", { background: true });
    assert.ok(sleeper.pid > 0);
    const running = await sbx.commands.list();
    const entry = running.find((p) => p.pid === sleeper.pid);
    assert.ok(entry, "the background process is listed");
    assert.deepEqual(entry.args, ["-l", "-c", "sleep 600"]);
    assert.equal(await sbx.commands.kill(sleeper.pid), true);
    await waitFor("the killed process to leave the list", 30_000, async () =>
      (await sbx.commands.list()).some((p) => p.pid === sleeper.pid) ? undefined : true,
    );
    assert.equal(await sbx.commands.kill(sleeper.pid), false, "killing a process that is gone says so");

    const cat = await sbx.commands.run("cat", { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, "typed in\n");
    await sbx.commands.closeStdin(cat.pid);
    assert.equal((await cat.wait()).stdout, "typed in\n");

    // Reconnect to a running process by pid: its output continues on the new handle.
    const ticker = await sbx.commands.run("sleep 1; echo later", { background: true });
    await ticker.disconnect();
    const again = await sbx.commands.connect(ticker.pid);
    assert.equal((await again.wait()).stdout.trim(), "later");

    const timedOut = await sbx.commands.run("sleep 30", { timeoutMs: 1500 }).catch((e: unknown) => e);
    assert.ok(
      timedOut instanceof TimeoutError,
      `a command past its timeoutMs raises TimeoutError (${timedOut})`,
    );
  });

  it("moves files: binary round trip, many at once, list, exists, info, rename, remove; bad paths and sizes", async () => {
    const binary = Buffer.concat([
      Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
      randomBytes(5 << 20),
    ]);
    await sbx.files.write("data/blob.bin", new Uint8Array(binary).buffer);
    const back = Buffer.from(await sbx.files.read("data/blob.bin", { format: "bytes" }));
    assert.ok(back.equals(binary), "a 5 MiB binary file comes back byte for byte");

    const written = await sbx.files.write([
      { path: "/home/user/many/a.txt", data: "A" },
      { path: "/home/user/many/b.txt", data: "B" },
      { path: "many/sub/c.txt", data: "C" },
    ]);
    assert.deepEqual(written.map((w) => w.path).sort(), [
      "/home/user/many/a.txt",
      "/home/user/many/b.txt",
      "/home/user/many/sub/c.txt",
    ]);
    const listing = await sbx.files.list("/home/user/many");
    assert.deepEqual(listing.map((e) => `${e.name}:${e.type}`).sort(), [
      "a.txt:file",
      "b.txt:file",
      "sub:dir",
    ]);
    assert.equal(listing.find((e) => e.name === "a.txt")?.owner, "user");
    const deep = await sbx.files.list("many", { depth: 2 });
    assert.ok(deep.some((e) => e.path === "/home/user/many/sub/c.txt"));

    assert.equal(await sbx.files.exists("many/a.txt"), true);
    assert.equal(await sbx.files.exists("many/nope.txt"), false);
    const info = await sbx.files.getInfo("many/a.txt");
    assert.equal(info.size, 1);
    assert.equal(info.permissions, "-rw-r--r--");
    assert.equal(
      (await sbx.files.rename("many/a.txt", "many/renamed.txt")).path,
      "/home/user/many/renamed.txt",
    );
    assert.equal(await sbx.files.read("many/renamed.txt"), "A");
    await sbx.files.remove("many/renamed.txt");
    assert.equal(await sbx.files.exists("many/renamed.txt"), false);
    assert.equal(await sbx.files.makeDir("made/deep"), true);
    assert.equal(await sbx.files.makeDir("made/deep"), false);
    const missing = await sbx.files.read("no/such/file").catch((e: unknown) => e);
    assert.ok(missing instanceof FileNotFoundError, `reading a missing file: FileNotFoundError (${missing})`);

    // `..` resolves inside the guest: it can only ever name the sandbox's files, never the host's.
    const hostname = await sbx.files.read("../../../../proc/sys/kernel/hostname");
    assert.equal(hostname.trim(), sbx.sandboxId);

    // An upload over the daemon's limit is refused, and leaves no partial file behind.
    const tooBig = await sbx.files
      .write("big/huge.bin", new Uint8Array(randomBytes((MAX_UPLOAD_MIB + 1) << 20)).buffer)
      .catch((e: unknown) => e);
    assert.ok(tooBig instanceof SandboxError && /413/.test(tooBig.message), `oversized upload: ${tooBig}`);
    const leftovers = await sbx.commands.run("ls -A /home/user/big 2>/dev/null || true");
    assert.equal(leftovers.stdout, "", "no temporary upload file is left");
  });

  it("watches directories, with and without recursion", async () => {
    await sbx.files.makeDir("watched/inner");
    const flat: FilesystemEvent[] = [];
    const handle = await sbx.files.watchDir("watched", (e) => {
      flat.push(e);
    });
    const recursive: FilesystemEvent[] = [];
    const deep = await sbx.files.watchDir(
      "watched",
      (e) => {
        recursive.push(e);
      },
      { recursive: true },
    );
    await sbx.files.write("watched/top.txt", "t");
    await sbx.files.write("watched/inner/nested.txt", "n");
    await waitFor("watch events", 30_000, async () =>
      flat.some((e) => e.name === "top.txt") && recursive.some((e) => e.name === "inner/nested.txt")
        ? true
        : undefined,
    );
    assert.ok(
      !flat.some((e) => e.name.includes("nested")),
      "a non-recursive watch does not see subdirectories",
    );
    await handle.stop();
    await deep.stop();
  });

  it("serves envd to a plain Connect client on the declared protocol: pollable watchers, streamed input", async () => {
    const transport = createConnectTransport({
      baseUrl: daemon.tcpUrl,
      httpVersion: "1.1",
      interceptors: [
        (next) => async (request) => {
          request.header.set("E2b-Sandbox-Id", sbx.sandboxId);
          request.header.set("E2b-Sandbox-Port", "49983");
          request.header.set(
            "X-Access-Token",
            (sbx as unknown as { envdAccessToken: string }).envdAccessToken,
          );
          return next(request);
        },
      ],
    });
    const fs = createClient(Filesystem, transport);
    await sbx.files.makeDir("polled");
    const { watcherId } = await fs.createWatcher({ path: "/home/user/polled", includeEntry: true });
    await sbx.files.write("polled/one.txt", "1");
    const events = await waitFor("polled events", 30_000, async () => {
      const got = (await fs.getWatcherEvents({ watcherId })).events;
      return got.some((e) => e.name === "one.txt") ? got : undefined;
    });
    assert.equal(events.find((e) => e.name === "one.txt")?.entry?.path, "/home/user/polled/one.txt");
    await fs.removeWatcher({ watcherId });
    await assert.rejects(fs.getWatcherEvents({ watcherId }), (e: unknown) => e instanceof ConnectError);

    // Client-streamed input to a process started with stdin open.
    const processes = createClient(Process, transport);
    const cat = await sbx.commands.run("cat", { background: true, stdin: true });
    async function* input() {
      yield {
        event: {
          case: "start" as const,
          value: { process: { selector: { case: "pid" as const, value: cat.pid } } },
        },
      };
      for (const piece of ["streamed ", "in\n"]) {
        yield {
          event: {
            case: "data" as const,
            value: { input: { input: { case: "stdin" as const, value: new TextEncoder().encode(piece) } } },
          },
        };
      }
    }
    await processes.streamInput(input());
    await sbx.commands.closeStdin(cat.pid);
    assert.equal((await cat.wait()).stdout, "streamed in\n");
  });

  it("opens a pty: shell output, input, resize", async () => {
    let output = "";
    const decoder = new TextDecoder();
    const terminal = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (data) => {
        output += decoder.decode(data, { stream: true });
      },
    });
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode("echo pty-$((6*7)); stty size\n"));
    await waitFor("the shell's answer on the terminal", 30_000, async () =>
      output.includes("pty-42") && output.includes("24 80") ? true : undefined,
    );
    await sbx.pty.resize(terminal.pid, { cols: 100, rows: 30 });
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode("stty size\n"));
    await waitFor("the new terminal size", 30_000, async () =>
      output.includes("30 100") ? true : undefined,
    );
    assert.equal(await sbx.pty.kill(terminal.pid), true);
  });

  it("lists, describes, extends and measures sandboxes", async () => {
    const info = await sbx.getInfo();
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.equal(info.templateId, "shared-pyagent");
    assert.equal(info.name, "code-interpreter-v1");
    assert.equal(info.metadata.suite, "e2b-e2e");
    assert.equal(info.state, "running");

    const paginator = Sandbox.list({ query: { metadata: { suite: "e2b-e2e" } } });
    const found = await paginator.nextItems();
    assert.deepEqual(
      found.map((s) => s.sandboxId),
      [sbx.sandboxId],
    );
    const none = await Sandbox.list({ query: { metadata: { suite: "other" } } }).nextItems();
    assert.equal(none.length, 0);

    const before = (await sbx.getInfo()).endAt.getTime();
    await sbx.setTimeout(LIFETIME_MS + 60_000);
    assert.ok((await sbx.getInfo()).endAt.getTime() > before, "setTimeout moved the end");

    // A series since the sandbox started (a sample every 5 s), memory and disk from the guest.
    const metrics = await waitFor("a second metrics sample", 30_000, async () => {
      const series = await sbx.getMetrics();
      return series.length >= 2 ? series : undefined;
    });
    const times = metrics.map((m) => m.timestamp.getTime());
    assert.deepEqual(
      times,
      [...times].sort((a, b) => a - b),
      "oldest first",
    );
    const latest = metrics.at(-1) as (typeof metrics)[number];
    assert.ok(latest.memTotal > 100 * 1024 * 1024 && latest.memUsed > 0, "guest memory is reported");
    assert.ok(latest.diskTotal > 100 * 1024 * 1024, `the root filesystem's size: ${latest.diskTotal}`);
    assert.ok(latest.diskUsed > 0 && latest.diskUsed < latest.diskTotal, "its use");
    const recent = await sbx.getMetrics({ start: latest.timestamp });
    assert.ok(recent.length >= 1 && recent.length < metrics.length, "start narrows the series");

    // connect() from elsewhere: same sandbox, a working handle (the e2b package's own class).
    const connected = await BaseSandbox.connect(sbx.sandboxId);
    assert.equal((await connected.commands.run("echo connected")).stdout, "connected\n");
  });

  it(
    "egress as E2B defines it: a deny list, allowInternetAccess: false, allowOut/denyOut, updateNetwork while running",
    needsNetworks,
    async () => {
      await sbx.runCode(FETCH_DEF);
      const info = await sbx.getInfo();
      assert.equal(info.allowInternetAccess, true);
      assert.deepEqual(info.network?.denyOut, [INTERNET_HOSTS.denied]);
      assert.match(await fetchIn(sbx, "http://other.test/open"), /^OK .*"path": ?"\/open"/);
      assert.match(await fetchIn(sbx, `http://${INTERNET_HOSTS.denied}/`, 4), /^ERR /, "the denied address");

      locked = await Sandbox.create({
        timeoutMs: LIFETIME_MS,
        allowInternetAccess: false,
        network: { allowPublicTraffic: false, maskRequestHost: MASK },
      });
      await locked.runCode(FETCH_DEF);
      const lockedInfo = await locked.getInfo();
      assert.equal(lockedInfo.allowInternetAccess, false);
      assert.deepEqual(lockedInfo.network?.denyOut, [ALL_TRAFFIC]);
      assert.equal(lockedInfo.network?.allowPublicTraffic, false);
      assert.match(await fetchIn(locked, "http://allowed.test/"), /^ERR URLError/, "no name resolves");
      assert.match(
        await fetchIn(locked, `http://${INTERNET_HOSTS.other}/`, 4),
        /^ERR /,
        "no address is reachable",
      );

      // An allow list, while it runs: the named domain and CIDR, nothing else.
      await locked.updateNetwork({
        allowOut: ["allowed.test", `${INTERNET_HOSTS.cidrAllowed}/32`],
        denyOut: [ALL_TRAFFIC],
      });
      assert.match(await fetchIn(locked, "http://allowed.test/a"), /^OK .*198\.51\.100\.10/);
      assert.match(await fetchIn(locked, `http://${INTERNET_HOSTS.cidrAllowed}/`), /^OK /);
      assert.match(await fetchIn(locked, "http://other.test/"), /^ERR URLError/);
      assert.match(await fetchIn(locked, `http://${INTERNET_HOSTS.other}/`, 4), /^ERR /);
      assert.deepEqual((await locked.getInfo()).network?.allowOut, [
        INTERNET_HOSTS.cidrAllowed,
        "allowed.test",
      ]);

      // A deny list replaces it (E2B's update replaces the whole configuration).
      await locked.updateNetwork({ denyOut: [INTERNET_HOSTS.other] });
      assert.match(await fetchIn(locked, `http://${INTERNET_HOSTS.denied}/`), /^OK /, "allowed now");
      assert.match(await fetchIn(locked, "http://a.wild.test/"), /^OK /);
      assert.match(await fetchIn(locked, `http://${INTERNET_HOSTS.other}/`, 4), /^ERR /, "denied now");
      assert.equal((await locked.getInfo()).allowInternetAccess, true);
    },
  );

  it(
    "servers started with commands.run(background) are reached through getHost(port): HTTP, HTTPS, WebSocket",
    needsNetworks,
    async () => {
      const { cert, key } = await selfSignedCertificate();
      await sbx.files.write("/tmp/tls/cert.pem", cert);
      await sbx.files.write("/tmp/tls/key.pem", key);
      await serve(sbx, "http_echo", HTTP_ECHO, "8080");
      await serve(sbx, "https_echo", HTTP_ECHO, `${HTTPS_PORT} /tmp/tls/cert.pem /tmp/tls/key.pem`);
      await serve(sbx, "ws_echo", WS_ECHO, "8081");
      const host = sbx.getHost(8080);
      assert.equal(host, `8080-${sbx.sandboxId}.${E2B_DOMAIN}`, "getHost gives E2B's host-name form");

      // By host name (what getHost(port) gives), no token: the sandbox is public, E2B's default.
      const byHost = await waitFor("the guest's HTTP server", 60_000, async () => {
        const r = await toListener("/hello?x=1", { host }).catch(() => undefined);
        return r?.status === 200 ? r.json<Echoed>() : undefined;
      });
      assert.equal(byHost.path, "/hello?x=1");
      assert.equal(byHost.host, host, "the guest's server sees the Host the client sent");
      // By header, through E2B_SANDBOX_URL; a body streams through.
      const posted = "x".repeat(256 * 1024);
      const byHeader = await toListener(
        "/upload",
        { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8080", "x-api-key": daemon.token },
        posted,
      );
      assert.equal(byHeader.status, 200, byHeader.text);
      assert.equal(byHeader.json<Echoed>().body.length, posted.length);
      assert.equal(byHeader.json<Echoed>().headers["x-api-key"], undefined, "the daemon token stays out");

      const https = await waitFor("the guest's HTTPS server", 60_000, async () => {
        const r = await toListener("/tls", { host: sbx.getHost(HTTPS_PORT) }).catch(() => undefined);
        return r?.status === 200 ? r.json<Echoed>() : undefined;
      });
      assert.equal(https.tls, true, "a port listed in httpsPorts is reached over TLS");

      const echoed = await waitFor(
        "the guest's WebSocket server",
        60_000,
        async () =>
          (await throughWebSocket({ host: sbx.getHost(8081) }, "by host name").catch(() => undefined))
            ?.echoed,
      );
      assert.equal(echoed, "by host name");
      assert.deepEqual(
        await throughWebSocket({ "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8081" }, "by header"),
        { echoed: "by header" },
      );
      const closed = await toListener("/", { host: sbx.getHost(8099) });
      assert.equal(closed.status, 502, "nothing listens on 8099");
      assert.match(closed.json<{ message: string }>().message, /port 8099/);
    },
  );

  it(
    "a sandbox without public traffic answers only its own traffic token, with its masked Host",
    needsNetworks,
    async () => {
      const sandbox = locked as Sandbox;
      await serve(sandbox, "http_echo", HTTP_ECHO, "8080");
      await serve(sandbox, "ws_echo", WS_ECHO, "8081");
      const host = sandbox.getHost(8080);
      const own = { "e2b-traffic-access-token": trafficToken(sandbox) };
      const answer = await waitFor("the locked sandbox's HTTP server", 60_000, async () => {
        const r = await toListener("/private", { host, ...own }).catch(() => undefined);
        return r?.status === 200 ? r.json<Echoed>() : undefined;
      });
      assert.equal(answer.host, "app-8080.internal", "maskRequestHost, its port placeholder replaced");
      assert.equal(
        answer.headers["e2b-traffic-access-token"],
        undefined,
        "the token is not the guest's to see",
      );

      const missing = await toListener("/private", { host });
      assert.equal(missing.status, 403);
      assert.match(missing.json<{ message: string }>().message, /E2B-Traffic-Access-Token/);
      assert.equal((await toListener("/private", { host, "e2b-traffic-access-token": "wrong" })).status, 403);
      const foreign = await toListener("/private", { host, "e2b-traffic-access-token": trafficToken(sbx) });
      assert.equal(foreign.status, 403, "another sandbox's traffic token does not open this one");
      const envdToken = (sandbox as unknown as { envdAccessToken: string }).envdAccessToken;
      assert.equal((await toListener("/private", { host, "x-access-token": envdToken })).status, 403);

      const wsHeaders = { "e2b-sandbox-id": sandbox.sandboxId, "e2b-sandbox-port": "8081" };
      assert.deepEqual(await throughWebSocket(wsHeaders, "no token"), { status: 403 });
      assert.deepEqual(
        await throughWebSocket({ ...wsHeaders, "e2b-traffic-access-token": trafficToken(sbx) }, "wrong"),
        { status: 403 },
      );
      const echoed = await waitFor(
        "the locked sandbox's WebSocket server",
        60_000,
        async () =>
          (await throughWebSocket({ ...wsHeaders, ...own }, "with its token").catch(() => undefined))?.echoed,
      );
      assert.equal(echoed, "with its token");
      // The same token opens nothing of the public sandbox's that was not already open, and envd still needs its own.
      assert.equal((await toListener("/", { host: sbx.getHost(8080), ...own })).status, 200);
      await locked?.kill();
      locked = undefined;
    },
  );

  it("a sandbox spawned without a network answers E2B's 502 naming why", needsNetworks, async () => {
    const spawned = await fetch(`${daemon.tcpUrl}/v1/sandboxes`, {
      method: "POST",
      headers: { authorization: `Bearer ${daemon.token}`, "content-type": "application/json" },
      body: JSON.stringify({ snapshot_tag: daemon.tag, network: "none", timeout_ms: 120_000 }),
    });
    assert.equal(spawned.status, 201, await spawned.clone().text());
    const id = ((await spawned.json()) as { id: string }[])[0]?.id as string;
    try {
      const answer = await toListener("/", { "e2b-sandbox-id": id, "e2b-sandbox-port": "8080" });
      assert.equal(answer.status, 502);
      assert.match(
        answer.json<{ message: string }>().message,
        /no network the daemon can reach .*network "none"/,
      );
    } finally {
      await Sandbox.kill(id);
    }
  });

  it("forks: state, interpreter and files carried; forks isolated from each other and the source", async () => {
    await sbx.files.write("fork-me.txt", "before the fork");
    await sbx.runCode("import random\nmarker = [1, 2, 3]");
    const worker = await sbx.commands.run("while true; do sleep 1; done", { background: true });
    const forks = await Sandbox.fork(sbx.sandboxId, { count: 2, timeoutMs: LIFETIME_MS });
    assert.equal(forks.length, 2);
    const [a, b] = forks.map((f) => {
      assert.ok(f instanceof Sandbox, `each fork started (${f})`);
      return f;
    }) as [Sandbox, Sandbox];
    try {
      for (const child of [a, b]) {
        assert.notEqual(child.sandboxId, sbx.sandboxId);
        assert.equal((await child.runCode("marker")).text, "[1, 2, 3]", "interpreter state carried");
        assert.equal(await child.files.read("fork-me.txt"), "before the fork", "files carried");
        assert.equal((await child.commands.run("echo $GREETING")).stdout, "from-create\n", "envVars carried");
        assert.equal((await child.getInfo()).metadata.suite, "e2b-e2e", "metadata carried");
        const processes = await child.commands.list();
        assert.ok(
          processes.some((p) => p.pid === worker.pid && p.args.includes("while true; do sleep 1; done")),
          "a process running in the source runs on in its forks",
        );
        if (root) {
          const network = (await child.getInfo()).network;
          assert.deepEqual(network?.denyOut, [INTERNET_HOSTS.denied], "the egress policy carried");
          assert.deepEqual(network?.httpsPorts, [HTTPS_PORT], "and the inbound settings");
        }
      }
      if (root) {
        assert.match(
          await fetchIn(a, `http://${INTERNET_HOSTS.denied}/`, 4),
          /^ERR /,
          "a fork is as confined",
        );
        assert.match(await fetchIn(a, `http://${INTERNET_HOSTS.other}/`), /^OK /);
      }
      await worker.kill();

      // Pages of one item each: every sandbox once (the source and both forks share its metadata).
      const seen: string[] = [];
      const pages = Sandbox.list({ query: { metadata: { suite: "e2b-e2e" } }, limit: 1 });
      while (pages.hasNext) seen.push(...(await pages.nextItems()).map((s) => s.sandboxId));
      assert.deepEqual([...seen].sort(), [sbx.sandboxId, a.sandboxId, b.sandboxId].sort());
      const [ra, rb] = await Promise.all([a, b].map(async (c) => (await c.runCode("random.random()")).text));
      assert.notEqual(ra, rb, "each fork has its own RNG");

      await a.files.write("only-a.txt", "a");
      await a.runCode("marker.append(4)");
      assert.equal(await b.files.exists("only-a.txt"), false);
      assert.equal(await sbx.files.exists("only-a.txt"), false);
      assert.equal((await b.runCode("marker")).text, "[1, 2, 3]");
      assert.equal((await sbx.runCode("marker")).text, "[1, 2, 3]", "the source keeps its own state");

      // One sandbox's access token never opens another.
      const impostor = await BaseSandbox.connect(b.sandboxId);
      const tokenOf = (s: BaseSandbox | Sandbox) => s as unknown as { envdAccessToken: string };
      tokenOf(impostor).envdAccessToken = tokenOf(a).envdAccessToken;
      const refused = await impostor.commands.run("true").catch((e: unknown) => e);
      assert.ok(
        refused instanceof AuthenticationError,
        `another sandbox's token: AuthenticationError (${refused})`,
      );

      // A lifetime that runs out kills the sandbox.
      await b.setTimeout(2000);
      await waitFor("the fork past its timeout to be gone", 60_000, async () =>
        (await b.isRunning()) ? undefined : true,
      );
      await assert.rejects(b.getInfo(), SandboxNotFoundError);
    } finally {
      await Promise.all([a.kill(), b.kill()]);
    }
  });

  it("snapshots a running sandbox under a name, lists it, creates from it, deletes it", async () => {
    await sbx.files.write("snapshot-me.txt", "in the snapshot");
    const snapshot = await sbx.createSnapshot({ name: "e2e-snapshot" });
    assert.equal(snapshot.snapshotId, "e2e-snapshot");
    assert.equal(await sbx.files.read("snapshot-me.txt"), "in the snapshot", "the source keeps running");
    const listed = await sbx.listSnapshots().nextItems();
    assert.ok(listed.some((s) => s.snapshotId === "e2e-snapshot"));
    const fromSnapshot = await Sandbox.create(snapshot.snapshotId, { timeoutMs: 60_000 });
    try {
      assert.equal(await fromSnapshot.files.read("snapshot-me.txt"), "in the snapshot");
      assert.equal((await fromSnapshot.runCode("counter + 1")).text, "42", "the interpreter state is in it");
    } finally {
      await fromSnapshot.kill();
    }
    assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), true);
    assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), false, "the name is gone");
  });

  it("runs examples/e2b/agent.mjs unchanged, configured by the three variables only", async () => {
    const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
    const example = path.join(root, "examples", "e2b", "agent.mjs");
    const { stdout } = await execFileAsync(process.execPath, [example], {
      cwd: root,
      env: {
        PATH: process.env.PATH ?? "",
        E2B_API_URL: daemon.tcpUrl,
        E2B_SANDBOX_URL: daemon.tcpUrl,
        E2B_API_KEY: daemon.token,
      },
      timeout: 10 * 60_000,
    });
    assert.match(stdout, /^samples: \[0\.0, 0\.25, 0\.5, 0\.75, 1\.0\]$/m);
    const forks = stdout.split("\n").filter((l) => l.startsWith("fork "));
    assert.equal(forks.length, 3, stdout);
    for (const [i, report] of forks.entries()) {
      assert.match(
        report,
        new RegExp(`^fork ${i}: .*'parent', 'fork ${i}'.*written before the fork \\| sb-`),
      );
    }
    const hostnames = new Set(forks.map((f) => f.split("| ").at(-1)));
    assert.equal(hostnames.size, 3, "each fork is its own sandbox");
    assert.match(stdout, /^parent still has: \['parent'\]$/m);
  });

  it("refuses a wrong API key", async () => {
    const wrong = { apiKey: "not-a-daemon-token-0123456789" };
    await assert.rejects(Sandbox.create(wrong), AuthenticationError);
    await assert.rejects(Sandbox.list(wrong).nextItems(), AuthenticationError);
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, wrong), AuthenticationError);
  });

  it("kills: the sandbox is gone for the control plane and the data plane", async () => {
    const id = sbx.sandboxId;
    assert.equal(await sbx.kill(), true);
    assert.equal(await sbx.isRunning(), false);
    assert.equal(await Sandbox.kill(id), false);
    await assert.rejects(Sandbox.getInfo(id), SandboxNotFoundError);
    await assert.rejects(sbx.commands.run("true"), (e: unknown) => e instanceof SandboxError);
    // The fork points were the daemon's own snapshots: with their sandboxes gone, they are deleted.
    await waitFor("fork points to be deleted", 120_000, async () => {
      const response = await fetch(`${daemon.tcpUrl}/v1/snapshots`, {
        headers: { authorization: `Bearer ${daemon.token}` },
      });
      const snapshots = (await response.json()) as { tag: string; ephemeral: boolean }[];
      return snapshots.some((s) => s.ephemeral || s.tag.startsWith("fork-")) ? undefined : true;
    });
  });
});

/** A throwaway self-signed certificate for a guest's HTTPS server (the daemon does not verify it, as E2B's proxy). */
async function selfSignedCertificate(): Promise<{ cert: string; key: string }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-e2b-tls-"));
  try {
    const [cert, key] = [path.join(dir, "cert.pem"), path.join(dir, "key.pem")];
    await execFileAsync("openssl", [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      key,
      "-out",
      cert,
      "-days",
      "2",
      "-subj",
      "/CN=sandbox",
    ]);
    return { cert: await readFile(cert, "utf8"), key: await readFile(key, "utf8") };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
