/**
 * The port proxy against hostile callers and guests, on a real `forkd daemon` process (Unix socket and TCP with
 * a token) serving a real sandbox with a network:
 *   - `forkd port`'s local listener, probed by another local user: no path (dot segments raw or encoded, encoded
 *     slashes, backslashes, an absolute-form target) reaches anything but the sandbox's port, paths reach the
 *     guest exactly as sent, and the daemon serves nothing but the port route to what `forkd port` marks;
 *   - a guest that answers WebSocket upgrades with a plain response it streams for ever, to callers that leave
 *     mid-stream, through the forkd port route and E2B's data plane (a public sandbox, no credential): the
 *     daemon keeps serving and no error ever reaches its top level.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { isConnectionError } from "../../src/api/daemon.js";
import { PORT_PROXY_HEADER } from "../../src/common/proxied-path.js";
import { cliEntry, type DaemonProcess, startDaemonProcess } from "../api/daemon-process.js";
import { send } from "../api/raw-http.js";
import { HTTP_ECHO, STREAM_FOREVER } from "../support/guest-programs.js";
import { qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { runAsProbeUser } from "../support/other-user.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const root = process.getuid?.() === 0;
const TOKEN = "port-hostile-test-token-0123456789abcdef";
const ECHO_PORT = 8080;
const STREAM_PORT = 8090;
const UPGRADE_HEADERS =
  "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/** The message the daemon logs when an error of one connection reached the process's top level. */
const REACHED_THE_TOP = /reached the top|uncaught exception/;

/**
 * Run by the probe user: sends each raw request target of argv[2] (JSON) to 127.0.0.1:argv[1] as a GET (an
 * upgrade when it starts with "WS "), prints [[status line, first 300 bytes of the body], ...] as JSON.
 */
const PROBE = `
const net = require("node:net");
const [port, targets] = [Number(process.argv[1]), JSON.parse(process.argv[2])];
const one = (target) => new Promise((resolve) => {
  const ws = target.startsWith("WS ");
  const path = ws ? target.slice(3) : target;
  const c = net.connect(port, "127.0.0.1");
  let data = "";
  c.on("data", (d) => { data += d; });
  c.on("error", (e) => resolve(["ERROR " + e.code, ""]));
  c.on("close", () => {
    const at = data.indexOf("\\r\\n\\r\\n");
    resolve([data.split("\\r\\n")[0], at < 0 ? "" : data.slice(at + 4, at + 304)]);
  });
  c.write("GET " + path + " HTTP/1.1\\r\\nHost: 127.0.0.1:" + port + "\\r\\n" +
    (ws ? ${JSON.stringify(UPGRADE_HEADERS)} : "Connection: close\\r\\n") + "\\r\\n");
  setTimeout(() => c.destroy(), 10000);
});
(async () => {
  const out = [];
  for (const t of targets) out.push(await one(t));
  process.stdout.write(JSON.stringify(out));
})();
`;

/** Sends a WebSocket upgrade (or a plain GET) on `socket`, waits for the first bytes of the answer, leaves. */
async function upgradeAndLeave(socket: net.Socket, requestHead: string, upgrade = true): Promise<string> {
  socket.on("error", () => {});
  socket.write(`${requestHead}${upgrade ? UPGRADE_HEADERS : ""}\r\n`);
  const first = await new Promise<string>((resolve) => {
    socket.once("data", (chunk) => resolve(chunk.toString("latin1")));
    socket.once("close", () => resolve(""));
  });
  socket.destroy();
  return first;
}

describe("the port proxy against hostile callers and guests", {
  timeout: 30 * 60_000,
  skip: !root && "needs root",
}, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let daemon: DaemonProcess;
  let tcpPort: number;
  let id: string;
  const children: ChildProcess[] = [];

  /** `forkd port` for the sandbox's echo server against the daemon at `url`; resolves with its local port. */
  const forkdPort = async (url: string, token?: string): Promise<number> => {
    const child = spawn(
      process.execPath,
      [...cliEntry(), "port", id, String(ECHO_PORT), "--daemon-url", url],
      {
        env: { ...process.env, ...(token ? { FORKD_TOKEN: token } : {}) },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    children.push(child);
    let stderr = "";
    child.stderr?.on("data", (d: Buffer) => {
      stderr += d;
    });
    return new Promise<number>((resolve, reject) => {
      child.stdout?.once("data", (d: Buffer) => {
        const port = /^http:\/\/127\.0\.0\.1:(\d+) /.exec(String(d))?.[1];
        if (port) resolve(Number(port));
        else reject(new Error(`forkd port said ${String(d)}`));
      });
      child.once("exit", (code) => reject(new Error(`forkd port exited (${code}): ${stderr}`)));
    });
  };

  const exec = async (argv: string[]) => {
    const ran = await send(daemon.socket, "POST", `/v1/sandboxes/${id}/exec`, { json: { args: argv } });
    assert.equal(ran.status, 200, ran.text);
    assert.equal(ran.json().exit_code, 0, ran.text);
  };

  before(async () => {
    home = await tempHome("forkd-port-hostile-");
    const tag = await linkSharedSnapshot(home.home, "pyagent");
    const tokenFile = path.join(home.home, "tokens");
    await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    tcpPort = await new Promise<number>((resolve) => {
      const probe = net.createServer().listen(0, "127.0.0.1", () => {
        const { port } = probe.address() as net.AddressInfo;
        probe.close(() => resolve(port));
      });
    });
    daemon = await startDaemonProcess(home.home, [
      "--bind",
      `127.0.0.1:${tcpPort}`,
      "--token-file",
      tokenFile,
    ]);
    const spawned = await send(daemon.socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 1, per_child_netns: true },
    });
    assert.equal(spawned.status, 201, `${spawned.text}\n${daemon.log()}`);
    id = (spawned.json<{ id: string }[]>() as unknown as { id: string }[])[0]?.id as string;
    const write = async (file: string, text: string) => {
      const put = await send(daemon.socket, "PUT", `/v1/sandboxes/${id}/files?path=${file}`, {
        body: text,
        headers: { "content-type": "application/octet-stream" },
      });
      assert.ok(put.status < 300, put.text);
    };
    await write("/tmp/http_echo.py", HTTP_ECHO);
    await write("/tmp/stream_forever.py", STREAM_FOREVER);
    for (const [program, port] of [
      ["/tmp/http_echo.py", ECHO_PORT],
      ["/tmp/stream_forever.py", STREAM_PORT],
    ] as const) {
      await exec(["sh", "-c", `setsid -f python3 ${program} ${port} >/dev/null 2>&1 </dev/null`]);
      await waitFor(`the guest's server on ${port}`, 60_000, async () => {
        const answer = await upgradeAndLeave(
          net.connect(daemon.socketPath),
          `GET /v1/sandboxes/${id}/ports/${port}/ HTTP/1.1\r\nHost: localhost\r\n`,
          false,
        );
        return /^HTTP\/1\.1 (502|409) /.test(answer) || answer === "" ? undefined : true;
      });
    }
  });

  after(async () => {
    for (const child of children) child.kill("SIGTERM");
    if (id) await send(daemon.socket, "DELETE", `/v1/sandboxes/${id}`).catch(() => undefined);
    await daemon?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("forkd port: another local user reaches the sandbox's port and nothing else of the daemon", async () => {
    const local = await forkdPort(`unix:${daemon.socketPath}`);
    // The prefix /v1/sandboxes/<id>/ports/<port> is five segments: five ups reach the daemon's root.
    const up = (step: string, n = 5) => Array(n).fill(step).join("/");
    const climbing = [
      `/${up("..")}/v1/sandboxes`,
      `/${up("%2e%2e")}/v1/sandboxes`,
      `/${up("%2E%2e")}/v1/sandboxes`,
      `/${up(".%2E")}/v1/sandboxes`,
      `/${up("%2e.")}/v1/sandboxes?x=1`,
      `/x/${Array(6).fill("..").join("%2f")}%2fv1/sandboxes`,
      `/x/${Array(6).fill("..").join("%2F")}%2Fv1%2Fsandboxes`,
      `/${Array(5).fill("..").join("\\")}\\v1\\sandboxes`,
      `/x/${Array(6).fill("..").join("%5c")}%5cv1%5csandboxes`,
      `/./${up("..")}/v1/sandboxes`,
      `http://127.0.0.1/${up("..")}/v1/sandboxes`,
      `WS /${up("..")}/console/api/terminal?sandbox=${id}`,
      `WS /${up("%2e%2e")}/v1/sandboxes`,
    ];
    const probed = await runAsProbeUser([
      process.execPath,
      "-e",
      PROBE,
      String(local),
      JSON.stringify(climbing),
    ]);
    assert.equal(probed.code, 0, probed.stderr);
    const answers = JSON.parse(probed.stdout) as [string, string][];
    for (const [i, target] of climbing.entries()) {
      const [status, body] = answers[i] as [string, string];
      assert.ok(!body.includes(`"id":"${id}"`), `${target} reached the daemon's sandbox list: ${body}`);
      assert.match(status, /^HTTP\/1\.1 400 /, `${target}: ${status} ${body}`);
      assert.match(body, /forkd port: refused/, target);
    }
    // What is not a climb goes to the guest, spelled exactly as sent.
    const plain = ["/a//b/c.txt?x=%2e%2e&y=..", "/%41%2B/x"];
    const fine = await runAsProbeUser([process.execPath, "-e", PROBE, String(local), JSON.stringify(plain)]);
    const echoes = JSON.parse(fine.stdout) as [string, string][];
    for (const [i, target] of plain.entries()) {
      const [status, body] = echoes[i] as [string, string];
      assert.match(status, /^HTTP\/1\.1 200 /, `${target}: ${status} ${body}`);
      assert.equal((JSON.parse(body) as { path: string }).path, target);
    }
  });

  it("forkd port over TCP: a browser's request, with its own Host and Origin, reaches the guest", async () => {
    // Before, the browser's Host (the local listener's) went on to the daemon's TCP listener, which refused it.
    const local = await forkdPort(`http://127.0.0.1:${tcpPort}`, TOKEN);
    const page = await send({ host: "127.0.0.1", port: local }, "POST", "/form?x=1", {
      body: "a=1",
      headers: {
        host: `127.0.0.1:${local}`,
        origin: `http://127.0.0.1:${local}`,
        "sec-fetch-mode": "cors",
        "content-type": "application/x-www-form-urlencoded",
      },
    });
    assert.equal(page.status, 200, page.text);
    assert.equal((JSON.parse(page.text) as { path: string }).path, "/form?x=1");
  });

  it("the daemon serves nothing but the port route to a request forkd port marks", async () => {
    const marked = { [PORT_PROXY_HEADER]: "1" };
    const list = await send(daemon.socket, "GET", "/v1/sandboxes", { headers: marked });
    assert.equal(list.status, 403, list.text);
    assert.match(list.text, /forkd port/);
    const overTcp = await send({ host: "127.0.0.1", port: tcpPort }, "GET", "/v1/sandboxes", {
      headers: { ...marked, authorization: `Bearer ${TOKEN}` },
    });
    assert.equal(overTcp.status, 403, overTcp.text);
    const e2b = await send({ host: "127.0.0.1", port: tcpPort }, "GET", "/", {
      headers: { ...marked, "e2b-sandbox-id": id, "e2b-sandbox-port": String(ECHO_PORT) },
    });
    assert.equal(e2b.status, 403, "E2B's data plane is not the port route either");
    const terminal = await upgradeAndLeave(
      net.connect(daemon.socketPath),
      `GET /console/api/terminal?sandbox=${id} HTTP/1.1\r\nHost: localhost\r\n${PORT_PROXY_HEADER}: 1\r\n`,
    );
    assert.match(terminal, /^HTTP\/1\.1 403 /, terminal.slice(0, 200));
    const port = await send(daemon.socket, "GET", `/v1/sandboxes/${id}/ports/${ECHO_PORT}/ok`, {
      headers: marked,
    });
    assert.equal(port.status, 200, port.text);
  });

  it("a guest streaming a plain answer to an upgrade, to callers that leave mid-stream, stops nothing", async () => {
    for (let i = 0; i < 5; i++) {
      const viaForkd = await upgradeAndLeave(
        net.connect(daemon.socketPath),
        `GET /v1/sandboxes/${id}/ports/${STREAM_PORT}/ws HTTP/1.1\r\nHost: localhost\r\n`,
      );
      assert.match(viaForkd, /^HTTP\/1\.1 200 /, "the guest's answer reached the caller");
      // E2B's data plane: the sandbox is public (forkd-API sandboxes are), so no credential at all.
      const viaE2b = await upgradeAndLeave(
        net.connect(tcpPort, "127.0.0.1"),
        `GET /ws HTTP/1.1\r\nHost: 127.0.0.1:${tcpPort}\r\ne2b-sandbox-id: ${id}\r\ne2b-sandbox-port: ${STREAM_PORT}\r\n`,
      );
      assert.match(viaE2b, /^HTTP\/1\.1 200 /, "through E2B's data plane too");
      await new Promise((r) => setTimeout(r, 200));
    }
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(daemon.child.exitCode, null, `the daemon exited:\n${daemon.log()}`);
    assert.equal(daemon.child.signalCode, null);
    const health = await send(daemon.socket, "GET", "/healthz");
    assert.equal(health.status, 200);
    assert.doesNotMatch(
      daemon.log(),
      REACHED_THE_TOP,
      "no connection's error reached the process's top level",
    );
  });
});

describe("the daemon's last line of defence", () => {
  it("keeps serving after an error of one connection only, and exits on any other uncaught error", () => {
    const reset = Object.assign(new Error("write ECONNRESET"), { code: "ECONNRESET", syscall: "write" });
    assert.equal(isConnectionError(reset), true);
    const ended = Object.assign(new Error("write after end"), { code: "ERR_STREAM_WRITE_AFTER_END" });
    assert.equal(isConnectionError(ended), true);
    const disk = Object.assign(new Error("ENOSPC"), { code: "ENOSPC", syscall: "write" });
    assert.equal(isConnectionError(disk), false);
    assert.equal(isConnectionError(new TypeError("x is undefined")), false);
    assert.equal(isConnectionError("ECONNRESET"), false);
  });
});
