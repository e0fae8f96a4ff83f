/**
 * The REST API end to end: a real `forkd daemon` process (the CLI entry) over the real SandboxManager, serving real
 * QEMU sandboxes forked from a warm pyagent snapshot. Covers the v0.5 routes, streaming exec with stdin and
 * cancellation, files, lifetimes, metrics, a huge argv, kill racing exec, a daemon restart that re-attaches, and a
 * daemon SIGKILLed mid-spawn (no orphan QEMU, no lost record). Every test home's QEMUs are killed at the end.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import { type DaemonProcess, startDaemonProcess } from "./daemon-process.js";
import { ndjsonLines, open, responseOf, send } from "./raw-http.js";

interface Info {
  id: string;
  status: string;
  snapshot_tag: string;
  pid: number | null;
}

describe("REST API end to end on real VMs", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let daemon: DaemonProcess | undefined;

  const spawnOne = async (d: DaemonProcess, body: Record<string, unknown> = {}): Promise<Info> => {
    const answer = await send(d.socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 1, ...body },
    });
    assert.equal(answer.status, 201, `${answer.text}\n${d.log()}`);
    return (answer.json<Info[]>() as Info[])[0] as Info;
  };

  before(async () => {
    home = await tempHome("forkd-api-e2e-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
  });
  after(async () => {
    await daemon?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("serves the v0.5 routes on real sandboxes: spawn, list, ping, exec, eval, kill", async () => {
    daemon = await startDaemonProcess(home.home);
    const socket = daemon.socket;
    // Exactly what forkd v0.5's TypeScript SDK sends.
    const spawned = await send(socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 2, per_child_netns: false },
    });
    assert.equal(spawned.status, 201, spawned.text);
    const [a, b] = spawned.json<Info[]>() as unknown as [Info, Info];
    for (const info of [a, b]) {
      assert.deepEqual([info.status, info.snapshot_tag], ["running", tag]);
      assert.ok(info.pid && info.pid > 0);
    }
    const listed = (await send(socket, "GET", "/v1/sandboxes")).json<Info[]>() as unknown as Info[];
    assert.deepEqual(listed.map((s) => s.id).sort(), [a.id, b.id].sort());
    const ping = await send(socket, "POST", `/v1/sandboxes/${a.id}/ping`, {
      headers: { "content-type": "application/json" },
      body: "",
    });
    assert.deepEqual([ping.status, ping.json().pong, ping.json().sandbox_id], [200, true, a.id]);

    const ran = await send(socket, "POST", `/v1/sandboxes/${a.id}/exec`, {
      json: { args: ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_secs: 30 },
    });
    assert.deepEqual(
      [ran.json().stdout, ran.json().stderr, ran.json().exit_code],
      ["out\n", "err\n", 3],
      ran.text,
    );
    const hostname = await send(socket, "POST", `/v1/sandboxes/${b.id}/exec`, {
      json: { args: ["hostname"] },
    });
    assert.equal(hostname.json().stdout, `${b.id}\n`, "each child knows its own id");
    const killedBySignal = await send(socket, "POST", `/v1/sandboxes/${a.id}/exec`, {
      json: { args: ["sh", "-c", "kill -9 $$"] },
    });
    assert.deepEqual([killedBySignal.json().exit_code, killedBySignal.json().signal], [137, "SIGKILL"]);
    const timedOut = await send(socket, "POST", `/v1/sandboxes/${a.id}/exec`, {
      json: { args: ["sleep", "30"], timeout_ms: 500 },
    });
    assert.equal(timedOut.json().timed_out, true, timedOut.text);

    const evaluated = await send(socket, "POST", `/v1/sandboxes/${b.id}/eval`, {
      json: { code: "numpy.arange(4).sum()" },
    });
    assert.deepEqual(
      [evaluated.json().result, evaluated.json().error, evaluated.json().exit_code],
      ["6", null, 0],
    );
    const raised = await send(socket, "POST", `/v1/sandboxes/${b.id}/eval`, { json: { code: "1/0" } });
    assert.deepEqual([raised.status, raised.json().exit_code], [200, 1]);
    assert.match(String(raised.json().error), /^ZeroDivisionError: /);

    const metrics = (await send(socket, "GET", "/metrics")).text;
    assert.match(metrics, /^forkd_sandboxes_active 2$/m);
    assert.match(
      metrics,
      new RegExp(`^forkd_sandbox_memory_bytes\\{id="${a.id}",snapshot_tag="${tag}",kind="pss"\\} [1-9]`, "m"),
    );

    assert.equal((await send(socket, "DELETE", `/v1/sandboxes/${a.id}`)).status, 204);
    assert.equal((await send(socket, "GET", `/v1/sandboxes/${a.id}`)).status, 404);
    assert.equal(
      (await send(socket, "POST", `/v1/sandboxes/${a.id}/exec`, { json: { args: ["true"] } })).status,
      404,
    );
    assert.equal((await send(socket, "DELETE", `/v1/sandboxes/${a.id}`)).status, 404);
    const all = await send(socket, "DELETE", "/v1/sandboxes?all=true");
    assert.deepEqual(all.json(), { killed: [b.id] });
    assert.deepEqual(await qemusMentioning(home.run), []);
  });

  it("streams exec output with stdin, and kills the guest process when the client disconnects", async () => {
    assert.ok(daemon);
    const socket = daemon.socket;
    const sb = await spawnOne(daemon);
    try {
      const request = open(socket, "POST", `/v1/sandboxes/${sb.id}/exec/stream`, {
        "content-type": "application/x-ndjson",
      });
      const answer = responseOf(request);
      const upper = "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='', flush=True)\n";
      request.write(`${JSON.stringify({ args: ["python3", "-u", "-c", upper] })}\n`);
      const lines = ndjsonLines(await answer);
      assert.equal((await lines.next()).value?.type, "started");
      request.write(`${JSON.stringify({ stdin: "hello\n" })}\n`);
      assert.deepEqual(
        (await lines.next()).value,
        { type: "stdout", data: "HELLO\n" },
        "output before stdin ends",
      );
      request.write(`${JSON.stringify({ stdin: "world\n" })}\n`);
      assert.deepEqual((await lines.next()).value, { type: "stdout", data: "WORLD\n" });
      request.end();
      const rest = [];
      for await (const event of lines) rest.push(event);
      assert.deepEqual(rest.at(-1)?.type, "exit");
      assert.equal(rest.at(-1)?.exit_code, 0);

      const hang = open(socket, "POST", `/v1/sandboxes/${sb.id}/exec/stream`, {
        "content-type": "application/json",
      });
      const hangAnswer = responseOf(hang);
      hang.end(JSON.stringify({ args: ["sh", "-c", "echo $$; exec sleep 1000"], timeout_secs: 600 }));
      const hangLines = ndjsonLines(await hangAnswer);
      assert.equal((await hangLines.next()).value?.type, "started");
      const pid = String((await hangLines.next()).value?.data).trim();
      assert.match(pid, /^\d+$/);
      hang.destroy();
      await waitFor("the guest process to be killed", 30_000, async () => {
        const probe = await send(socket, "POST", `/v1/sandboxes/${sb.id}/exec`, {
          json: { args: ["kill", "-0", pid] },
        });
        return probe.json().exit_code !== 0 ? true : undefined;
      });
    } finally {
      await send(socket, "DELETE", `/v1/sandboxes/${sb.id}`);
    }
  });

  it("files: binary round trip, list, stat, remove; bad paths refused", async () => {
    assert.ok(daemon);
    const socket = daemon.socket;
    const sb = await spawnOne(daemon);
    try {
      const bytes = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 31) % 256));
      const put = await send(socket, "PUT", `/v1/sandboxes/${sb.id}/files?path=/tmp/d/blob.bin&mode=0600`, {
        body: bytes,
        headers: { "content-type": "application/octet-stream" },
      });
      assert.deepEqual(put.json(), { path: "/tmp/d/blob.bin", bytes: bytes.length });
      const got = await send(socket, "GET", `/v1/sandboxes/${sb.id}/files?path=/tmp/d/blob.bin`);
      assert.ok(got.body.equals(bytes), "same bytes back");
      const stat = (
        await send(socket, "GET", `/v1/sandboxes/${sb.id}/files/stat?path=/tmp/d/blob.bin`)
      ).json();
      assert.deepEqual([stat.type, stat.size, stat.mode], ["file", bytes.length, 0o600]);
      const list = (await send(socket, "GET", `/v1/sandboxes/${sb.id}/files/list?path=/tmp/d`)).json<{
        entries: { name: string }[];
      }>();
      assert.deepEqual(
        list.entries.map((e) => e.name),
        ["blob.bin"],
      );
      const sum = await send(socket, "POST", `/v1/sandboxes/${sb.id}/exec`, {
        json: { args: ["python3", "-c", "import sys; print(sum(open('/tmp/d/blob.bin','rb').read()))"] },
      });
      assert.equal(
        sum.json().stdout,
        `${bytes.reduce((s, v) => s + v, 0)}\n`,
        "the guest sees the same bytes",
      );
      assert.equal(
        (await send(socket, "DELETE", `/v1/sandboxes/${sb.id}/files?path=/tmp/d&recursive=true`)).status,
        204,
      );
      assert.equal((await send(socket, "GET", `/v1/sandboxes/${sb.id}/files/stat?path=/tmp/d`)).status, 404);
      assert.equal(
        (await send(socket, "GET", `/v1/sandboxes/${sb.id}/files?path=/tmp/../etc/shadow`)).status,
        400,
      );
      assert.equal((await send(socket, "GET", `/v1/sandboxes/${sb.id}/files?path=etc/passwd`)).status, 400);
    } finally {
      await send(socket, "DELETE", `/v1/sandboxes/${sb.id}`);
    }
  });

  it("a huge argv gets a clear answer and leaves the sandbox working", async (t) => {
    assert.ok(daemon);
    const socket = daemon.socket;
    const sb = await spawnOne(daemon);
    try {
      const args = [
        "python3",
        "-c",
        "import sys; print(len(sys.argv))",
        ...Array.from({ length: 4000 }, () => "a".repeat(200)),
      ];
      const answer = await send(socket, "POST", `/v1/sandboxes/${sb.id}/exec`, { json: { args } });
      t.diagnostic(`argv of ${args.length} arguments: HTTP ${answer.status} ${answer.text.slice(0, 200)}`);
      assert.equal(answer.status, 413, answer.text);
      assert.match(answer.json<{ error: string }>().error, /at most \d+ fit in one exec/);
      const fits = [
        ...["python3", "-c", "import sys; print(len(sys.argv))"],
        ...Array.from({ length: 250 }, () => "a".repeat(200)),
      ];
      const ran = await send(socket, "POST", `/v1/sandboxes/${sb.id}/exec`, { json: { args: fits } });
      assert.equal(ran.json().stdout, `${fits.length - 2}\n`, ran.text);
      const tooMany = await send(socket, "POST", `/v1/sandboxes/${sb.id}/exec`, {
        json: { args: Array.from({ length: 5000 }, () => "x") },
      });
      assert.equal(tooMany.status, 400);
      const ping = await send(socket, "POST", `/v1/sandboxes/${sb.id}/ping`);
      assert.equal(ping.status, 200, "still answering");
    } finally {
      await send(socket, "DELETE", `/v1/sandboxes/${sb.id}`);
    }
  });

  it("kill racing a running exec: the exec ends with an error, the kill succeeds, nothing is left", async () => {
    assert.ok(daemon);
    const socket = daemon.socket;
    const sb = await spawnOne(daemon);
    const stream = open(socket, "POST", `/v1/sandboxes/${sb.id}/exec/stream`, {
      "content-type": "application/json",
    });
    const answer = responseOf(stream);
    stream.end(JSON.stringify({ args: ["sleep", "60"] }));
    const lines = ndjsonLines(await answer);
    assert.equal((await lines.next()).value?.type, "started");
    const buffered = send(socket, "POST", `/v1/sandboxes/${sb.id}/exec`, { json: { args: ["sleep", "60"] } });
    await new Promise((r) => setTimeout(r, 300));
    const [killed, again] = await Promise.all([
      send(socket, "DELETE", `/v1/sandboxes/${sb.id}`),
      send(socket, "DELETE", `/v1/sandboxes/${sb.id}`),
    ]);
    // The second kill either joins the first (204) or finds the sandbox gone (404); never anything else.
    for (const answer of [killed, again]) assert.ok([204, 404].includes(answer.status), answer.text);
    assert.ok(killed.status === 204 || again.status === 204, "a kill succeeded");
    const rest = [];
    for await (const event of lines) rest.push(event);
    assert.equal(rest.at(-1)?.type, "error", JSON.stringify(rest));
    const plain = await buffered;
    assert.ok(plain.status >= 400, `buffered exec failed: ${plain.text}`);
    assert.equal(typeof plain.json().error, "string");
    assert.equal((await send(socket, "GET", `/v1/sandboxes/${sb.id}`)).status, 404);
    assert.deepEqual(await qemusMentioning(sb.id), []);
  });

  it("a SIGTERMed daemon drains and exits 0; the next one re-attaches to the running sandbox", async () => {
    assert.ok(daemon);
    const sb = await spawnOne(daemon, { timeout_ms: 0 });
    await send(daemon.socket, "POST", `/v1/sandboxes/${sb.id}/eval`, { json: { code: "KEEP = 41" } });
    const stopped = await daemon.stop();
    assert.deepEqual(stopped, { code: 0, signal: null }, daemon.log());
    assert.equal((await qemusMentioning(sb.id)).length, 1, "the sandbox outlives the daemon");
    daemon = await startDaemonProcess(home.home);
    const info = (await send(daemon.socket, "GET", `/v1/sandboxes/${sb.id}`)).json<Info>();
    assert.equal(info.status, "running");
    const evaluated = await send(daemon.socket, "POST", `/v1/sandboxes/${sb.id}/eval`, {
      json: { code: "KEEP + 1" },
    });
    assert.equal(evaluated.json().result, "42", "same VM, same interpreter");
    assert.equal((await send(daemon.socket, "DELETE", `/v1/sandboxes/${sb.id}`)).status, 204);
  });

  it("a daemon SIGKILLed mid-spawn: the restart leaves no orphan QEMU and keeps the records", async () => {
    assert.ok(daemon);
    const crashing = daemon;
    // Enough children that the spawn is still running when the first QEMU appears and the daemon dies (with
    // the Go agent, 3 children could all be ready before the crash landed).
    const spawnRequest = send(crashing.socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 10 },
    }).catch((err: Error) => err);
    await waitFor("a child QEMU", 120_000, async () =>
      (await qemusMentioning(home.run)).length > 0 ? true : undefined,
    );
    await crashing.crash();
    assert.ok((await spawnRequest) instanceof Error, "the client saw the connection drop");
    daemon = await startDaemonProcess(home.home);
    assert.deepEqual(await qemusMentioning(home.run), [], "orphans killed by the restart");
    const rows = (await send(daemon.socket, "GET", "/v1/sandboxes")).json<Info[]>() as unknown as Info[];
    assert.ok(rows.length >= 1, `records kept: ${JSON.stringify(rows)}`);
    for (const row of rows) assert.equal(row.status, "dead");
    assert.deepEqual(await entries(home.run), [], "their run directories are gone");
    const cleared = await send(daemon.socket, "DELETE", "/v1/sandboxes?all=true");
    assert.equal(cleared.status, 200);
    assert.deepEqual((await send(daemon.socket, "GET", "/v1/sandboxes")).json(), []);
  });
});
