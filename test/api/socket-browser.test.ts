/**
 * The Unix socket's browser rule is the API's, not the console's (issue 20, item 7): on a daemon without the
 * console (`--no-console`: no extension at all), a browser behind a forwarder to the socket is still held to
 * it, and so are its WebSocket upgrades, which never reach a route's hooks. Before, the rule lived in the
 * console's screen hook: gone with --no-console and skipped for every upgrade, so a DNS-rebinding page behind a
 * forwarder read the admin API and opened sandboxes' ports. Real listeners, the HTTP-level services double
 * (these are rules about requests).
 */
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import pino from "pino";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { SOCKET_CSRF_HEADER } from "../../src/api/socket-browser.js";
import { send, type Target } from "./raw-http.js";
import { ServicesDouble } from "./services-double.js";

/** Sends a WebSocket upgrade over the socket; resolves with the status line's code. */
function upgradeStatus(socketPath: string, url: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(socketPath);
    let answer = "";
    socket.on("data", (chunk) => {
      answer += chunk.toString("latin1");
      const line = /^HTTP\/1\.1 (\d{3})/.exec(answer);
      if (line) {
        resolve(Number(line[1]));
        socket.destroy();
      }
    });
    socket.on("error", reject);
    socket.on("close", () => reject(new Error(`no status line: ${JSON.stringify(answer.slice(0, 200))}`)));
    const lines = [
      `GET ${url} HTTP/1.1`,
      "Connection: Upgrade",
      "Upgrade: websocket",
      "Sec-WebSocket-Version: 13",
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
      ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    ];
    socket.write(`${lines.join("\r\n")}\r\n\r\n`);
  });
}

describe("the Unix socket's browser rule without the console", () => {
  let dir: string;
  let daemon: RunningDaemon;
  let socket: Target & { socketPath: string };
  let services: ServicesDouble;

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-socket-browser-"));
    services = new ServicesDouble();
    const socketPath = path.join(dir, "forkd.sock");
    daemon = await startDaemon(
      { socketPath, auditLog: null, snapshotsDir: "/srv/snapshots", logger: pino({ level: "silent" }) },
      services,
    );
    socket = { socketPath };
  });
  after(async () => {
    await daemon?.stop("test");
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("refuses a rebinding browser's read and any browser's write, and leaves other clients alone", async () => {
    const read = await send(socket, "GET", "/v1/sandboxes", {
      headers: { host: "rebound.example:8890", "sec-fetch-site": "same-origin" },
    });
    assert.equal(read.status, 403, read.text);
    assert.match(read.json().error as string, /DNS-rebinding/);
    const spawn = (headers: Record<string, string>) =>
      send(socket, "POST", "/v1/sandboxes", { json: { snapshot_tag: "py", n: 1 }, headers });
    const sameOrigin = await spawn({ host: "127.0.0.1:8890", origin: "http://127.0.0.1:8890" });
    assert.equal(sameOrigin.status, 403, "no console gave any page the CSRF token");
    assert.match(sameOrigin.json().error as string, new RegExp(SOCKET_CSRF_HEADER));
    const cli = await spawn({});
    assert.equal(cli.status, 201, cli.text);
  });

  it("holds WebSocket upgrades to the same rule", async () => {
    const ports = "/v1/sandboxes/sb-000000000001/ports/8080/ws";
    assert.equal(
      await upgradeStatus(socket.socketPath, ports, {
        Host: "rebound.example:8890",
        Origin: "http://rebound.example:8890",
      }),
      403,
      "a rebinding page's upgrade",
    );
    assert.equal(
      await upgradeStatus(socket.socketPath, ports, {
        Host: "127.0.0.1:8890",
        Origin: "http://127.0.0.1:8890",
      }),
      403,
      "a browser's upgrade to a sandbox's port through the socket (forkd port gives it an origin of its own)",
    );
    assert.equal(
      await upgradeStatus(socket.socketPath, "/v1/sandboxes/sb-000000000001/ports/8080/", {
        Host: "localhost",
        "Sec-Fetch-Mode": "websocket",
      }),
      403,
      "a browser known by its Sec-Fetch headers alone",
    );
    assert.notEqual(
      await upgradeStatus(socket.socketPath, ports, { Host: "localhost" }),
      403,
      "a client that is not a browser (the CLI, the SDKs) is unaffected",
    );
  });
});
