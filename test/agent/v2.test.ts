/**
 * The protocol v2 ops against the real Go agent (--stdio): processes that outlive their call, ptys, users,
 * watches, file.mkdir/move/list depth, interpreter contexts, streamed eval output and rich formats.
 */
import assert from "node:assert/strict";
import { mkdir, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { FsEvent, ProcOutput } from "../../src/agent/host/types.js";
import { ForkdError } from "../../src/common/errors.js";
import { buildAgent, processesMatching, type RunningAgent, startAgent } from "./harness.js";

const isForkdError = (code: string, pattern?: RegExp) => (err: unknown) =>
  err instanceof ForkdError && err.code === code && (pattern === undefined || pattern.test(err.message));

let guest: string;
let agent: RunningAgent;
const dir = `/tmp/forkd-agent-v2-${process.pid}`;

before(async () => {
  guest = await buildAgent();
  agent = await startAgent(guest);
  await agent.client.waitHello({ signal: AbortSignal.timeout(10_000) });
  await mkdir(dir, { recursive: true });
});

after(async () => {
  await agent?.stop();
  await rm(dir, { recursive: true, force: true });
  if (guest) await rm(path.dirname(guest), { recursive: true, force: true });
});

async function until<T>(what: string, probe: () => Promise<T | undefined>, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

describe("users", () => {
  it("runs exec as a user of /etc/passwd with its identity and environment", async () => {
    const out = await agent.client.exec(
      ["sh", "-c", 'echo "$(id -u) $(id -g) $HOME $USER $LOGNAME $(pwd)"'],
      {
        user: "nobody",
        cwd: "/tmp",
      },
    );
    assert.equal(out.stdout.toString(), "65534 65534 /nonexistent nobody nobody /tmp\n");
    const root = await agent.client.exec(["id", "-u"]);
    assert.equal(root.stdout.toString(), "0\n");
  });

  it("defaults the working directory to the user's home, and names an unknown user", async () => {
    // nobody's home does not exist on Debian: the error names the directory.
    await assert.rejects(
      agent.client.exec(["true"], { user: "nobody" }),
      isForkdError("not_found", /working directory \/nonexistent/),
    );
    await assert.rejects(
      agent.client.exec(["true"], { user: "no_such_user" }),
      isForkdError("not_found", /no user "no_such_user"/),
    );
    await assert.rejects(
      agent.client.exec(["true"], { user: "Bad User" }),
      isForkdError("invalid_argument", /user/),
    );
  });

  it("chowns written files and created parents to the user", async () => {
    await agent.client.files.write(`${dir}/owned/deep/f.txt`, "x", { user: "nobody" });
    for (const p of [`${dir}/owned`, `${dir}/owned/deep`, `${dir}/owned/deep/f.txt`]) {
      assert.equal((await stat(p)).uid, 65534, p);
    }
    const info = await agent.client.files.stat(`${dir}/owned/deep/f.txt`);
    assert.equal(info.owner, "nobody");
    assert.equal(info.uid, 65534);
    assert.equal(info.path, `${dir}/owned/deep/f.txt`);
  });
});

describe("files v2", () => {
  it("appends", async () => {
    await agent.client.files.write(`${dir}/log.txt`, "a");
    await agent.client.files.write(`${dir}/log.txt`, "bc", { append: true });
    await agent.client.files.write(`${dir}/new-by-append.txt`, "z", { append: true });
    assert.equal((await agent.client.files.read(`${dir}/log.txt`)).data.toString(), "abc");
    assert.equal((await agent.client.files.read(`${dir}/new-by-append.txt`)).data.toString(), "z");
  });

  it("makes directories and says whether it created them", async () => {
    const made = await agent.client.files.mkdir(`${dir}/m/a/b`, { mode: 0o750 });
    assert.equal(made.created, true);
    assert.equal(made.entry.type, "dir");
    assert.equal(made.entry.mode, 0o750);
    assert.equal((await agent.client.files.mkdir(`${dir}/m/a/b`)).created, false);
    await assert.rejects(
      agent.client.files.mkdir(`${dir}/missing/x`, { parents: false }),
      isForkdError("not_found"),
    );
    await agent.client.files.write(`${dir}/m/file`, "f");
    await assert.rejects(agent.client.files.mkdir(`${dir}/m/file/sub`), isForkdError("conflict"));
  });

  it("moves, creating the destination's parents", async () => {
    await agent.client.files.write(`${dir}/mv/src.txt`, "moved");
    const info = await agent.client.files.move(`${dir}/mv/src.txt`, `${dir}/mv/new/parent/dst.txt`);
    assert.equal(info.name, "dst.txt");
    assert.equal(info.path, `${dir}/mv/new/parent/dst.txt`);
    assert.equal((await agent.client.files.read(`${dir}/mv/new/parent/dst.txt`)).data.toString(), "moved");
    await assert.rejects(agent.client.files.move(`${dir}/mv/src.txt`, `${dir}/x`), isForkdError("not_found"));
  });

  it("lists to a depth with absolute paths", async () => {
    await agent.client.files.write(`${dir}/tree/a/b/c.txt`, "c");
    await agent.client.files.write(`${dir}/tree/top.txt`, "t");
    const one = await agent.client.files.list(`${dir}/tree`);
    assert.deepEqual(
      one.entries.map((e) => e.path),
      [`${dir}/tree/a`, `${dir}/tree/top.txt`],
    );
    const deep = await agent.client.files.list(`${dir}/tree`, { depth: 3 });
    assert.deepEqual(
      deep.entries.map((e) => e.path),
      [`${dir}/tree/a`, `${dir}/tree/a/b`, `${dir}/tree/a/b/c.txt`, `${dir}/tree/top.txt`],
    );
    const capped = await agent.client.files.list(`${dir}/tree`, { depth: 3, maxEntries: 2 });
    assert.equal(capped.entries.length, 2);
    assert.equal(capped.truncated, true);
    await assert.rejects(
      agent.client.files.list(`${dir}/tree`, { depth: 0 }),
      isForkdError("invalid_argument", /depth/),
    );
  });
});

describe("processes that outlive their call", () => {
  it("streams a started event, output and the end", async () => {
    const seen: ProcOutput[] = [];
    const handle = agent.client.procs.start(["sh", "-c", "echo out; echo err >&2; exit 4"], { tag: "basic" });
    const pid = await handle.pid;
    for await (const chunk of handle.output) seen.push(chunk);
    const end = await handle.done;
    assert.equal(end.pid, pid);
    assert.equal(end.exitCode, 4);
    assert.equal(end.signal, null);
    assert.equal(
      Buffer.concat(seen.filter((c) => c.stream === "stdout").map((c) => c.data)).toString(),
      "out\n",
    );
    assert.equal(
      Buffer.concat(seen.filter((c) => c.stream === "stderr").map((c) => c.data)).toString(),
      "err\n",
    );
    // Its end was seen: the table forgets it.
    assert.equal(
      (await agent.client.procs.list()).some((p) => p.pid === pid),
      false,
    );
  });

  it("keeps running when its call is detached, and proc.connect continues it by tag", async () => {
    const marker = `sleep 3133${process.pid % 10}`;
    const handle = agent.client.procs.start(
      [
        "sh",
        "-c",
        `i=0; while [ $i -lt 100 ]; do echo tick$i; i=$((i+1)); read line; echo "got $line"; done`,
      ],
      { tag: "survivor", stdin: true },
    );
    const pid = await handle.pid;
    handle.detach();
    await assert.rejects(handle.done, isForkdError("unavailable", /detached/));
    const listed = await agent.client.procs.list();
    const info = listed.find((p) => p.pid === pid);
    assert.ok(info, "the detached process is still in the table");
    assert.equal(info.running, true);
    assert.equal(info.tag, "survivor");
    assert.equal(info.user, "root");

    let text = "";
    const again = agent.client.procs.connect(
      { tag: "survivor" },
      { onStdout: (d) => (text += d.toString()) },
    );
    assert.equal(await again.pid, pid);
    await agent.client.procs.input({ pid }, "hello\n");
    await until("the reconnected output", async () => (text.includes("got hello") ? true : undefined));
    await agent.client.procs.signal({ tag: "survivor" }, "SIGTERM");
    const end = await again.done;
    assert.equal(end.signal, "SIGTERM");
    assert.equal(end.exitCode, null);
    await assert.rejects(agent.client.procs.signal({ pid }, "SIGKILL"), isForkdError("not_found"));
    void marker;
  });

  it("keeps an exit record nobody saw until proc.connect reads it", async () => {
    const handle = agent.client.procs.start(["sh", "-c", "sleep 0.3; exit 3"], { tag: "record" });
    const pid = await handle.pid;
    handle.detach();
    const record = await until("the exit record", async () =>
      (await agent.client.procs.list()).find((p) => p.pid === pid && !p.running),
    );
    assert.equal(record.exitCode, 3);
    const end = await agent.client.procs.connect({ pid }).done;
    assert.equal(end.exitCode, 3);
    assert.equal(
      (await agent.client.procs.list()).some((p) => p.pid === pid),
      false,
    );
    await assert.rejects(agent.client.procs.connect({ pid }).done, isForkdError("not_found"));
  });

  it("takes stdin, closes it on eof, and refuses input to a process without stdin", async () => {
    const cat = agent.client.procs.start(["cat"], { stdin: true });
    let out = "";
    const pid = await cat.pid;
    const collect = (async () => {
      for await (const chunk of cat.output) out += chunk.data.toString();
    })();
    await agent.client.procs.input({ pid }, "first ");
    await agent.client.procs.input({ pid }, "second", { eof: true });
    const end = await cat.done;
    await collect;
    assert.equal(end.exitCode, 0);
    assert.equal(out, "first second");
    const noStdin = agent.client.procs.start(["sleep", "5"]);
    const quiet = await noStdin.pid;
    await assert.rejects(
      agent.client.procs.input({ pid: quiet }, "x"),
      isForkdError("invalid_argument", /stdin/),
    );
    await agent.client.procs.signal({ pid: quiet }, "SIGKILL");
    assert.equal((await noStdin.done).signal, "SIGKILL");
  });

  it("kills the process group after timeout_ms", async () => {
    const handle = agent.client.procs.start(["sh", "-c", "sleep 31341 & sleep 31342"], { timeoutMs: 300 });
    const end = await handle.done;
    assert.equal(end.timedOut, true);
    assert.equal(end.signal, "SIGKILL");
    await sleep(100);
    assert.deepEqual(await processesMatching("sleep 3134"), []);
  });

  it("refuses bad selectors and missing programs clearly", async () => {
    await assert.rejects(
      agent.client.procs.connect({ pid: 4_000_000 }).done,
      isForkdError("not_found", /pid/),
    );
    await assert.rejects(agent.client.procs.connect({ tag: "nope" }).done, isForkdError("not_found", /tag/));
    await assert.rejects(
      agent.client.procs.signal({ pid: 1, tag: "x" } as never, "SIGTERM"),
      isForkdError("invalid_argument", /exactly one/),
    );
    await assert.rejects(
      agent.client.procs.start(["/no/such/prog"]).done,
      isForkdError("not_found", /no such file/),
    );
    await assert.rejects(
      agent.client.procs.resize({ tag: "nope" }, { cols: 1, rows: 1 }),
      isForkdError("not_found"),
    );
  });
});

describe("pty", () => {
  it("runs a shell on a terminal: input, output, resize, TERM and a controlling terminal", async () => {
    let screen = "";
    const shell = agent.client.procs.start(["sh"], {
      pty: { cols: 80, rows: 24 },
      onPty: (d) => (screen += d.toString()),
    });
    const pid = await shell.pid;
    await agent.client.procs.input({ pid }, "stty size; echo T=$TERM; tty\n");
    // tty's answer may come in a later chunk than stty's and echo's: wait for all three.
    await until("stty, echo and tty output", async () =>
      /24 80/.test(screen) && /T=xterm-256color/.test(screen) && /\/dev\/pts\/\d+/.test(screen)
        ? true
        : undefined,
    );
    await agent.client.procs.resize({ pid }, { cols: 120, rows: 40 });
    await agent.client.procs.input({ pid }, "stty size\n");
    await until("resized", async () => (/40 120/.test(screen) ? true : undefined));
    await agent.client.procs.input({ pid }, "exit 5\n");
    const end = await shell.done;
    assert.equal(end.exitCode, 5);
  });
});

describe("watch", () => {
  it("streams create, write, chmod, rename and remove with names relative to the watched path", async () => {
    const root = `${dir}/watched`;
    await mkdir(`${root}`, { recursive: true });
    const events: FsEvent[] = [];
    const watch = agent.client.files.watch(root, { recursive: true, onEvent: (e) => events.push(e) });
    await sleep(200);
    await writeFile(`${root}/a.txt`, "1");
    await agent.client.exec(["chmod", "600", `${root}/a.txt`]);
    await agent.client.exec(["mv", `${root}/a.txt`, `${root}/b.txt`]);
    await mkdir(`${root}/sub`);
    await sleep(200);
    await writeFile(`${root}/sub/deep.txt`, "2");
    await rm(`${root}/b.txt`);
    await until("the deep event", async () =>
      events.some((e) => e.name === "sub/deep.txt") ? true : undefined,
    );
    const end = await watch.stop();
    assert.equal(end.reason, "cancelled");
    assert.equal(end.events, events.length);
    assert.equal(end.dropped, 0);
    const has = (name: string, op: string) => events.some((e) => e.name === name && e.op === op);
    assert.ok(has("a.txt", "create"), JSON.stringify(events));
    assert.ok(has("a.txt", "write"), JSON.stringify(events));
    assert.ok(has("a.txt", "chmod"), JSON.stringify(events));
    assert.ok(has("a.txt", "rename"), JSON.stringify(events));
    assert.ok(has("b.txt", "create"), JSON.stringify(events));
    assert.ok(has("b.txt", "remove"), JSON.stringify(events));
    assert.ok(has("sub", "create"), JSON.stringify(events));
    assert.ok(has("sub/deep.txt", "create"), JSON.stringify(events));
  });

  it("ends with reason removed when the directory goes away, and refuses what is not a directory", async () => {
    const root = `${dir}/doomed`;
    await mkdir(root, { recursive: true });
    const watch = agent.client.files.watch(root);
    const names: string[] = [];
    const iterate = (async () => {
      for await (const e of watch.events) names.push(e.name);
    })();
    await sleep(200);
    await writeFile(`${root}/x`, "x");
    await sleep(100);
    await rm(root, { recursive: true });
    const end = await watch.done;
    await iterate;
    assert.equal(end.reason, "removed");
    assert.ok(names.includes("x"));
    await writeFile(`${dir}/plain-file`, "p");
    await assert.rejects(
      agent.client.files.watch(`${dir}/plain-file`).done,
      isForkdError("invalid_argument"),
    );
    await assert.rejects(agent.client.files.watch(`${dir}/nope`).done, isForkdError("not_found"));
  });
});

describe("stats", () => {
  it("reports memory and a filesystem's use as the guest sees them", async () => {
    const stats = await agent.client.stats();
    assert.ok(
      stats.memTotalBytes > 0 && stats.memAvailableBytes <= stats.memTotalBytes,
      JSON.stringify(stats),
    );
    assert.ok(stats.diskTotalBytes > 0 && stats.diskUsedBytes <= stats.diskTotalBytes, JSON.stringify(stats));
    const tmp = await agent.client.stats({ path: "/tmp" });
    assert.ok(tmp.diskTotalBytes > 0);
    await assert.rejects(agent.client.stats({ path: "/no/such/dir" }), isForkdError("not_found"));
  });
});

describe("contexts and eval v2", () => {
  it("starts new contexts from the warm-up's names, isolated from each other", async () => {
    await agent.client.warmup("import json\nWARM_NAME = 'warm'");
    await agent.client.eval("only_default = 1");
    const ctx = await agent.client.contexts.create({ id: "c1", cwd: "/tmp" });
    assert.deepEqual(ctx, { id: "c1", cwd: "/tmp", language: "python" });
    assert.equal(
      (await agent.client.eval("WARM_NAME, json.dumps(1)", { context: "c1" })).result,
      "('warm', '1')",
    );
    assert.equal((await agent.client.eval("'only_default' in globals()", { context: "c1" })).result, "False");
    assert.equal((await agent.client.eval("import os; os.getcwd()", { context: "c1" })).result, "'/tmp'");
    await agent.client.eval("mine = 2", { context: "c1" });
    assert.equal((await agent.client.eval("'mine' in globals()")).result, "False");
    const ids = (await agent.client.contexts.list()).map((c) => c.id);
    assert.deepEqual(ids, ["default", "c1"]);
    const auto = await agent.client.contexts.create();
    assert.match(auto.id, /^ctx-\d+$/);
    await assert.rejects(agent.client.contexts.create({ id: "c1" }), isForkdError("conflict"));
  });

  it("counts executions per context, restarts and removes", async () => {
    await agent.client.contexts.create({ id: "counted" });
    const first = await agent.client.eval("x = 1", { context: "counted" });
    const second = await agent.client.eval("x", { context: "counted" });
    assert.equal(first.executionCount, 1);
    assert.equal(second.executionCount, 2);
    await agent.client.contexts.restart("counted");
    const after = await agent.client.eval("'x' in globals()", { context: "counted" });
    assert.equal(after.result, "False");
    assert.equal(after.executionCount, 1);
    await agent.client.contexts.remove("counted");
    await assert.rejects(
      agent.client.eval("1", { context: "counted" }),
      isForkdError("not_found", /counted/),
    );
    await assert.rejects(agent.client.contexts.remove("default"), isForkdError("invalid_argument"));
    await assert.rejects(agent.client.contexts.restart("never"), isForkdError("not_found"));
  });

  it("streams prints while the cell runs", async () => {
    const seen: { text: string; at: number }[] = [];
    const started = Date.now();
    const out = await agent.client.eval(
      "import time\nfor i in range(3):\n    print('line', i)\n    time.sleep(0.3)\n'done'",
      {
        onStdout: (text) => seen.push({ text, at: Date.now() - started }),
      },
    );
    assert.equal(out.result, "'done'");
    assert.equal(out.stdout, "");
    assert.deepEqual(
      seen.map((s) => s.text),
      ["line 0\n", "line 1\n", "line 2\n"],
      "one event per line (print writes the text and the newline separately)",
    );
    assert.ok((seen[0]?.at ?? 0) < out.durationMs - 400, JSON.stringify(seen));
  });

  it("streams lines as Jupyter does: several per write split, a partial line sent at a flush or the end", async () => {
    const stdout: string[] = [];
    const stderr: string[] = [];
    const out = await agent.client.eval(
      "import sys\nsys.stdout.write('a\\nb\\nc')\nsys.stdout.flush()\nprint('d', file=sys.stderr)\nprint('e', end='')",
      { onStdout: (t) => stdout.push(t), onStderr: (t) => stderr.push(t) },
    );
    assert.equal(out.error, null);
    assert.deepEqual(stdout, ["a\n", "b\n", "c", "e"]);
    assert.deepEqual(stderr, ["d\n"]);
    const failed: string[] = [];
    const error = await agent.client.eval("print('before', end='')\n1/0", {
      onStdout: (t) => failed.push(t),
    });
    assert.equal(error.error?.type, "ZeroDivisionError");
    assert.deepEqual(failed, ["before"], "what a failing cell printed still arrives");
  });

  it("streams display() outputs in order with the prints, each with its formats; unstreamed, display prints", async () => {
    const seen: string[] = [];
    const out = await agent.client.eval(
      "class Pretty:\n    def __repr__(self): return 'Pretty()'\n    def _repr_html_(self): return '<i>p</i>'\n" +
        "print('first')\ndisplay(Pretty(), 'two')\nprint('last')\n3",
      {
        onStdout: (t) => seen.push(`out ${t}`),
        onDisplay: (d) => seen.push(`display ${JSON.stringify(d)}`),
      },
    );
    assert.equal(out.result, "3");
    assert.deepEqual(seen, [
      "out first\n",
      'display {"html":"<i>p</i>","text":"Pretty()"}',
      `display {"text":"'two'"}`,
      "out last\n",
    ]);
    const plain = await agent.client.eval("display('shown'); 4");
    assert.equal(plain.stdout, "'shown'\n");
    assert.equal(plain.result, "4");
  });

  it("runs bash contexts: state kept between cells, per-cell env, exit status as the error, interrupt", async () => {
    const ctx = await agent.client.contexts.create({ id: "sh", cwd: "/tmp", language: "bash" });
    assert.deepEqual(ctx, { id: "sh", cwd: "/tmp", language: "bash" });
    const lines: string[] = [];
    const first = await agent.client.eval("X=41; echo start; pwd; echo oops >&2; printf 'no newline'", {
      context: "sh",
      onStdout: (t) => lines.push(t),
    });
    assert.equal(first.error, null);
    assert.deepEqual(lines, ["start\n", "/tmp\n", "no newline"]);
    const second = await agent.client.eval("echo $((X + 1)) $CELL_ONLY; cd /", {
      context: "sh",
      env: { CELL_ONLY: "here" },
    });
    assert.equal(second.stdout, "42 here\n");
    assert.equal(second.executionCount, 2);
    const third = await agent.client.eval(
      // biome-ignore lint/suspicious/noTemplateCurlyInString: bash's parameter expansion, not a template
      "echo ${CELL_ONLY-gone} $PWD; exit_with() { return $1; }; exit_with 3",
      {
        context: "sh",
      },
    );
    assert.equal(third.stdout, "gone /\n");
    assert.deepEqual(third.error, { type: "", message: "3", traceback: "" });
    const slow = await agent.client.eval("sleep 30; echo never", { context: "sh", timeoutMs: 1000 });
    assert.equal(slow.timedOut, true);
    assert.equal(
      (await agent.client.eval("echo $X", { context: "sh" })).stdout,
      "41\n",
      "the shell survived",
    );
    assert.ok((await agent.client.contexts.list()).some((c) => c.id === "sh" && c.language === "bash"));
    await agent.client.contexts.restart("sh");
    // biome-ignore lint/suspicious/noTemplateCurlyInString: bash's parameter expansion, not a template
    assert.equal((await agent.client.eval("echo ${X-unset}", { context: "sh" })).stdout, "unset\n");
    await agent.client.contexts.remove("sh");
    // A javascript context is a Node.js process where `node` is on the PATH (here the host's: this agent runs on
    // the host); an image without one answers not_implemented naming what it lacks (kernels.py).
    const js = await agent.client.contexts.create({ language: "javascript" });
    assert.equal(js.language, "javascript");
    // Top-level await, as E2B's kernel has it: the cell's names stay for the next (kernels.py's REPL rewrite).
    const awaited = await agent.client.eval(
      "const base = await new Promise((r) => setTimeout(() => r(40), 10)); class K {}; base + 1",
      { context: js.id },
    );
    assert.equal(awaited.error, null, JSON.stringify(awaited.error));
    assert.equal(awaited.result, "41");
    assert.equal(
      (await agent.client.eval("typeof K + ' ' + (base + 2)", { context: js.id })).result,
      "function 42",
    );
    const rejected = await agent.client.eval("await Promise.reject(new RangeError('no'))", {
      context: js.id,
    });
    assert.equal(rejected.error?.type, "RangeError");
    const broken = await agent.client.eval("const = await 1", { context: js.id });
    assert.equal(broken.error?.type, "SyntaxError", "V8's own error for a cell that is not JavaScript");
    await agent.client.contexts.remove(js.id);
  });

  it("reads IPython's shell escapes and magics in Python cells, as E2B's Jupyter kernel does", async () => {
    const lines: string[] = [];
    const ran = await agent.client.eval(
      "word = 'sandbox'\n!echo hello {word.upper()} $word; echo to-stderr >&2\nstatus = _exit_code\n" +
        "listing = !printf 'a\\nb\\n'\n!exit 3\n(status, listing, _exit_code)",
      { onStdout: (t) => lines.push(t) },
    );
    assert.equal(ran.error, null);
    assert.deepEqual(lines, ["hello SANDBOX sandbox\n", "to-stderr\n"]);
    assert.equal(ran.result, "(0, ['a', 'b'], 3)");
    const cd = await agent.client.eval("%cd /tmp\nimport os\nos.getcwd()");
    assert.equal(cd.stdout, "/tmp\n");
    assert.equal(cd.result, "'/tmp'");
    assert.equal((await agent.client.eval("os.getcwd()")).result, "'/tmp'", "the context stays there");
    const script = await agent.client.eval("%%bash\nX=4\necho $((X * 10 + 2))");
    assert.equal(script.stdout, "42\n");
    const unknown = await agent.client.eval("%nosuchmagic 1");
    assert.equal(unknown.error?.type, "UsageError");
    assert.match(unknown.error?.message ?? "", /Line magic function `%nosuchmagic` not found/);
    assert.equal((await agent.client.eval("%matplotlib inline\n1")).result, "1");
    const text = await agent.client.eval("s = '''\n!not a command\n'''\ns.strip()");
    assert.equal(text.result, "'!not a command'", "a cell that is Python is never rewritten");
    const broken = await agent.client.eval("def broken(:\n!echo hi");
    assert.equal(broken.error?.type, "SyntaxError", "Python's own error when the cell is neither");
  });

  it("returns rich formats from the display protocol, and per-cell cwd and env", async () => {
    const out = await agent.client.eval(
      "class Pretty:\n    def __repr__(self): return 'Pretty()'\n    def _repr_html_(self): return '<b>hi</b>'\n    def _repr_png_(self): return b'\\x89PNG'\n    def _repr_json_(self): return {'a': 1}\nPretty()",
    );
    assert.equal(out.result, "Pretty()");
    assert.equal(out.formats?.html, "<b>hi</b>");
    assert.equal(Buffer.from(out.formats?.png ?? "", "base64").toString("latin1"), "\x89PNG");
    assert.equal(out.formats?.json, '{"a": 1}');
    const env = await agent.client.eval("import os\n(os.getcwd(), os.environ.get('CELL_VAR'))", {
      cwd: "/tmp",
      env: { CELL_VAR: "v" },
    });
    assert.equal(env.result, "('/tmp', 'v')");
    assert.equal((await agent.client.eval("os.environ.get('CELL_VAR')")).result, null);
    await assert.rejects(
      agent.client.eval("1", { cwd: "/no/such/dir" }),
      isForkdError("not_found", /working directory/),
    );
  });
});

describe("reaping", () => {
  it("reaps orphans of daemonizing processes (the agent is a subreaper, and PID 1 in a guest)", async () => {
    const { readFile, readdir } = await import("node:fs/promises");
    const statOf = async (pid: number | string) => {
      const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
      return stat === "" ? undefined : stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    };
    const out = await agent.client.exec(["sh", "-c", "sleep 1.2 >/dev/null 2>&1 & echo $!"]);
    const orphan = Number(out.stdout.toString().trim());
    const agentPid = agent.child.pid as number;
    // Its parent exited: the orphan now belongs to the agent, not to the host's init.
    assert.equal(Number((await statOf(orphan))?.[1]), agentPid);
    await sleep(1800);
    const zombies: number[] = [];
    for (const entry of await readdir("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      const fields = await statOf(entry);
      if (fields?.[0] === "Z" && Number(fields[1]) === agentPid) zombies.push(Number(entry));
    }
    assert.deepEqual(zombies, [], "no zombie children left under the agent");
    assert.equal(await statOf(orphan), undefined, "the orphan was reaped");
  });
});

describe("shutdown on SIGTERM", () => {
  it("ends every process it started, then exits", async () => {
    const other = await startAgent(guest, { name: "sigterm", interpreter: "none" });
    try {
      await other.client.waitHello({ signal: AbortSignal.timeout(10_000) });
      const bg = other.client.procs.start(["sleep", "31360"]);
      await bg.pid;
      const exited = new Promise<number | null>((resolve) =>
        other.child.once("exit", (code) => resolve(code)),
      );
      other.child.kill("SIGTERM");
      assert.equal(await exited, 0);
      await sleep(200);
      assert.deepEqual(await processesMatching("sleep 31360"), []);
      assert.match(other.stderr(), /"why":"SIGTERM"/);
    } finally {
      await other.stop();
    }
  });
});
