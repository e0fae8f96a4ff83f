/**
 * Property-based, both directions of the agent protocol:
 * - hostile host → guest: the real Go agent (over --stdio, dry-run fix-ups) gets random frames (known and unknown
 *   kinds and ops, arguments of every JSON shape, ids at and past the bounds, stray `in`/`cancel`, bodies) mixed
 *   with garbage, and must still answer a ping afterwards with bounded memory. Only ops that cannot change the test
 *   host are sent (the agent under --stdio runs on the host itself): no exec, proc.start or file writes.
 * - hostile guest → host: an AgentClient with calls in flight gets random answers, events and garbage from a fake
 *   guest on a real socket; every call settles (with a ForkdError when it fails), nothing throws out of the client.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import fc from "fast-check";
import { AgentClient } from "../../src/agent/host/client.js";
import { encodeFrame, type Frame, FrameDecoder, PROTOCOL_VERSION } from "../../src/agent/protocol/index.js";
import { ForkdError } from "../../src/common/errors.js";
import { agentBinary, buildAgent } from "../agent/harness.js";

const RUNS = Number(process.env.FORKD_FUZZ_RUNS ?? 60);
const SAFE_OPS = [
  "ping",
  "restore",
  "eval",
  "warmup",
  "file.read",
  "file.list",
  "file.stat",
  "context.create",
  "context.list",
  "context.restart",
  "context.remove",
  "proc.list",
  "proc.connect",
  "proc.signal",
  "proc.input",
  "proc.resize",
  "watch",
  "no.such.op",
  "",
];

const id = fc.oneof(
  fc.integer({ min: 1, max: 5000 }),
  fc.constantFrom(0, -1, 2 ** 31, 2 ** 31 - 1, 1.5),
  fc.string(),
);
const args = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.record(
    {
      path: fc.oneof(
        fc.constantFrom("/", "/proc/self/status", "/nonexistent", "relative", "/dev/null"),
        fc.string(),
      ),
      max_bytes: fc.oneof(fc.nat(), fc.integer()),
      timeout_ms: fc.oneof(fc.integer({ min: 1, max: 2000 }), fc.integer()),
      pid: fc.oneof(fc.integer({ min: 1, max: 100000 }), fc.string()),
      signal: fc.oneof(fc.constantFrom("SIGTERM", "SIGKILL"), fc.string()),
      id: fc.oneof(fc.constantFrom("default", "c1"), fc.string()),
      depth: fc.integer(),
      time_ns: fc.oneof(fc.constant("1"), fc.string()),
      hostname: fc.string(),
      sandbox_id: fc.string(),
    },
    { requiredKeys: [] },
  ),
);
const hostFrame = fc.oneof(
  fc.record({ t: fc.constant("req"), id, op: fc.constantFrom(...SAFE_OPS), args }),
  fc.record({ t: fc.constantFrom("in", "cancel"), id, eof: fc.jsonValue() }),
  fc.record({ t: fc.constantFrom("hello", "res", "evt", "bogus"), id }),
);
const item = fc.oneof(
  fc.record({ frame: hostFrame, body: fc.uint8Array({ maxLength: 256 }) }),
  fc.uint8Array({ minLength: 1, maxLength: 128 }).map((garbage) => ({ garbage })),
);

async function rssKiB(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  return Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? 0);
}

describe("the Go agent under random host frames", { timeout: 10 * 60_000 }, () => {
  let bundle: string;
  let dir: string;
  let child: ChildProcess;
  const frames: Frame[] = [];

  before(async () => {
    bundle = await buildAgent();
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-fuzz-agent-"));
    await writeFile(path.join(dir, "template.json"), JSON.stringify({ name: "fuzz", interpreter: "python" }));
    child = spawn(agentBinary(bundle), ["--stdio", "--template", path.join(dir, "template.json")], {
      stdio: ["pipe", "pipe", "ignore"],
      cwd: dir,
    });
    const decoder = new FrameDecoder({
      onFrame: (f) => frames.push(f),
      onError: (err) => assert.fail(`the agent sent an undecodable frame: ${err.message}`),
    });
    child.stdout?.on("data", (chunk: Buffer) => decoder.push(chunk));
  });
  after(async () => {
    const exited = new Promise((r) => child.once("exit", r));
    child.stdin?.end();
    const fallback = setTimeout(() => child.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(fallback);
    await rm(dir, { recursive: true, force: true });
    await rm(path.dirname(bundle), { recursive: true, force: true });
  });

  let nextPing = 1_000_000;
  async function pings(): Promise<void> {
    const pingId = nextPing++;
    child.stdin?.write(encodeFrame({ t: "req", id: pingId, op: "ping", args: {} }));
    const deadline = Date.now() + 20_000;
    while (!frames.some((f) => f.header.t === "res" && f.header.id === pingId)) {
      if (Date.now() > deadline) assert.fail("the agent stopped answering");
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  it("keeps answering and stays small whatever it is sent", async () => {
    await pings();
    await fc.assert(
      fc.asyncProperty(fc.array(item, { minLength: 1, maxLength: 25 }), async (items) => {
        for (const it of items) {
          child.stdin?.write(
            "garbage" in it ? Buffer.from(it.garbage) : encodeFrame(it.frame, Buffer.from(it.body)),
          );
        }
        // A frame cut by garbage is resynchronised at the next magic: the ping's own frame starts clean.
        await pings();
        assert.equal(child.exitCode, null, "the agent is alive");
        assert.ok((await rssKiB(child.pid as number)) < 256 * 1024, "bounded memory");
        frames.length = 0;
      }),
      { numRuns: RUNS },
    );
  });
});

describe("AgentClient under random guest frames", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-fuzz-client-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  const guestFrame = (ids: number[]) =>
    fc.oneof(
      fc.record({
        t: fc.constant("res"),
        id: fc.oneof(fc.constantFrom(...ids), id),
        ok: fc.boolean(),
        result: fc.jsonValue({ maxDepth: 3 }),
        error: fc.oneof(fc.record({ code: fc.string(), message: fc.string() }), fc.jsonValue()),
        result_in_body: fc.boolean(),
      }),
      fc.record({
        t: fc.constant("evt"),
        id: fc.oneof(fc.constantFrom(...ids), id),
        ev: fc.constantFrom("stdout", "stderr", "stdin_ack", "pty", "started", "fs", "?"),
        bytes: fc.oneof(fc.nat(), fc.integer()),
        pid: fc.integer(),
      }),
      fc.record({
        t: fc.constant("hello"),
        protocol: fc.constantFrom(PROTOCOL_VERSION, PROTOCOL_VERSION + 1, "2"),
        agent_version: fc.string(),
        template: fc.string(),
        interpreter: fc.constantFrom("python", "none", "ruby"),
        warm: fc.constantFrom("warm", "cold", "hot"),
        sandbox_id: fc.oneof(fc.constant(null), fc.string()),
      }),
    );

  it("settles every call in flight, with ForkdErrors, and never throws", async () => {
    let n = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.oneof(
            fc.record({ kind: fc.constant("frame"), pick: fc.nat() }),
            fc.record({ kind: fc.constant("garbage"), bytes: fc.uint8Array({ maxLength: 64 }) }),
          ),
          { maxLength: 30 },
        ),
        fc.array(fc.uint8Array({ maxLength: 512 }), { maxLength: 30 }),
        fc.infiniteStream(guestFrame([1])),
        async (plan, bodies, stream) => {
          const socketPath = path.join(dir, `c${n++}.sock`);
          const server = net.createServer();
          await new Promise<void>((r) => server.listen(socketPath, r));
          const accepted = new Promise<net.Socket>((r) => server.once("connection", r));
          const client = new AgentClient(net.connect(socketPath), {
            log: { warn: () => {} },
            callTimeoutMs: 1500,
          });
          const guest = await accepted;
          server.close();
          const seen: number[] = [];
          const decoder = new FrameDecoder({
            onFrame: (f) => {
              if (typeof f.header.id === "number") seen.push(f.header.id);
            },
            onError: () => {},
          });
          guest.on("data", (c: Buffer) => decoder.push(c));
          guest.on("error", () => {});
          const calls = [
            client.ping(),
            client.eval("1", { timeoutMs: 1000 }),
            client.exec(["true"], { stdin: Buffer.from("x"), timeoutMs: 1000 }),
            client.files.read("/x"),
          ].map((p) =>
            p.then(
              () => "ok",
              (err: unknown) => err,
            ),
          );
          await new Promise((r) => setTimeout(r, 20));
          const frames = stream.take(plan.length);
          let i = 0;
          for (const step of plan) {
            const f = frames.next().value as Record<string, unknown>;
            if (step.kind === "garbage") guest.write(Buffer.from(step.bytes));
            else {
              // Aim at the calls actually in flight as often as at random ids.
              if (step.pick % 2 === 0 && seen.length > 0) f.id = seen[step.pick % seen.length];
              guest.write(encodeFrame(f, Buffer.from(bodies[i++ % Math.max(1, bodies.length)] ?? [])));
            }
          }
          guest.destroy();
          const outcomes = await Promise.race([
            Promise.all(calls),
            new Promise((_, reject) => setTimeout(() => reject(new Error("a call never settled")), 5000)),
          ]);
          for (const o of outcomes as unknown[]) {
            if (o !== "ok") assert.ok(o instanceof ForkdError, `not a ForkdError: ${String(o)}`);
          }
          client.close();
        },
      ),
      { numRuns: RUNS * 3 },
    );
  });
});
