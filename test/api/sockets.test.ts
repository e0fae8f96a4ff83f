/**
 * The daemon's listeners over real sockets, where the socket is the point: Unix socket permissions and stale/live
 * socket handling, peer credentials in the audit log, TCP bearer tokens and bind policy, TLS, NDJSON streaming exec
 * (full duplex stdin, cancellation on disconnect, slow readers), audit log reopen, and draining on stop. The
 * services are the HTTP-level test double (test/api/services-double.ts).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { once } from "node:events";
import { chmod, chown, mkdtemp, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import pino from "pino";
import { checkConfig, type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { ForkdError } from "../../src/common/errors.js";
import { MAX_UNREAD_OUTPUT_BYTES } from "../../src/common/limits.js";
import { ndjsonLines, open, readAll, responseOf, send, type Target } from "./raw-http.js";
import { ServicesDouble } from "./services-double.js";

const run = promisify(execFile);
const TOKEN = "correct-horse-battery-staple-42";
const quiet = pino({ level: "silent" });

const isCode = (code: string) => (err: unknown) => err instanceof ForkdError && err.code === code;

async function waitFor<T>(
  what: string,
  check: () => T | undefined | Promise<T | undefined>,
  ms = 5000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe("daemon listeners over real sockets", () => {
  let dir: string;
  let tokenFile: string;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-api-sockets-"));
    tokenFile = path.join(dir, "tokens");
    await writeFile(tokenFile, `# rotated monthly\nold-token-that-is-long-enough\n${TOKEN}\n`, {
      mode: 0o600,
    });
  });
  after(() => rm(dir, { recursive: true, force: true }));

  const start = async (
    name: string,
    overrides: Partial<Parameters<typeof startDaemon>[0]> = {},
    services = new ServicesDouble(),
  ) => {
    const daemon = await startDaemon(
      {
        socketPath: path.join(dir, name, "run", "forkd.sock"),
        auditLog: path.join(dir, name, "log", "audit.log"),
        snapshotsDir: "/srv/snapshots",
        logger: quiet,
        ...overrides,
      },
      services,
    );
    return { daemon, services, socket: { socketPath: path.join(dir, name, "run", "forkd.sock") } as Target };
  };

  const readAudit = async (name: string) =>
    (await readFile(path.join(dir, name, "log", "audit.log"), "utf8"))
      .trim()
      .split("\n")
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Record<string, unknown>);

  it("creates the socket 0660 in a 0755 directory and names the caller by peer uid in the audit log", async () => {
    const { daemon, services, socket } = await start("unix");
    try {
      const socketPath = (socket as { socketPath: string }).socketPath;
      assert.equal((await stat(socketPath)).mode & 0o777, 0o660);
      assert.equal((await stat(path.dirname(socketPath))).mode & 0o777, 0o755);
      assert.deepEqual(daemon.urls, [`unix:${socketPath}`]);
      assert.equal((await send(socket, "GET", "/healthz")).text, '{"ok":true}');
      const spawned = await send(socket, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: "py", n: 2 },
        headers: { "x-request-id": "audit-me-1" },
      });
      assert.equal(spawned.status, 201);
      const ids = spawned.json<{ id: string }[]>().map((s) => s.id);
      const gone = await send(socket, "DELETE", "/v1/sandboxes/sb-ffffffffffff");
      assert.equal(gone.status, 404);
      await send(socket, "GET", "/v1/sandboxes"); // not mutating: not audited
      await daemon.stop("test");
      assert.equal(services.closed, true, "services closed on stop");
      await assert.rejects(stat(socketPath), /ENOENT/, "socket removed on stop");
      const lines = await readAudit("unix");
      assert.equal(lines.length, 2, JSON.stringify(lines));
      const [spawn, kill] = lines as [Record<string, unknown>, Record<string, unknown>];
      assert.equal(spawn.caller, `uid:${process.getuid?.()}`);
      assert.deepEqual(
        [spawn.method, spawn.url, spawn.status, spawn.request_id],
        ["POST", "/v1/sandboxes", 201, "audit-me-1"],
      );
      assert.deepEqual(spawn.ids, ids);
      assert.equal(typeof spawn.latency_ms, "number");
      assert.match(String(spawn.time), /^\d{4}-\d\d-\d\dT/);
      assert.deepEqual([kill.status, kill.ids], [404, ["sb-ffffffffffff"]]);
      assert.equal((await stat(path.join(dir, "unix", "log", "audit.log"))).mode & 0o777, 0o640);
    } finally {
      await daemon.stop("test");
    }
  });

  it("replaces a stale socket, refuses a live one and refuses a non-socket", async () => {
    const socketPath = path.join(dir, "stale", "run", "forkd.sock");
    await run("mkdir", ["-p", path.dirname(socketPath)]);
    // A socket file nobody listens on: what a SIGKILLed daemon leaves.
    await run("python3", [
      "-c",
      `import socket; socket.socket(socket.AF_UNIX).bind(${JSON.stringify(socketPath)})`,
    ]);
    assert.ok((await stat(socketPath)).isSocket());
    const { daemon, socket } = await start("stale");
    try {
      assert.equal((await send(socket, "GET", "/healthz")).status, 200);
      await assert.rejects(start("stale"), /another forkd daemon is already listening/);
      assert.equal((await send(socket, "GET", "/healthz")).status, 200, "the first daemon is undisturbed");
    } finally {
      await daemon.stop("test");
    }
    const filePath = path.join(dir, "file", "run", "forkd.sock");
    await run("mkdir", ["-p", path.dirname(filePath)]);
    await writeFile(filePath, "not a socket");
    await assert.rejects(start("file"), /is not a socket: refusing to replace it/);
    assert.equal(await readFile(filePath, "utf8"), "not a socket");
  });

  it("TCP with tokens: 401 without or with a wrong token, /healthz open, any configured token accepted", async () => {
    const { daemon } = await start("tcp", { socketPath: null, bind: "127.0.0.1:0", tokenFile });
    try {
      const port = Number(new URL(daemon.urls[0] as string).port);
      const tcp: Target = { host: "127.0.0.1", port };
      assert.equal((await send(tcp, "GET", "/healthz")).status, 200);
      const missing = await send(tcp, "GET", "/v1/sandboxes");
      assert.equal(missing.status, 401);
      assert.match(missing.json<{ error: string }>().error, /missing bearer token/);
      assert.equal(missing.headers["www-authenticate"], 'Bearer realm="forkd"');
      const wrong = await send(tcp, "GET", "/v1/sandboxes", {
        headers: { authorization: `Bearer ${TOKEN}x` },
      });
      assert.deepEqual([wrong.status, wrong.json<{ error: string }>().error], [401, "invalid bearer token"]);
      const prefix = await send(tcp, "GET", "/v1/sandboxes", {
        headers: { authorization: `Bearer ${TOKEN.slice(0, 20)}` },
      });
      assert.equal(prefix.status, 401);
      const basic = await send(tcp, "GET", "/v1/sandboxes", { headers: { authorization: `Basic ${TOKEN}` } });
      assert.match(basic.json<{ error: string }>().error, /malformed Authorization header/);
      const spawnUnauth = await send(tcp, "POST", "/v1/sandboxes", { json: { snapshot_tag: "py" } });
      assert.equal(spawnUnauth.status, 401, "mutations are refused too");
      for (const token of [TOKEN, "old-token-that-is-long-enough"]) {
        const ok = await send(tcp, "GET", "/v1/sandboxes", { headers: { authorization: `Bearer ${token}` } });
        assert.equal(ok.status, 200);
      }
      const spawned = await send(tcp, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: "py" },
        headers: { authorization: `Bearer ${TOKEN}` },
      });
      assert.equal(spawned.status, 201);
      await daemon.stop("test");
      const audit = await readAudit("tcp");
      assert.equal(audit.length, 2, "the refused and the accepted spawn");
      assert.match(String(audit[0]?.caller), /^tcp:127\.0\.0\.1$/);
      assert.equal(audit[0]?.status, 401);
      assert.match(String(audit[1]?.caller), /^token:[0-9a-f]{8}$/);
      assert.ok(!JSON.stringify(audit).includes(TOKEN), "the token itself is never logged");
    } finally {
      await daemon.stop("test");
    }
  });

  it("refuses TCP without a token (loopback too), weak, exposed or foreign token files, and half TLS configs", async () => {
    const base = { socketPath: null, auditLog: null, snapshotsDir: "/s" };
    await assert.rejects(
      checkConfig({ ...base, bind: "0.0.0.0:8889" }),
      /refusing to listen on 0\.0\.0\.0:8889 without a token/,
    );
    await assert.rejects(checkConfig({ ...base, bind: "[::]:8889" }), /without a token/);
    await assert.rejects(checkConfig({ ...base, bind: "example.com:8889" }), /without a token/);
    for (const bind of ["127.0.0.1:8889", "[::1]:8889", "localhost:8889"]) {
      await assert.rejects(
        checkConfig({ ...base, bind }),
        /without a token: every local user and any web page/,
      );
      await checkConfig({ ...base, bind, tokenFile });
    }
    await checkConfig({ ...base, bind: "0.0.0.0:8889", tokenFile });
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile, allowedHosts: ["bad host"] }),
      /invalid --allowed-host/,
    );
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile, allowedOrigins: ["http://x.example/path"] }),
      /invalid --allowed-origin/,
    );
    await assert.rejects(
      checkConfig({ ...base, socketPath: "/x", allowedHosts: ["forkd.internal"] }),
      /need --bind/,
    );
    const groupReadable = path.join(dir, "group-token");
    await writeFile(groupReadable, `${TOKEN}\n`);
    await chmod(groupReadable, 0o640);
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile: groupReadable }),
      /readable by other users \(mode 640\)/,
    );
    const worldWritable = path.join(dir, "writable-token");
    await writeFile(worldWritable, `${TOKEN}\n`);
    await chmod(worldWritable, 0o602);
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile: worldWritable }),
      /writable by other users/,
    );
    const foreign = path.join(dir, "foreign-token");
    await writeFile(foreign, `${TOKEN}\n`, { mode: 0o600 });
    await chown(foreign, 65534, 65534);
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile: foreign }),
      /owned by uid 65534, not by the daemon's user/,
    );
    await assert.rejects(checkConfig({ ...base, bind: "127.0.0.1" }), isCode("invalid_argument"));
    await assert.rejects(checkConfig({ ...base, bind: "127.0.0.1:99999" }), /invalid --bind/);
    const short = path.join(dir, "short-token");
    await writeFile(short, "tooshort\n", { mode: 0o600 });
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile: short }),
      /shorter than 16 bytes/,
    );
    const exposed = path.join(dir, "exposed-token");
    await writeFile(exposed, `${TOKEN}\n`);
    await chmod(exposed, 0o644);
    await assert.rejects(
      checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile: exposed }),
      /readable by other users/,
    );
    const empty = path.join(dir, "empty-token");
    await writeFile(empty, "# nothing\n\n", { mode: 0o600 });
    await assert.rejects(checkConfig({ ...base, bind: "127.0.0.1:1", tokenFile: empty }), /holds no token/);
    await assert.rejects(checkConfig({ ...base, bind: "127.0.0.1:1", tlsCert: "/x" }), /go together/);
    await assert.rejects(checkConfig({ ...base, socketPath: null }), /nothing to listen on/);
    await assert.rejects(checkConfig({ ...base, socketPath: "/x", tokenFile }), /--token-file needs --bind/);
  });

  it("TCP refuses a Host or Origin that is not the listener's own (DNS rebinding), before authentication", async () => {
    const { daemon } = await start("origin", {
      socketPath: null,
      bind: "127.0.0.1:0",
      tokenFile,
      allowedHosts: ["forkd.internal", "*.sandboxes.test"],
      allowedOrigins: ["https://console.test:8443"],
    });
    try {
      const port = Number(new URL(daemon.urls[0] as string).port);
      const tcp: Target = { host: "127.0.0.1", port };
      const auth = { authorization: `Bearer ${TOKEN}` };
      const get = (headers: Record<string, string>) => send(tcp, "GET", "/v1/sandboxes", { headers });
      for (const host of [
        `127.0.0.1:${port}`,
        `localhost:${port}`,
        `[::1]:${port}`,
        "forkd.internal",
        `a.sandboxes.test:${port}`,
      ]) {
        assert.equal((await get({ ...auth, host })).status, 200, host);
      }
      const rebound = await get({ ...auth, host: `attacker.example:${port}` });
      assert.equal(rebound.status, 403);
      assert.deepEqual(rebound.json<{ code: string }>().code, "forbidden");
      assert.match(rebound.json<{ error: string }>().error, /not a name of this listener.*--allowed-host/);
      const noToken = await get({ host: `attacker.example:${port}` });
      assert.equal(noToken.status, 403, "a rebinding page learns nothing, not even that a token is needed");
      assert.equal((await get({ ...auth, host: `127.0.0.1:${port + 1}` })).status, 403, "another port");
      assert.equal((await get({ ...auth, host: "sandboxes.test" })).status, 403, "the wildcard's parent");
      const healthz = await send(tcp, "GET", "/healthz", { headers: { host: "evil.example" } });
      assert.equal(healthz.status, 403, "no route is exempt");
      const host = `127.0.0.1:${port}`;
      assert.equal(
        (await get({ ...auth, host, origin: `http://127.0.0.1:${port}` })).status,
        200,
        "own origin",
      );
      assert.equal((await get({ ...auth, host, origin: `http://localhost:${port}` })).status, 200);
      assert.equal((await get({ ...auth, host, origin: "https://console.test:8443" })).status, 200);
      for (const origin of [
        "http://evil.example",
        `https://127.0.0.1:${port}`,
        "null",
        "https://console.test",
      ]) {
        const refused = await get({ ...auth, host, origin });
        assert.equal(refused.status, 403, origin);
        assert.match(refused.json<{ error: string }>().error, /cross-origin request .* refused/);
      }
      const spawn = await send(tcp, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: "py" },
        headers: { ...auth, host, origin: "http://evil.example" },
      });
      assert.equal(spawn.status, 403, "a cross-site form post cannot spawn");
    } finally {
      await daemon.stop("test");
    }
  });

  it("drops a client that never finishes sending its request headers", async () => {
    const { daemon } = await start("slow", {
      socketPath: null,
      bind: "127.0.0.1:0",
      tokenFile,
      headersTimeoutMs: 300,
    });
    try {
      const port = Number(new URL(daemon.urls[0] as string).port);
      const socket = connect(port, "127.0.0.1");
      await once(socket, "connect");
      socket.write("GET /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\n");
      const started = Date.now();
      const [, reply] = await Promise.all([
        once(socket, "close"),
        new Promise<string>((resolve) => {
          let text = "";
          socket.on("data", (d: Buffer) => {
            text += d.toString();
          });
          socket.on("close", () => resolve(text));
        }),
      ]);
      assert.ok(Date.now() - started < 10_000, "closed long before Node's default");
      assert.match(reply, /^HTTP\/1\.1 408/);
    } finally {
      await daemon.stop("test");
    }
  });

  it("serves HTTPS on the TCP listener with --tls-cert/--tls-key", async () => {
    const key = path.join(dir, "key.pem");
    const cert = path.join(dir, "cert.pem");
    await run("openssl", [
      ...["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"],
      ...["-addext", "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert],
    ]);
    const { daemon } = await start("tls", {
      socketPath: null,
      bind: "127.0.0.1:0",
      tokenFile,
      tlsCert: cert,
      tlsKey: key,
    });
    try {
      assert.match(daemon.urls[0] as string, /^https:\/\/127\.0\.0\.1:\d+$/);
      const port = Number(new URL(daemon.urls[0] as string).port);
      const tls: Target = { host: "127.0.0.1", port, ca: await readFile(cert) };
      const answer = await send(tls, "GET", "/version", { headers: { authorization: `Bearer ${TOKEN}` } });
      assert.equal(answer.json<{ api: string }>().api, "v1");
      await assert.rejects(send({ host: "127.0.0.1", port }, "GET", "/healthz"), "plain HTTP is not served");
    } finally {
      await daemon.stop("test");
    }
  });

  describe("streaming exec (NDJSON)", () => {
    let daemon: RunningDaemon;
    let services: ServicesDouble;
    let socket: Target;
    let id: string;

    before(async () => {
      ({ daemon, services, socket } = await start("stream", { auditLog: null }));
      const [sb] = await services.sandboxes.spawn({ snapshotTag: "py", n: 1 });
      id = (sb as { id: string }).id;
    });
    after(() => daemon.stop("test"));

    it("frames output chunks and ends with one exit line; utf8 kept whole across chunks", async () => {
      const request = open(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        "content-type": "application/json",
      });
      const answer = responseOf(request);
      request.end(JSON.stringify({ args: ["split-utf8"] }));
      const response = await answer;
      assert.equal(response.statusCode, 200);
      assert.equal(response.headers["content-type"], "application/x-ndjson");
      const events = [];
      for await (const event of ndjsonLines(response)) events.push(event);
      assert.deepEqual(events[0], { type: "started", id });
      const out = events
        .filter((e) => e.type === "stdout")
        .map((e) => e.data)
        .join("");
      assert.equal(out, "é\n\ufffd", "the split 2-byte character arrives whole; the stray 0xff is replaced");
      assert.equal(events.at(-1)?.type, "exit");
      assert.equal(events.at(-1)?.exit_code, 0);
      assert.equal(events.filter((e) => e.type === "exit" || e.type === "error").length, 1);
    });

    it("base64 encoding carries bytes exactly", async () => {
      const request = open(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        "content-type": "application/json",
      });
      const answer = responseOf(request);
      request.end(JSON.stringify({ args: ["split-utf8"], encoding: "base64" }));
      const bytes = [];
      for await (const event of ndjsonLines(await answer)) {
        if (event.type === "stdout") bytes.push(Buffer.from(String(event.data), "base64"));
      }
      assert.deepEqual([...Buffer.concat(bytes)], [0xc3, 0xa9, 0x0a, 0xff]);
    });

    it("streams stdin frames full duplex: output of one frame arrives before the next is sent", async () => {
      const request = open(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        "content-type": "application/x-ndjson",
      });
      const answer = responseOf(request);
      request.write(`${JSON.stringify({ args: ["cat"] })}\n`);
      const lines = ndjsonLines(await answer);
      assert.deepEqual((await lines.next()).value, { type: "started", id });
      request.write(`${JSON.stringify({ stdin: "first\n" })}\n`);
      assert.deepEqual((await lines.next()).value, { type: "stdout", data: "first\n" });
      request.write(`${JSON.stringify({ stdin_b64: Buffer.from("second\n").toString("base64") })}\n`);
      assert.deepEqual((await lines.next()).value, { type: "stdout", data: "second\n" });
      request.end(`${JSON.stringify({ eof: true })}\n`);
      const rest = [];
      for await (const event of lines) rest.push(event);
      assert.equal(rest.at(-1)?.type, "exit");
    });

    it("answers plain JSON errors before the stream starts, an error line after", async () => {
      const unknown = await send(socket, "POST", "/v1/sandboxes/sb-ffffffffffff/exec/stream", {
        json: { args: ["echo"] },
      });
      assert.equal(unknown.status, 404);
      const invalid = await send(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, { json: { args: [] } });
      assert.equal(invalid.status, 400);
      const badFirstLine = await send(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        headers: { "content-type": "application/x-ndjson" },
        body: `${JSON.stringify({ argv: ["cat"] })}\n`,
      });
      assert.equal(badFirstLine.status, 400);
      assert.match(badFirstLine.json<{ error: string }>().error, /NDJSON request line 1/);
      const badFrame = await send(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        headers: { "content-type": "application/x-ndjson" },
        body: `${JSON.stringify({ args: ["cat"] })}\n{"stdin": 5}\n`,
      });
      assert.equal(badFrame.status, 200, "the stream had started");
      const last = badFrame.text.trim().split("\n").at(-1) as string;
      assert.equal(JSON.parse(last).type, "error");
      assert.match(JSON.parse(last).error, /stdin/);
      const missing = await send(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        json: { args: ["nope"] },
      });
      assert.deepEqual(JSON.parse(missing.text.trim().split("\n").at(-1) as string).code, "not_found");
    });

    it("kills the command when the client disconnects", async () => {
      const before = services.cancelled.length;
      const request = open(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        "content-type": "application/json",
      });
      const answer = responseOf(request);
      request.end(JSON.stringify({ args: ["hang"] }));
      const lines = ndjsonLines(await answer);
      assert.equal((await lines.next()).value?.type, "started");
      request.destroy();
      await waitFor("the exec to be cancelled", () =>
        services.cancelled.length > before ? true : undefined,
      );
    });

    it("cancels the command when the client stops reading (bounded buffering)", async () => {
      const request = open(socket, "POST", `/v1/sandboxes/${id}/exec/stream`, {
        "content-type": "application/json",
      });
      const answer = responseOf(request);
      request.end(JSON.stringify({ args: ["flood", String(8 * MAX_UNREAD_OUTPUT_BYTES)] }));
      const response = await answer;
      response.pause();
      await new Promise((r) => setTimeout(r, 1500));
      const text = (await readAll(response)).toString("utf8");
      const last = JSON.parse(text.trim().split("\n").at(-1) as string);
      assert.equal(last.type, "error", `last line: ${JSON.stringify(last).slice(0, 200)}`);
      assert.match(last.error, /client read too slowly/);
      assert.ok(text.length < 4 * MAX_UNREAD_OUTPUT_BYTES, "did not buffer the whole output");
    });
  });

  it("SIGHUP-style reopen: after the log is renamed, new lines go to a new file at the path", async () => {
    const { daemon, socket } = await start("rotate");
    try {
      await send(socket, "POST", "/v1/sandboxes", { json: { snapshot_tag: "py" } });
      const logPath = path.join(dir, "rotate", "log", "audit.log");
      await waitFor("the first audit line", async () =>
        (await readFile(logPath, "utf8").catch(() => "")).includes("\n") ? true : undefined,
      );
      await rename(logPath, `${logPath}.1`);
      daemon.reopenAuditLog();
      await send(socket, "DELETE", "/v1/sandboxes?all=true");
      const fresh = await waitFor("the reopened log", async () => {
        const text = await readFile(logPath, "utf8").catch(() => "");
        return text.includes("\n") ? text : undefined;
      });
      assert.match(fresh, /"method":"DELETE"/);
      assert.doesNotMatch(fresh, /"method":"POST"/);
      assert.match(await readFile(`${logPath}.1`, "utf8"), /"method":"POST"/);
    } finally {
      await daemon.stop("test");
    }
  });

  it("stop drains in-flight requests, refuses new ones, and cuts what outlives the drain timeout", async () => {
    const { daemon, services, socket } = await start("drain", { drainTimeoutMs: 1500 });
    const [sb] = await services.sandboxes.spawn({ snapshotTag: "py", n: 2 });
    const [, sb2] = services.sandboxes.list();
    const quick = send(socket, "POST", `/v1/sandboxes/${sb?.id}/exec`, { json: { args: ["sleep", "300"] } });
    const stuck = send(socket, "POST", `/v1/sandboxes/${sb2?.id}/exec`, { json: { args: ["hang"] } });
    await new Promise((r) => setTimeout(r, 50));
    const started = Date.now();
    const stopping = daemon.stop("test");
    await new Promise((r) => setTimeout(r, 50));
    await assert.rejects(send(socket, "GET", "/healthz"), /ENOENT|ECONNREFUSED/, "no new connections");
    const done = await quick;
    assert.deepEqual(
      [done.status, done.json<{ stdout: string }>().stdout],
      [200, "slept\n"],
      "in-flight finished",
    );
    await assert.rejects(stuck, /socket hang up|ECONNRESET/, "cut after the drain timeout");
    await stopping;
    assert.ok(Date.now() - started >= 1400, "waited for the drain timeout");
    assert.ok(services.cancelled.includes(sb2?.id as string), "the cut request's exec was cancelled");
    assert.equal(services.closed, true);
  });
});
