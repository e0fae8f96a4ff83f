/**
 * Hostile input on both sides: raw malformed frames written straight into the real agent (it must answer
 * what it can and keep serving), and a fake guest on a real Unix socket sending AgentClient garbage, bad
 * answers and an early close (the client must fail the affected calls clearly and never hang).
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { AgentClient, MAX_UNSENT_BYTES } from "../../src/agent/host/client.js";
import {
  encodeFrame,
  FRAME_MAGIC,
  type Frame,
  FrameDecoder,
  MAX_FRAME_BYTES,
  PROTOCOL_VERSION,
} from "../../src/agent/protocol/index.js";
import { ForkdError } from "../../src/common/errors.js";
import { agentBinary, buildAgent, processesMatching } from "./harness.js";

describe("the agent under malformed input", () => {
  let bundle: string;
  let workDir: string;
  let child: ChildProcess;
  const frames: Frame[] = [];
  let waiters: (() => void)[] = [];

  before(async () => {
    bundle = await buildAgent();
    workDir = await mkdtemp(path.join(os.tmpdir(), "forkd-hostile-"));
    await writeFile(
      path.join(workDir, "template.json"),
      JSON.stringify({ name: "raw", interpreter: "python" }),
    );
    child = spawn(agentBinary(bundle), ["--stdio", "--template", path.join(workDir, "template.json")], {
      stdio: ["pipe", "pipe", "ignore"],
    });
    const decoder = new FrameDecoder({
      onFrame: (frame) => {
        frames.push(frame);
        for (const wake of waiters) wake();
        waiters = [];
      },
      onError: (err) => assert.fail(`the agent sent an undecodable frame: ${err.message}`),
    });
    child.stdout?.on("data", (chunk: Buffer) => decoder.push(chunk));
  });

  after(async () => {
    // Closing stdin makes the agent shut down and stop its Python worker; SIGKILL only as a fallback.
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.stdin?.end();
    const fallback = setTimeout(() => child.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(fallback);
    await rm(workDir, { recursive: true, force: true });
    await rm(path.dirname(bundle), { recursive: true, force: true });
  });

  async function response(id: number): Promise<Frame> {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const found = frames.find((f) => f.header.t === "res" && f.header.id === id);
      if (found) return found;
      if (Date.now() > deadline) assert.fail(`no response for id ${id}`);
      await new Promise<void>((resolve) => {
        waiters.push(resolve);
        setTimeout(resolve, 100);
      });
    }
  }

  function send(bytes: Buffer): void {
    child.stdin?.write(bytes);
  }

  function rawFrame(header: string, body = Buffer.alloc(0)): Buffer {
    const h = Buffer.from(header);
    const prefix = Buffer.alloc(12);
    FRAME_MAGIC.copy(prefix);
    prefix.writeUInt32BE(h.length + body.length, 4);
    prefix.writeUInt32BE(h.length, 8);
    return Buffer.concat([prefix, h, body]);
  }

  it("answers bad requests with errors naming the problem and keeps serving", async () => {
    send(Buffer.from("GET / HTTP/1.1\r\nHost: nonsense\r\n\r\n"));
    const oversize = Buffer.alloc(12);
    FRAME_MAGIC.copy(oversize);
    oversize.writeUInt32BE(MAX_FRAME_BYTES, 4);
    oversize.writeUInt32BE(10, 8);
    send(oversize);
    send(rawFrame("{this is not json"));
    send(rawFrame('{"t":"req","id":"seven","op":"ping"}'));
    send(rawFrame('{"t":"mystery","id":3}'));
    send(encodeFrame({ t: "req", id: 5, op: "format_disk", args: {} }));
    send(encodeFrame({ t: "req", id: 6, op: "ping", args: { bogus: 1 } }));
    send(encodeFrame({ t: "req", id: 7, op: "exec", args: { argv: [], stdin: "none", timeout_ms: 1000 } }));
    send(encodeFrame({ t: "req", id: 8, op: "ping", args: {} }, Buffer.from("unexpected body")));
    send(encodeFrame({ t: "req", id: 9, op: "file.read", args: { path: "/etc/hostname", max_bytes: -1 } }));
    send(
      encodeFrame(
        { t: "req", id: 10, op: "eval", args: { timeout_ms: 1000 } },
        Buffer.from([0x31, 0xff, 0xfe]),
      ),
    );
    send(encodeFrame({ t: "in", id: 999, eof: true }, Buffer.from("stdin for nobody")));
    send(encodeFrame({ t: "cancel", id: 998 }));
    send(encodeFrame({ t: "req", id: 11, op: "ping", args: {} }));

    const expectError = async (id: number, code: string, pattern: RegExp) => {
      const res = (await response(id)).header as unknown as {
        ok: boolean;
        error?: { code: string; message: string };
      };
      assert.equal(res.ok, false, `id ${id}`);
      assert.equal(res.error?.code, code, `id ${id}: ${res.error?.message}`);
      assert.match(res.error?.message ?? "", pattern);
    };
    await expectError(5, "not_implemented", /unknown op "format_disk"/);
    await expectError(6, "invalid_argument", /ping arguments/);
    await expectError(7, "invalid_argument", /argv/);
    await expectError(8, "invalid_argument", /no request body/);
    await expectError(9, "invalid_argument", /max_bytes/);
    await expectError(10, "invalid_argument", /not valid UTF-8/);
    const ok = (await response(11)).header as unknown as { ok: boolean; result: { template: string } };
    assert.equal(ok.ok, true);
    assert.equal(ok.result.template, "raw");
    assert.equal(child.exitCode, null, "the agent must still be running");
  });

  it("refuses more calls than its in-flight limit instead of queueing without bound", async () => {
    // Cells queue in the agent (one runs at a time), so 300 calls cost no processes.
    const cell = Buffer.from("import time\ntime.sleep(60)");
    for (let id = 100; id < 100 + 300; id++) {
      send(encodeFrame({ t: "req", id, op: "eval", args: { timeout_ms: 90_000 } }, cell));
    }
    const refused = (await response(100 + 299)).header as unknown as {
      ok: boolean;
      error?: { code: string };
    };
    assert.equal(refused.ok, false);
    assert.equal(refused.error?.code, "too_many_requests");
    for (let id = 100; id < 100 + 300; id++) send(encodeFrame({ t: "cancel", id }));
    // A cancelled call holds its slot until its process is reaped; then it answers "cancelled".
    for (let id = 100; id < 100 + 256; id++) {
      const cancelled = (await response(id)).header as unknown as {
        ok: boolean;
        error?: { message: string };
      };
      assert.equal(cancelled.ok, false);
      assert.match(cancelled.error?.message ?? "", /cancelled/);
    }
    send(encodeFrame({ t: "req", id: 12, op: "ping", args: {} }));
    assert.equal(((await response(12)).header as unknown as { ok: boolean }).ok, true);
  });

  it("starts a new host epoch on restore: other calls are detached, exec killed, proc.* kept", async () => {
    const execArgs = { argv: ["sh", "-c", "sleep 31350"], stdin: "none", timeout_ms: 60_000 };
    send(encodeFrame({ t: "req", id: 500, op: "exec", args: execArgs }));
    send(
      encodeFrame({ t: "req", id: 501, op: "proc.start", args: { argv: ["sleep", "31351"], tag: "epoch" } }),
    );
    const started = await (async () => {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const found = frames.find(
          (f) => f.header.t === "evt" && f.header.id === 501 && f.header.ev === "started",
        );
        if (found) return found;
        if (Date.now() > deadline) assert.fail("no started event");
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const pid = started.header.pid as number;
    await new Promise((r) => setTimeout(r, 300));
    assert.ok((await processesMatching("sleep 31350")).length > 0);
    const restoreArgs = { time_ns: "1", hostname: "epoch", sandbox_id: "sb-00000000e0c0" };
    send(encodeFrame({ t: "req", id: 502, op: "restore", args: restoreArgs }, Buffer.alloc(32)));
    assert.equal(((await response(502)).header as unknown as { ok: boolean }).ok, true);
    await new Promise((r) => setTimeout(r, 500));
    assert.deepEqual(await processesMatching("sleep 31350"), [], "the old epoch's exec was killed");
    assert.equal(
      frames.filter((f) => f.header.t === "res" && (f.header.id === 500 || f.header.id === 501)).length,
      0,
    );
    send(encodeFrame({ t: "req", id: 503, op: "proc.list", args: {} }));
    const list = (await response(503)).header as unknown as { result: { processes: { pid: number }[] } };
    assert.ok(
      list.result.processes.some((p) => p.pid === pid),
      "the proc.start process kept running",
    );
    send(encodeFrame({ t: "req", id: 504, op: "proc.signal", args: { pid, signal: "SIGKILL" } }));
    assert.equal(((await response(504)).header as unknown as { ok: boolean }).ok, true);
  });

  it("cancels a call whose host sends stdin beyond the send window", async () => {
    send(
      encodeFrame({
        t: "req",
        id: 600,
        op: "exec",
        args: { argv: ["sleep", "31352"], stdin: "stream", timeout_ms: 60_000 },
      }),
    );
    const chunk = Buffer.alloc(256 * 1024);
    for (let i = 0; i < 12; i++) send(encodeFrame({ t: "in", id: 600 }, chunk));
    const res = (await response(600)).header as unknown as { ok: boolean; error?: { message: string } };
    assert.equal(res.ok, false);
    assert.match(res.error?.message ?? "", /cancelled/);
  });
});

describe("AgentClient against a hostile guest", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-fake-guest-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  /** A fake guest: the test plays the agent on the accepted end of a real Unix socket. */
  async function connect(
    name: string,
  ): Promise<{ client: AgentClient; guest: net.Socket; requests: Frame[] }> {
    const socketPath = path.join(dir, `${name}.sock`);
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    const accepted = new Promise<net.Socket>((resolve) => server.once("connection", resolve));
    const hostEnd = net.connect(socketPath);
    const guest = await accepted;
    server.close();
    const requests: Frame[] = [];
    const decoder = new FrameDecoder({ onFrame: (f) => requests.push(f), onError: () => {} });
    guest.on("data", (chunk: Buffer) => decoder.push(chunk));
    const warnings: unknown[] = [];
    const client = new AgentClient(hostEnd, {
      log: { warn: (obj) => warnings.push(obj) },
      callTimeoutMs: 2000,
    });
    return { client, guest, requests };
  }

  const hello = (protocol = PROTOCOL_VERSION) => ({
    t: "hello",
    protocol,
    agent_version: "x",
    template: "t",
    interpreter: "none",
    warm: "warm",
    sandbox_id: null,
  });

  async function nextRequest(requests: Frame[], count: number): Promise<Frame> {
    for (let i = 0; i < 100 && requests.length < count; i++) await new Promise((r) => setTimeout(r, 10));
    const frame = requests[count - 1];
    assert.ok(frame, `expected request #${count}`);
    return frame;
  }

  it("skips garbage and still takes the hello that follows", async () => {
    const { client, guest } = await connect("garbage");
    guest.write(Buffer.from("\x00\x01garbage from a previous life"));
    guest.write(encodeFrame(hello()));
    const got = await client.waitHello({ signal: AbortSignal.timeout(2000) });
    assert.equal(got.template, "t");
    client.close();
    guest.destroy();
  });

  it("rejects a hello with another protocol version", async () => {
    const { client, guest } = await connect("version");
    guest.write(encodeFrame(hello(PROTOCOL_VERSION + 1)));
    await assert.rejects(
      client.waitHello({ signal: AbortSignal.timeout(2000) }),
      (err: unknown) => err instanceof ForkdError && err.code === "conflict" && /protocol/.test(err.message),
    );
    client.close();
    guest.destroy();
  });

  it("fails a call whose answer does not match the op's result schema", async () => {
    const { client, guest, requests } = await connect("bad-result");
    const ping = client.ping();
    const request = await nextRequest(requests, 1);
    guest.write(encodeFrame({ t: "res", id: request.header.id, ok: true, result: { protocol: "one" } }));
    await assert.rejects(
      ping,
      (err: unknown) =>
        err instanceof ForkdError && err.code === "internal" && /ping result/.test(err.message),
    );
    client.close();
    guest.destroy();
  });

  it("maps guest error codes into the catalogue and unknown ones to internal", async () => {
    const { client, guest, requests } = await connect("codes");
    const first = client.files.stat("/x");
    const r1 = await nextRequest(requests, 1);
    guest.write(
      encodeFrame({ t: "res", id: r1.header.id, ok: false, error: { code: "not_found", message: "nope" } }),
    );
    await assert.rejects(first, (err: unknown) => err instanceof ForkdError && err.code === "not_found");
    const second = client.files.stat("/y");
    const r2 = await nextRequest(requests, 2);
    guest.write(
      encodeFrame({ t: "res", id: r2.header.id, ok: false, error: { code: "rm -rf", message: "?" } }),
    );
    await assert.rejects(second, (err: unknown) => err instanceof ForkdError && err.code === "internal");
    client.close();
    guest.destroy();
  });

  it("times out a call the guest never answers and tells the guest to cancel it", async () => {
    const { client, guest, requests } = await connect("silent");
    const started = Date.now();
    await assert.rejects(
      client.ping(),
      (err: unknown) => err instanceof ForkdError && err.code === "timeout",
    );
    assert.ok(Date.now() - started >= 1900);
    const cancel = await nextRequest(requests, 2);
    assert.equal(cancel.header.t, "cancel");
    assert.equal(cancel.header.id, requests[0]?.header.id);
    client.close();
    guest.destroy();
  });

  it("refuses stdin acknowledgements beyond the bytes sent (they must not widen the window)", async () => {
    const { client, guest, requests } = await connect("ack");
    async function* stdin() {
      yield Buffer.alloc(1000);
      await new Promise((r) => setTimeout(r, 5000));
    }
    const exec = client.exec(["cat"], { stdin: stdin() });
    const request = await nextRequest(requests, 1);
    await nextRequest(requests, 2); // the first `in` frame
    guest.write(encodeFrame({ t: "evt", id: request.header.id, ev: "stdin_ack", bytes: 5_000_000 }));
    await assert.rejects(
      exec,
      (err: unknown) =>
        err instanceof ForkdError && err.code === "internal" && /acknowledged/.test(err.message),
    );
    const cancel = await nextRequest(requests, 3);
    assert.equal(cancel.header.t, "cancel");
    client.close();
    guest.destroy();
  });

  it("fails a proc.connect whose started event names another pid, and ignores output before it", async () => {
    const { client, guest, requests } = await connect("proc");
    const seen: Buffer[] = [];
    const handle = client.procs.connect({ pid: 42 }, { onStdout: (d) => seen.push(d) });
    const request = await nextRequest(requests, 1);
    const id = request.header.id;
    guest.write(encodeFrame({ t: "evt", id, ev: "stdout" }, Buffer.from("too early")));
    guest.write(encodeFrame({ t: "evt", id, ev: "started", pid: 43 }));
    await assert.rejects(
      handle.done,
      (err: unknown) => err instanceof ForkdError && err.code === "internal" && /pid/.test(err.message),
    );
    assert.deepEqual(seen, []);
    client.close();
    guest.destroy();
  });

  it("rejects every pending call when the connection drops", async () => {
    const { client, guest, requests } = await connect("drop");
    const calls = [client.ping(), client.exec(["true"]), client.eval("1"), client.waitHello()];
    await nextRequest(requests, 3);
    guest.destroy();
    for (const call of calls) {
      await assert.rejects(
        call,
        (err: unknown) =>
          err instanceof ForkdError && err.code === "unavailable" && /closed/.test(err.message),
      );
    }
    await assert.rejects(
      client.ping(),
      (err: unknown) => err instanceof ForkdError && err.code === "unavailable",
    );
    assert.equal(client.closed, true);
  });
});

describe("AgentClient against a guest that stops reading", () => {
  it("refuses new calls once too much waits unsent, instead of buffering without end", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-stalled-guest-"));
    const socketPath = path.join(dir, "g.sock");
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    const accepted = new Promise<net.Socket>((resolve) => server.once("connection", resolve));
    const hostEnd = net.connect(socketPath);
    const guest = await accepted;
    server.close();
    guest.pause(); // reads nothing: what the host writes piles up
    const client = new AgentClient(hostEnd, { log: { warn: () => {} }, callTimeoutMs: 30_000 });
    try {
      const payload = Buffer.alloc(8 * 1024 * 1024, 1);
      const outcomes: Promise<unknown>[] = [];
      for (let i = 0; i < 12; i++) {
        outcomes.push(
          client.files.write(`/tmp/f${i}`, payload).then(
            () => "ok",
            (err: unknown) => err,
          ),
        );
      }
      const refused = (await Promise.race([
        Promise.any(outcomes.map((o) => o.then((v) => (v instanceof ForkdError ? v : Promise.reject(v))))),
        new Promise((_, reject) => setTimeout(() => reject(new Error("nothing was refused")), 10_000)),
      ])) as ForkdError;
      assert.equal(refused.code, "unavailable");
      assert.match(refused.message, /the guest is not reading its channel/);
      assert.ok(
        hostEnd.writableLength <= MAX_UNSENT_BYTES + 9 * 1024 * 1024,
        `${hostEnd.writableLength} queued`,
      );
    } finally {
      client.close();
      guest.destroy();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
