/**
 * The real guest agent bundle, run on the host as a child process with --stdio and driven through
 * AgentClient: exec, eval, files, restore (dry-run), concurrency, cancellation and timeouts.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { rm } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { ForkdError } from "../../src/common/errors.js";
import { buildAgent, processesMatching, type RunningAgent, startAgent } from "./harness.js";

const isForkdError = (code: string, pattern?: RegExp) => (err: unknown) =>
  err instanceof ForkdError && err.code === code && (pattern === undefined || pattern.test(err.message));

let bundle: string;
let agent: RunningAgent;

before(async () => {
  bundle = await buildAgent();
  agent = await startAgent(bundle);
});

after(async () => {
  await agent?.stop();
  if (bundle) await rm(path.dirname(bundle), { recursive: true, force: true });
});

describe("hello and ping", () => {
  it("announces itself with the protocol version, template and warm state", async () => {
    const hello = await agent.client.waitHello({ signal: AbortSignal.timeout(10_000) });
    assert.equal(hello.protocol, 2);
    assert.equal(hello.template, "test");
    assert.equal(hello.interpreter, "python");
    assert.ok(["cold", "warm"].includes(hello.warm));
    assert.equal(hello.sandboxId, null);
    const ping = await agent.client.ping();
    assert.equal(ping.agentVersion, hello.agentVersion);
    assert.ok(ping.uptimeMs >= 0);
  });
});

describe("restore (dry-run fix-ups)", () => {
  it("records the sandbox id and hostname and answers only when done", async () => {
    const info = await agent.client.restore({
      timeNs: BigInt(Date.now()) * 1_000_000n,
      entropy: randomBytes(64),
      hostname: "child-1",
      sandboxId: "sb-0123456789ab",
    });
    assert.equal(info.applied, "dry-run");
    assert.equal(info.entropyBytes, 64);
    const ping = await agent.client.ping();
    assert.equal(ping.sandboxId, "sb-0123456789ab");
    assert.equal(ping.hostname, "child-1");
  });

  it("rejects bad arguments before sending them", async () => {
    const base = { timeNs: 1n, entropy: randomBytes(32), hostname: "h", sandboxId: "sb-0123456789ab" };
    await assert.rejects(
      agent.client.restore({ ...base, entropy: randomBytes(8) }),
      isForkdError("invalid_argument", /entropy/),
    );
    await assert.rejects(
      agent.client.restore({ ...base, hostname: "bad host" }),
      isForkdError("invalid_argument", /hostname/),
    );
    await assert.rejects(
      agent.client.restore({ ...base, sandboxId: "../x" }),
      isForkdError("invalid_argument"),
    );
  });
});

describe("exec", () => {
  it("reports exit codes and signals", async () => {
    const ok = await agent.client.exec(["sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert.equal(ok.exitCode, 7);
    assert.equal(ok.signal, null);
    assert.equal(ok.stdout.toString(), "out\n");
    assert.equal(ok.stderr.toString(), "err\n");
    assert.equal(ok.timedOut, false);
    const killed = await agent.client.exec(["sh", "-c", "kill -TERM $$"]);
    assert.equal(killed.exitCode, null);
    assert.equal(killed.signal, "SIGTERM");
  });

  it("streams output as it is produced, in order", async () => {
    const seen: { text: string; at: number }[] = [];
    const started = Date.now();
    const result = await agent.client.exec(["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done"], {
      onStdout: (chunk) => seen.push({ text: chunk.toString(), at: Date.now() - started }),
    });
    assert.equal(result.exitCode, 0);
    assert.equal(seen.map((s) => s.text).join(""), "line1\nline2\nline3\n");
    assert.ok(seen.length >= 3, `expected separate chunks, got ${JSON.stringify(seen)}`);
    // The first line arrived long before the process finished.
    assert.ok(
      (seen[0]?.at ?? 0) < result.durationMs - 400,
      JSON.stringify({ seen, duration: result.durationMs }),
    );
  });

  it("kills the whole process group on timeout and leaves no process behind", async () => {
    const result = await agent.client.exec(["sh", "-c", "sleep 31337 & sleep 31338; echo never"], {
      timeoutMs: 500,
    });
    assert.equal(result.timedOut, true);
    assert.equal(result.signal, "SIGKILL");
    assert.equal(result.stdout.toString(), "");
    await sleep(100);
    assert.deepEqual(await processesMatching("sleep 3133"), []);
  });

  it("feeds stdin from the request body and from a stream larger than the send window", async () => {
    const small = await agent.client.exec(["cat"], { stdin: "hello stdin" });
    assert.equal(small.stdout.toString(), "hello stdin");

    const block = randomBytes(64 * 1024);
    async function* generate() {
      for (let i = 0; i < 48; i++) yield block; // 3 MiB, three times the window
    }
    const counted = await agent.client.exec(["wc", "-c"], { stdin: generate() });
    assert.equal(counted.stdout.toString().trim(), String(48 * block.length));

    const big = randomBytes(2 * 1024 * 1024 + 17);
    const echoed = await agent.client.exec(["cat"], { stdin: big, maxCaptureBytes: 4 * 1024 * 1024 });
    assert.ok(echoed.stdout.equals(big));
    assert.equal(echoed.stdoutBytes, big.length);
  });

  it("bounds the captured output and says so", async () => {
    const result = await agent.client.exec(["head", "-c", "300000", "/dev/zero"], { maxCaptureBytes: 1000 });
    assert.equal(result.stdout.length, 1000);
    assert.equal(result.stdoutTruncated, true);
    assert.equal(result.stdoutBytes, 300000);
  });

  it("cancels a running exec through an AbortSignal and kills it", async () => {
    const controller = new AbortController();
    const running = agent.client.exec(["sh", "-c", "sleep 31339"], { signal: controller.signal });
    await sleep(300);
    assert.equal((await processesMatching("sleep 31339")).length > 0, true);
    controller.abort();
    await assert.rejects(running);
    await sleep(200);
    assert.deepEqual(await processesMatching("sleep 31339"), []);
  });

  it("names a missing program or working directory", async () => {
    await assert.rejects(agent.client.exec(["/no/such/program"]), isForkdError("not_found", /no such file/));
    await assert.rejects(
      agent.client.exec(["ls"], { cwd: "/no/such/dir" }),
      isForkdError("not_found", /working directory/),
    );
    await assert.rejects(agent.client.exec([]), isForkdError("invalid_argument", /argv/));
  });

  it("does not leak the agent's descriptors into processes", async () => {
    const result = await agent.client.exec(["ls", "/proc/self/fd"]);
    const fds = result.stdout.toString().trim().split(/\s+/).map(Number);
    // 0-2 are the process's pipes; 3 is ls's own handle on /proc/self/fd.
    assert.deepEqual(
      fds.filter((fd) => fd > 3),
      [],
      `unexpected descriptors ${fds.join(",")}`,
    );
  });

  it("passes env and cwd", async () => {
    const result = await agent.client.exec(["sh", "-c", 'echo "$GREETING $(pwd)"'], {
      env: { GREETING: "hi" },
      cwd: "/tmp",
    });
    assert.equal(result.stdout.toString(), "hi /tmp\n");
  });
});

describe("eval", () => {
  it("returns the repr of the trailing expression and captures prints", async () => {
    const out = await agent.client.eval("x = 41\nprint('hello', x)\nx + 1");
    assert.equal(out.result, "42");
    assert.equal(out.stdout, "hello 41\n");
    assert.equal(out.error, null);
    assert.equal((await agent.client.eval("'a' * 3")).result, "'aaa'");
    assert.equal((await agent.client.eval("x = 5")).result, null);
    assert.equal((await agent.client.eval("x;")).result, null);
    assert.equal((await agent.client.eval("import sys; print('e', file=sys.stderr)")).stderr, "e\n");
  });

  it("keeps one namespace across cells", async () => {
    await agent.client.eval("def double(v):\n    return v * 2\nstate = [1]");
    await agent.client.eval("state.append(double(21))");
    assert.equal((await agent.client.eval("state")).result, "[1, 42]");
    assert.equal((await agent.client.eval("_")).result, "[1, 42]");
  });

  it("reports exceptions with type, message and a traceback of the cell", async () => {
    const out = await agent.client.eval("print('before')\n1 / 0");
    assert.equal(out.result, null);
    assert.equal(out.stdout, "before\n");
    assert.equal(out.error?.type, "ZeroDivisionError");
    assert.equal(out.error?.message, "division by zero");
    assert.match(out.error?.traceback ?? "", /File "<cell-\d+>", line 2/);
    assert.match(out.error?.traceback ?? "", /1 \/ 0/);
    assert.doesNotMatch(out.error?.traceback ?? "", /worker\.py/);
  });

  it("reports syntax errors without running anything", async () => {
    const out = await agent.client.eval("y = 1\ndef broken(:\n");
    assert.equal(out.error?.type, "SyntaxError");
    assert.match(out.error?.traceback ?? "", /SyntaxError/);
    assert.equal((await agent.client.eval("'y' in globals()")).result, "False");
  });

  it("survives sys.exit in a cell", async () => {
    const out = await agent.client.eval("import sys\nsys.exit(3)");
    assert.equal(out.error?.type, "SystemExit");
    assert.equal((await agent.client.eval("1 + 1")).result, "2");
  });

  it("interrupts a cell that runs past its timeout and keeps the namespace", async () => {
    await agent.client.eval("kept = 'still here'");
    const out = await agent.client.eval("while True:\n    pass", { timeoutMs: 300 });
    assert.equal(out.timedOut, true);
    assert.equal(out.error?.type, "KeyboardInterrupt");
    assert.equal((await agent.client.eval("kept")).result, "'still here'");
  });

  it("kills and restarts the interpreter when a cell ignores the interrupt", async () => {
    const code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass";
    const out = await agent.client.eval(code, { timeoutMs: 300 });
    assert.equal(out.timedOut, true);
    assert.equal(out.error?.type, "TimeoutError");
    const next = await agent.client.eval("'kept' in globals(), 6 * 7");
    assert.equal(next.result, "(False, 42)");
  });

  it("reseeds the interpreter's PRNGs on the first cell after a restore", async () => {
    // Children of one snapshot share the parent's PRNG state; a restore must make their sequences diverge.
    await agent.client.eval("import random\nrandom.seed(1)");
    await agent.client.restore({
      timeNs: BigInt(Date.now()) * 1_000_000n,
      entropy: randomBytes(32),
      hostname: "child-2",
      sandboxId: "sb-00000000000f",
    });
    const out = await agent.client.eval("random.random() != random.Random(1).random()");
    assert.equal(out.result, "True");
    // Without a restore in between, the seeded sequence is left alone.
    assert.equal(
      (await agent.client.eval("random.seed(1)\nrandom.random() == random.Random(1).random()")).result,
      "True",
    );
  });

  it("runs the warm-up and reports the warm state", async () => {
    const warm = await agent.client.warmup("import json\nWARM = json.dumps([1])");
    assert.equal(warm.error, null);
    assert.equal(warm.warm, "warm");
    assert.equal((await agent.client.ping()).warm, "warm");
    assert.equal((await agent.client.eval("WARM")).result, "'[1]'");
  });

  it("carries large outputs in the body and bounds them", async () => {
    const out = await agent.client.eval("print('x' * 3_000_000)\n'y' * 100_000");
    assert.equal(out.stdoutTruncated, true);
    assert.equal(out.stdout.length, 1024 * 1024);
    assert.equal(out.result?.length, 100_002);
  });
});

describe("files", () => {
  const dir = `/tmp/forkd-agent-test-${process.pid}`;
  after(() => rm(dir, { recursive: true, force: true }));

  it("round-trips binary data and sets the mode", async () => {
    const data = Buffer.concat([
      Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
      randomBytes(5 * 1024 * 1024),
    ]);
    const written = await agent.client.files.write(`${dir}/sub/data.bin`, data, { mode: 0o600 });
    assert.equal(written.bytes, data.length);
    const read = await agent.client.files.read(`${dir}/sub/data.bin`);
    assert.ok(read.data.equals(data));
    assert.equal(read.truncated, false);
    const stat = await agent.client.files.stat(`${dir}/sub/data.bin`);
    assert.equal(stat.type, "file");
    assert.equal(stat.size, data.length);
    assert.equal(stat.mode, 0o600);
  });

  it("reads a window of a file and says when there is more", async () => {
    await agent.client.files.write(`${dir}/abc.txt`, "abcdefghij");
    const part = await agent.client.files.read(`${dir}/abc.txt`, { offset: 2, maxBytes: 3 });
    assert.equal(part.data.toString(), "cde");
    assert.equal(part.truncated, true);
    const tail = await agent.client.files.read(`${dir}/abc.txt`, { offset: 7, maxBytes: 100 });
    assert.equal(tail.data.toString(), "hij");
    assert.equal(tail.truncated, false);
  });

  it("lists, stats and removes", async () => {
    await agent.client.files.write(`${dir}/list/a.txt`, "a");
    await agent.client.files.write(`${dir}/list/b/c.txt`, "c");
    await agent.client.exec(["ln", "-s", "a.txt", `${dir}/list/link`]);
    const listing = await agent.client.files.list(`${dir}/list`);
    assert.deepEqual(
      listing.entries.map((e) => [e.name, e.type]),
      [
        ["a.txt", "file"],
        ["b", "dir"],
        ["link", "symlink"],
      ],
    );
    assert.equal((await agent.client.files.stat(`${dir}/list/link`)).linkTarget, "a.txt");
    await assert.rejects(agent.client.files.remove(`${dir}/list/b`), isForkdError("conflict", /not empty/));
    await agent.client.files.remove(`${dir}/list/b`, { recursive: true });
    await agent.client.files.remove(`${dir}/list/a.txt`);
    assert.deepEqual(
      (await agent.client.files.list(`${dir}/list`)).entries.map((e) => e.name),
      ["link"],
    );
  });

  it("names missing paths and bad requests", async () => {
    const missing = `${dir}/missing`;
    await assert.rejects(
      agent.client.files.read(missing),
      isForkdError("not_found", /missing: no such file/),
    );
    await assert.rejects(agent.client.files.stat(missing), isForkdError("not_found"));
    await assert.rejects(agent.client.files.list(missing), isForkdError("not_found"));
    await assert.rejects(agent.client.files.remove(missing), isForkdError("not_found"));
    await assert.rejects(agent.client.files.read("relative/path"), isForkdError("invalid_argument", /path/));
    await assert.rejects(agent.client.files.read(dir), isForkdError("invalid_argument", /directory/));
    await agent.client.files.write(`${dir}/plain`, "x");
    await assert.rejects(
      agent.client.files.write(`${dir}/plain/under`, "y"),
      isForkdError("invalid_argument"),
    );
    await assert.rejects(agent.client.files.write(`${dir}/plain/`, "y"), isForkdError("invalid_argument"));
    await assert.rejects(
      agent.client.files.remove("/", { recursive: true }),
      isForkdError("invalid_argument", /refusing/),
    );
  });
});

describe("concurrency", () => {
  it("runs several calls at once, multiplexed by id", async () => {
    const started = Date.now();
    const execs = Array.from({ length: 5 }, (_, i) =>
      agent.client.exec(["sh", "-c", `sleep 0.6; echo ${i}`]),
    );
    const evaluated = agent.client.eval("sum(range(10))");
    const pings = Array.from({ length: 10 }, () => agent.client.ping());
    const results = await Promise.all(execs);
    assert.deepEqual(
      results.map((r) => r.stdout.toString()),
      ["0\n", "1\n", "2\n", "3\n", "4\n"],
    );
    assert.equal((await evaluated).result, "45");
    assert.equal((await Promise.all(pings)).length, 10);
    assert.ok(Date.now() - started < 2000, `took ${Date.now() - started} ms: calls did not overlap`);
  });
});

describe("shutdown", () => {
  it("kills running processes when the host closes the channel", async () => {
    const other = await startAgent(bundle, { name: "none-template", interpreter: "none" });
    try {
      const hello = await other.client.waitHello();
      assert.equal(hello.warm, "warm");
      await assert.rejects(other.client.eval("1"), isForkdError("invalid_argument", /no interpreter/));
      const running = other.client.exec(["sh", "-c", "sleep 31340"]);
      await sleep(300);
      assert.ok((await processesMatching("sleep 31340")).length > 0);
      other.client.close();
      await assert.rejects(running, isForkdError("unavailable", /closed/));
    } finally {
      await other.stop();
    }
    await sleep(200);
    assert.deepEqual(await processesMatching("sleep 31340"), []);
  });
});
