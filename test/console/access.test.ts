/**
 * Who may use the web console, over the daemon's real listeners (TCP with a token, the Unix socket): the page
 * and login without a token, the session cookie's attributes, where the cookie counts and where it does not,
 * CSRF on every state-changing request it authenticates (header, Origin, the terminal's subprotocol), logout,
 * bounded and expiring sessions, and the socket's rule for browsers behind a proxy. The services are the
 * HTTP-level test double (test/api/services-double.ts): these are rules about requests, not about sandboxes
 * (test/console/browser.test.ts drives the console on real VMs).
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import pino from "pino";
import WebSocket from "ws";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { SOCKET_CSRF_HEADER } from "../../src/api/socket-browser.js";
import { PORT_PROXY_HEADER } from "../../src/common/proxied-path.js";
import { ConsoleAccess } from "../../src/console/access.js";
import { consoleExtension } from "../../src/console/index.js";
import { CSRF_HEADER, CSRF_PROTOCOL_PREFIX, TERMINAL_PROTOCOL } from "../../src/console/protocol.js";
import { open, responseOf, send, type Target } from "../api/raw-http.js";
import { ServicesDouble } from "../api/services-double.js";

const TOKEN = "console-token-that-is-long-enough";
const quiet = pino({ level: "silent" });

interface Running {
  daemon: RunningDaemon;
  services: ServicesDouble;
  tcp: Target & { host: string; port: number };
  origin: string;
  socket: Target;
  clock: { now: number };
}

describe("console access over real listeners", () => {
  let dir: string;
  let consoleDir: string;
  let tokenFile: string;
  let running: Running;

  const start = async (name: string, sessions: { maxSessions?: number } = {}): Promise<Running> => {
    const services = new ServicesDouble();
    const clock = { now: Date.now() };
    const socketPath = path.join(dir, name, "forkd.sock");
    const daemon = await startDaemon(
      {
        socketPath,
        bind: "127.0.0.1:0",
        tokenFile,
        auditLog: null,
        snapshotsDir: "/srv/snapshots",
        logger: quiet,
        extensions: [
          consoleExtension({
            dir: consoleDir,
            sessions: { ...sessions, idleMs: 60_000, lifetimeMs: 600_000, now: () => clock.now },
            feed: { tickMs: 50, snapshotsEveryMs: 50, usageEveryMs: 50 },
          }),
        ],
      },
      services,
    );
    const url = new URL(daemon.urls.find((u) => u.startsWith("http:")) as string);
    return {
      daemon,
      services,
      tcp: { host: url.hostname, port: Number(url.port) },
      origin: url.origin,
      socket: { socketPath },
      clock,
    };
  };

  /** Logs in; returns the cookie header to send and the session's CSRF token. */
  const login = async (r: Running) => {
    const answer = await send(r.tcp, "POST", "/console/api/login", {
      json: { token: TOKEN },
      headers: { origin: r.origin },
    });
    assert.equal(answer.status, 200, answer.text);
    const setCookie = String(answer.headers["set-cookie"]);
    const cookie = setCookie.split(";")[0] as string;
    const csrf = answer.json<{ csrf: string }>().csrf;
    return { cookie, csrf, setCookie };
  };

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-console-access-"));
    consoleDir = path.join(dir, "page");
    await mkdir(path.join(consoleDir, "assets"), { recursive: true });
    await writeFile(path.join(consoleDir, "index.html"), "<!doctype html><title>forkd console</title>");
    await writeFile(path.join(consoleDir, "assets", "index-abc123.js"), "console.log(1)");
    tokenFile = path.join(dir, "tokens");
    await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    running = await start("main");
  });
  after(async () => {
    await running?.daemon.stop("test");
    await rm(dir, { recursive: true, force: true });
  });

  it("serves the page and its files without a token, with a strict content security policy", async () => {
    for (const page of ["/console", "/console/"]) {
      const answer = await send(running.tcp, "GET", page);
      assert.equal(answer.status, 200, page);
      assert.match(String(answer.headers["content-type"]), /^text\/html/);
      assert.match(answer.text, /forkd console/);
      assert.match(String(answer.headers["content-security-policy"]), /script-src 'self';/);
      assert.match(String(answer.headers["content-security-policy"]), /frame-ancestors 'none'/);
      assert.equal(answer.headers["x-content-type-options"], "nosniff");
    }
    const asset = await send(running.tcp, "GET", "/console/assets/index-abc123.js");
    assert.equal(asset.status, 200);
    assert.match(String(asset.headers["content-type"]), /^text\/javascript/);
    assert.match(String(asset.headers["cache-control"]), /immutable/);
    const cached = await send(running.tcp, "GET", "/console/assets/index-abc123.js", {
      headers: { "if-none-match": String(asset.headers.etag) },
    });
    assert.equal(cached.status, 304);
    const missing = await send(running.tcp, "GET", "/console/assets/nope.js");
    assert.equal(missing.status, 404);
    assert.equal(missing.json().code, "not_found");
    assert.ok(missing.headers["content-security-policy"], "errors carry the console's headers too");
    const traversal = await send(running.tcp, "GET", "/console/..%2f..%2fetc%2fpasswd");
    assert.equal(traversal.status, 404, "only the loaded files are served");
  });

  it("logs in with a token and refuses a wrong or missing one", async () => {
    const before = await send(running.tcp, "GET", "/console/api/session");
    assert.deepEqual(
      [before.status, before.json().auth, before.json().authenticated, before.json().csrf],
      [200, "login", false, null],
    );
    const wrong = await send(running.tcp, "POST", "/console/api/login", {
      json: { token: "not-the-daemon-token-at-all" },
      headers: { origin: running.origin },
    });
    assert.equal(wrong.status, 401);
    assert.match(wrong.json().error as string, /not one of the daemon's tokens/);
    assert.equal(wrong.headers["set-cookie"], undefined);
    const empty = await send(running.tcp, "POST", "/console/api/login", { json: {} });
    assert.equal(empty.status, 400);
    assert.match(empty.json().error as string, /missing body field "token"/);

    const { cookie, csrf, setCookie } = await login(running);
    assert.match(setCookie, /^forkd-console=[A-Za-z0-9_-]{43};/);
    assert.match(setCookie, /; HttpOnly/);
    assert.match(setCookie, /; SameSite=Strict/);
    assert.match(setCookie, /; Path=\//);
    assert.match(setCookie, /; Max-Age=600/);
    assert.doesNotMatch(setCookie, /Secure/, "no Secure flag over plain HTTP (it would never be sent back)");
    const session = await send(running.tcp, "GET", "/console/api/session", { headers: { cookie } });
    assert.equal(session.json().authenticated, true);
    assert.equal(session.json().csrf, csrf);
  });

  it("accepts the cookie on the console's API calls and nowhere else", async () => {
    const { cookie } = await login(running);
    for (const route of ["/v1/sandboxes", "/v1/snapshots", "/v1/host", "/v1/usage", "/version"]) {
      const answer = await send(running.tcp, "GET", route, { headers: { cookie } });
      assert.equal(answer.status, 200, `${route}: ${answer.text}`);
    }
    const spawned = await send(running.tcp, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: "py", n: 1 },
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    const id = spawned.json<{ id: string }[]>()[0]?.id as string;
    const notForCookies = [
      "/metrics",
      "/openapi.json",
      `/v1/sandboxes/${id}/files/stat?path=/etc/passwd`,
      `/v1/sandboxes/${id}/ports/8080/`,
      "/v1/snapshots/py/pack",
      "/v1/template-aliases",
    ];
    for (const route of notForCookies) {
      const answer = await send(running.tcp, "GET", route, { headers: { cookie } });
      assert.equal(answer.status, 401, `${route} must want the bearer token: ${answer.text}`);
      assert.match(answer.json().error as string, /missing bearer token/);
    }
    const list = await send(running.tcp, "GET", `/v1/sandboxes/${id}/files/list?path=/`, {
      headers: { cookie },
    });
    assert.notEqual(list.status, 401, "the Files view reads by cookie");
    const write = await send(running.tcp, "PUT", `/v1/sandboxes/${id}/files?path=/tmp/x`, {
      headers: { cookie, origin: running.origin, "content-type": "application/octet-stream" },
      body: "x",
    });
    assert.equal(write.status, 401, `writing files wants the bearer token: ${write.text}`);
    const e2b = await send(running.tcp, "GET", "/sandboxes", { headers: { cookie } });
    assert.equal(e2b.status, 401, "E2B's API takes its own key, never the console's cookie");
    const noCookie = await send(running.tcp, "GET", "/v1/sandboxes");
    assert.equal(noCookie.status, 401);
  });

  it("refuses state-changing requests by cookie without the CSRF token and the listener's own Origin", async () => {
    const { cookie, csrf } = await login(running);
    const spawn = (headers: Record<string, string>) =>
      send(running.tcp, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: "py", n: 1 },
        headers: { cookie, ...headers },
      });
    const noToken = await spawn({ origin: running.origin });
    assert.equal(noToken.status, 403);
    assert.match(noToken.json().error as string, /x-forkd-csrf/);
    const wrongToken = await spawn({ origin: running.origin, [CSRF_HEADER]: `${csrf}x` });
    assert.equal(wrongToken.status, 403);
    const noOrigin = await spawn({ [CSRF_HEADER]: csrf });
    assert.equal(noOrigin.status, 403);
    assert.match(noOrigin.json().error as string, /must carry an Origin/);
    const foreign = await spawn({ origin: "http://evil.example", [CSRF_HEADER]: csrf });
    assert.equal(foreign.status, 403);
    assert.match(foreign.json().error as string, /cross-origin request/);
    const before = running.services.sandboxesById.size;
    const ok = await spawn({ origin: running.origin, [CSRF_HEADER]: csrf });
    assert.equal(ok.status, 201, ok.text);
    assert.equal(running.services.sandboxesById.size, before + 1, "only the request with both was served");
    const id = ok.json<{ id: string }[]>()[0]?.id as string;
    const kill = await send(running.tcp, "DELETE", `/v1/sandboxes/${id}`, {
      headers: { cookie, origin: running.origin },
    });
    assert.equal(kill.status, 403, "DELETE needs the token as well");
    const killed = await send(running.tcp, "DELETE", `/v1/sandboxes/${id}`, {
      headers: { cookie, origin: running.origin, [CSRF_HEADER]: csrf },
    });
    assert.equal(killed.status, 204);
  });

  it("ends the session at logout", async () => {
    const { cookie, csrf } = await login(running);
    const refused = await send(running.tcp, "POST", "/console/api/logout", {
      headers: { cookie, origin: running.origin },
    });
    assert.equal(refused.status, 403, "logout is state-changing too");
    const out = await send(running.tcp, "POST", "/console/api/logout", {
      headers: { cookie, origin: running.origin, [CSRF_HEADER]: csrf },
    });
    assert.equal(out.status, 204);
    assert.match(String(out.headers["set-cookie"]), /^forkd-console=; Max-Age=0;/);
    const after = await send(running.tcp, "GET", "/v1/sandboxes", { headers: { cookie } });
    assert.equal(after.status, 401);
    assert.match(after.json().error as string, /session has ended/);
    const session = await send(running.tcp, "GET", "/console/api/session", { headers: { cookie } });
    assert.equal(session.json().authenticated, false);
  });

  it("bounds sessions in number, idle time and lifetime", async () => {
    const r = await start("bounded", { maxSessions: 2 });
    try {
      const first = await login(r);
      const second = await login(r);
      const third = await login(r);
      const status = async (cookie: string) =>
        (await send(r.tcp, "GET", "/v1/sandboxes", { headers: { cookie } })).status;
      assert.deepEqual(
        [await status(first.cookie), await status(second.cookie), await status(third.cookie)],
        [401, 200, 200],
        "the oldest login goes when a third would exceed two",
      );
      r.clock.now += 40_000;
      assert.equal(await status(third.cookie), 200, "used within the idle time");
      r.clock.now += 40_000;
      assert.equal(await status(second.cookie), 401, "unused for longer than the idle time");
      assert.equal(await status(third.cookie), 200, "the idle time counts from the last use");
      // 80 s so far; used every 50 s, it lives until the 600 s lifetime ends.
      for (let i = 0; i < 10; i++) {
        r.clock.now += 50_000;
        assert.equal(await status(third.cookie), 200);
      }
      r.clock.now += 50_000;
      assert.equal(await status(third.cookie), 401, "past the lifetime however busy");
    } finally {
      await r.daemon.stop("test");
    }
  });

  it("streams the state, then changes, to a logged-in page", async () => {
    const { cookie } = await login(running);
    const refused = await send(running.tcp, "GET", "/console/api/events");
    assert.equal(refused.status, 401);
    const events = await readEvents(running.tcp, cookie, async (seen) => {
      if (seen.length === 1) {
        await send(running.tcp, "POST", "/v1/sandboxes", {
          json: { snapshot_tag: "py", n: 1, metadata: { who: "feed-test" } },
          headers: { authorization: `Bearer ${TOKEN}` },
        });
      }
      return seen.some(
        (e) =>
          e.event === "patch" &&
          (e.data.sandboxes as { upsert: { metadata: Record<string, string> }[] } | undefined)?.upsert.some(
            (s) => s.metadata.who === "feed-test",
          ),
      );
    });
    assert.equal(events[0]?.event, "state");
    const state = events[0]?.data as { sandboxes: unknown[]; snapshots: { tag: string }[] };
    assert.ok(state.snapshots.some((s) => s.tag === "py"));
  });

  it("opens a terminal only with credentials and the CSRF subprotocol", async () => {
    const { cookie, csrf } = await login(running);
    const url = `ws://127.0.0.1:${running.tcp.port}/console/api/terminal?sandbox=sb-ffffffffffff`;
    const refusal = (headers: Record<string, string>, protocols = [TERMINAL_PROTOCOL]) =>
      new Promise<number>((resolve, reject) => {
        const ws = new WebSocket(url, protocols, { headers });
        ws.on("unexpected-response", (_req, res) => {
          resolve(res.statusCode ?? 0);
          ws.terminate();
        });
        ws.on("open", () => {
          ws.close();
          reject(new Error("the terminal opened"));
        });
        ws.on("error", () => {});
      });
    assert.equal(await refusal({ origin: running.origin }), 401, "no credentials");
    assert.equal(
      await refusal({ origin: running.origin, cookie }),
      403,
      "cookie without the CSRF subprotocol",
    );
    assert.equal(
      await refusal({ origin: "http://evil.example", cookie }, [
        TERMINAL_PROTOCOL,
        `${CSRF_PROTOCOL_PREFIX}${csrf}`,
      ]),
      403,
      "another site's page",
    );
    // With both, the daemon upgrades and answers on the socket (the double has no sandbox of that id).
    const message = await new Promise<Record<string, unknown>>((resolve, reject) => {
      const ws = new WebSocket(url, [TERMINAL_PROTOCOL, `${CSRF_PROTOCOL_PREFIX}${csrf}`], {
        headers: { origin: running.origin, cookie },
      });
      ws.on("message", (data) => resolve(JSON.parse(String(data))));
      ws.on("unexpected-response", (_req, res) => reject(new Error(`refused: ${res.statusCode}`)));
      ws.on("error", reject);
    });
    assert.deepEqual([message.type, message.code], ["error", "not_found"]);
  });

  it("on the Unix socket, serves a browser behind a local proxy only from a loopback origin, with the CSRF token", async () => {
    const session = await send(running.socket, "GET", "/console/api/session");
    assert.equal(session.status, 200);
    assert.equal(session.json().auth, "socket");
    const csrf = session.json().csrf as string;
    assert.ok(csrf.length > 20);
    const rebinding = await send(running.socket, "GET", "/console/api/session", {
      headers: { host: "evil.example:8080" },
    });
    assert.equal(rebinding.status, 403);
    assert.match(rebinding.json().error as string, /DNS-rebinding/);
    const browserRead = await send(running.socket, "GET", "/v1/sandboxes", {
      headers: { host: "rebound.example:8080", "sec-fetch-site": "same-origin" },
    });
    assert.equal(browserRead.status, 403, "any browser-looking request, not just the console's");
    const spawn = (headers: Record<string, string>) =>
      send(running.socket, "POST", "/v1/sandboxes", { json: { snapshot_tag: "py", n: 1 }, headers });
    assert.equal((await spawn({ host: "localhost:8080", origin: "http://evil.example" })).status, 403);
    assert.equal((await spawn({ host: "localhost:8080", origin: "http://localhost:8080" })).status, 403);
    assert.equal(
      (await spawn({ host: "localhost:8080", origin: "http://localhost:8080", [CSRF_HEADER]: csrf })).status,
      201,
    );
    assert.equal(
      (await spawn({ host: "127.0.0.1:9000", origin: "http://127.0.0.1:9000", [CSRF_HEADER]: csrf })).status,
      201,
    );
    assert.equal((await spawn({})).status, 201, "the CLI and SDKs (no Origin, no cookie) are unaffected");
    const login = await send(running.socket, "POST", "/console/api/login", {
      json: { token: TOKEN },
      headers: { origin: "http://localhost", [CSRF_HEADER]: csrf },
    });
    assert.equal(login.status, 409, "no login on the socket");
    assert.equal(CSRF_HEADER, SOCKET_CSRF_HEADER, "the page sends the header the API checks");
  });

  it("on the Unix socket, keeps a sandbox's pages off the console's origin unless forkd port proxies them", async () => {
    const navigate = { host: "127.0.0.1:8890", "sec-fetch-mode": "navigate", "sec-fetch-site": "none" };
    const page = await send(running.socket, "GET", "/v1/sandboxes/sb-000000000001/ports/8080/index.html", {
      headers: navigate,
    });
    assert.equal(page.status, 403, page.text);
    assert.match(page.json().error as string, /forkd port/);
    const bare = await send(running.socket, "GET", "/v1/sandboxes/sb-000000000001/ports/8080", {
      headers: navigate,
    });
    assert.equal(bare.status, 403, "the port's root as well");
    const viaForkdPort = await send(running.socket, "GET", "/v1/sandboxes/sb-000000000001/ports/8080/", {
      headers: { ...navigate, [PORT_PROXY_HEADER]: "1" },
    });
    assert.notEqual(viaForkdPort.status, 403, viaForkdPort.text);
    const sdk = await send(running.socket, "GET", "/v1/sandboxes/sb-000000000001/ports/8080/");
    assert.notEqual(sdk.status, 403, "clients that are not browsers are unaffected");
  });

  it("never passes the console's cookie or a sandbox credential on to a guest's port", async () => {
    const spawned = await send(running.socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: "py", n: 1 },
    });
    assert.equal(spawned.status, 201, spawned.text);
    const id = spawned.json<{ id: string }[]>()[0]?.id as string;
    const { cookie } = await login(running);
    const viaPort = await send(running.tcp, "GET", `/v1/sandboxes/${id}/ports/8080/page`, {
      headers: {
        authorization: `Bearer ${TOKEN}`,
        cookie: `theme=dark; ${cookie}`,
        "x-access-token": "the-sandbox-envd-token",
        "x-app-header": "kept",
      },
    });
    assert.equal(viaPort.status, 200, viaPort.text);
    const echoed = viaPort.json<{ headers: Record<string, string> }>().headers;
    assert.equal(echoed.cookie, "theme=dark", "the session cookie is the console's, never the guest's");
    assert.equal(echoed["x-access-token"], undefined);
    assert.equal(echoed.authorization, undefined);
    assert.equal(echoed["x-app-header"], "kept");
  });

  it("marks the cookie Secure and __Host- under TLS", () => {
    const access = new ConsoleAccess();
    const listener = { transport: "tcp" as const, tls: true, tokens: [], snapshotsDir: "/s", socketCsrf: "" };
    const cookie = access.setCookie(listener, "abc");
    assert.match(cookie, /^__Host-forkd-console=abc;/);
    assert.match(cookie, /; Secure/);
    assert.match(cookie, /; Path=\//);
    assert.doesNotMatch(cookie, /Domain=/, "__Host- cookies carry no Domain");
  });
});

interface SseEvent {
  event: string;
  data: Record<string, unknown>;
}

/** Reads the console's event stream until `enough` says so (it may act on what it has seen). */
async function readEvents(
  target: Target & { host: string; port: number },
  cookie: string,
  enough: (seen: SseEvent[]) => Promise<boolean>,
): Promise<SseEvent[]> {
  const request = open(target, "GET", "/console/api/events", { cookie });
  const answer = responseOf(request);
  request.end();
  const response = await answer;
  assert.equal(response.statusCode, 200);
  assert.match(String(response.headers["content-type"]), /^text\/event-stream/);
  const seen: SseEvent[] = [];
  let buffer = "";
  const deadline = setTimeout(() => response.destroy(new Error("no matching event within 10 s")), 10_000);
  try {
    for await (const chunk of response as AsyncIterable<Buffer>) {
      buffer += chunk.toString("utf8");
      for (let end = buffer.indexOf("\n\n"); end !== -1; end = buffer.indexOf("\n\n")) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = /^event: (.*)$/m.exec(block)?.[1];
        const data = /^data: (.*)$/m.exec(block)?.[1];
        if (event === undefined || data === undefined) continue;
        seen.push({ event, data: JSON.parse(data) });
        if (await enough(seen)) return seen;
      }
    }
    throw new Error("the event stream ended");
  } finally {
    clearTimeout(deadline);
    response.destroy();
  }
}
