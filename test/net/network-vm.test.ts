/**
 * Sandbox networks on real VMs, against the tests' own "internet" (a namespace the host routes to, with HTTP
 * and DNS servers of its own) and a real daemon API on TCP: egress policies by domain and CIDR, a policy change
 * while the sandbox runs, nothing reachable that must not be (a sibling, the daemon, the host), 20 children of
 * one snapshot with the same guest IP fetching at once, the port proxy (HTTP and WebSocket), and a daemon
 * SIGKILLed mid-spawn leaving no namespace, veth or record behind.
 */
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { readdir, readFile, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import WebSocket from "ws";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import type { SandboxInfo } from "../../src/controller/sandbox-service.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { builtinTemplatesDir } from "../../src/image/package-root.js";
import { resolveNetworkConfig } from "../../src/net/config.js";
import { sandboxNetworkExists } from "../../src/net/namespace.js";
import { StateDb } from "../../src/store/db.js";
import { FETCH_DEF, HTTP_ECHO, WS_ECHO } from "../support/guest-programs.js";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import {
  INTERNET_GATEWAY,
  INTERNET_HOSTS,
  startTestInternet,
  type TestInternet,
} from "../support/test-internet.js";

const run = promisify(execFile);
const root = process.getuid?.() === 0;
const TOKEN = "network-test-token-0123456789abcdef";

describe("sandbox networks on real VMs", { timeout: 40 * 60_000, skip: !root && "needs root" }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let internet: TestInternet;
  let services: Awaited<ReturnType<typeof openServices>>;
  let daemon: RunningDaemon;
  let apiPort: number;
  let hostServer: net.Server;
  let hostPort: number;

  const fetchIn = async (id: string, url: string, timeout = 8) => {
    const result = await services.sandboxes.eval(id, `print(fetch(${JSON.stringify(url)}, ${timeout}))`, {
      timeoutMs: (timeout + 20) * 1000,
    });
    assert.equal(result.error, null, JSON.stringify(result));
    return result.stdout.trim();
  };
  /** Starts `command` in the background in the guest, detached from the exec's output pipes. */
  const startServer = async (id: string, command: string) => {
    const ran = await services.sandboxes.exec(id, [
      "sh",
      "-c",
      `setsid -f ${command} >/dev/null 2>&1 </dev/null`,
    ]);
    assert.equal(ran.exitCode, 0, ran.stderr.toString());
  };
  const spawnOne = async (network?: Parameters<typeof services.sandboxes.spawn>[0]["network"]) => {
    const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, timeoutMs: 0, network });
    await services.sandboxes.eval((info as SandboxInfo).id, FETCH_DEF);
    return info as SandboxInfo;
  };

  before(async () => {
    home = await tempHome("forkd-net-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    internet = await startTestInternet();
    services = await openServices(home, {
      network: { network: { dnsUpstreams: [internet.dns] }, defaultEgress: "deny" },
    });
    const tokenFile = path.join(home.home, "tokens");
    await writeFile(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    daemon = await startDaemon(
      { socketPath: null, bind: "0.0.0.0:0", tokenFile, auditLog: null, snapshotsDir: home.snapshots },
      { ...services, close: async () => {} },
    );
    apiPort = Number(new URL(daemon.urls[0] as string).port);
    hostServer = net.createServer((socket) => socket.end("host service\n"));
    await new Promise<void>((resolve) => hostServer.listen(0, "0.0.0.0", () => resolve()));
    hostPort = (hostServer.address() as net.AddressInfo).port;
  });
  after(async () => {
    await daemon?.stop("test over");
    await services?.close({ killSandboxes: true });
    hostServer?.close();
    await internet?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("reports netns mode and v0.5's netns/guest_addr", async () => {
    assert.equal(
      services.sandboxes.networkStatus().mode,
      "netns",
      JSON.stringify(services.sandboxes.networkStatus()),
    );
    const status = await fetch(`http://127.0.0.1:${apiPort}/v1/network`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    assert.equal(((await status.json()) as { default_egress: string }).default_egress, "deny");
  });

  it("allows the domains and CIDRs a policy allows and blocks the rest; a change applies while it runs", async () => {
    const sb = await spawnOne({
      allowOut: ["allowed.test", "*.wild.test", `${INTERNET_HOSTS.cidrAllowed}/32`],
    });
    assert.equal(sb.network.kind, "netns");
    assert.equal(sb.network.netns, `forkd-${sb.id}`);
    assert.deepEqual(sb.network.policy, {
      default: "deny",
      allowOut: ["*.wild.test", INTERNET_HOSTS.cidrAllowed, "allowed.test"],
      denyOut: [],
    });
    assert.match(
      await fetchIn(sb.id, "http://allowed.test/a"),
      /^OK .*"host":"198\.51\.100\.10","path":"\/a"/,
    );
    assert.match(await fetchIn(sb.id, "http://a.wild.test/"), /^OK .*198\.51\.100\.12/);
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.cidrAllowed}/`), /^OK /);
    assert.match(await fetchIn(sb.id, "http://denied.test/"), /^ERR URLError .*(resolution|Name or service)/);
    assert.match(
      await fetchIn(sb.id, "http://other.test/"),
      /^ERR URLError/,
      "names no rule allows do not resolve",
    );
    assert.match(
      await fetchIn(sb.id, `http://${INTERNET_HOSTS.other}/`, 4),
      /^ERR /,
      "nor are their addresses reachable",
    );
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.denied}/`, 4), /^ERR /);

    await services.sandboxes.setNetworkPolicy(sb.id, { default: "allow", denyOut: [INTERNET_HOSTS.denied] });
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.other}/`), /^OK /, "allowed now");
    assert.match(await fetchIn(sb.id, "http://other.test/"), /^OK /, "and it resolves");
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.denied}/`, 4), /^ERR /);
    const updated = await fetch(`http://127.0.0.1:${apiPort}/v1/sandboxes/${sb.id}/network`, {
      method: "PUT",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ egress: "deny" }),
    });
    assert.equal(updated.status, 200, await updated.clone().text());
    assert.deepEqual(((await updated.json()) as { network: { egress: unknown } }).network.egress, {
      egress: "deny",
      allow_out: [],
      deny_out: [],
    });
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.other}/`, 4), /^ERR /, "denied again");
    await services.sandboxes.kill(sb.id);
    assert.equal(await sandboxNetworkExists(sb.id), false, "its namespace and veth went with it");
  });

  it("a template's [egress] is what its sandboxes get when a spawn names none, and what fills a policy's gaps", async () => {
    // The built-in pyagent template plus an [egress] table: the same image (egress is not part of it), a
    // snapshot of its own. The daemon's default here is deny, so what reaches other.test comes from the template.
    const templateFile = path.join(home.home, "egress-template.toml");
    const pyagent = await readFile(path.join(builtinTemplatesDir(), "pyagent.toml"), "utf8");
    await writeFile(
      templateFile,
      `${pyagent}\n[egress]\ndefault = "allow"\ndeny_out = ["Denied.test", "${INTERNET_HOSTS.denied}"]\n`,
    );
    const egressTag = "pyagent-egress";
    await createSnapshot(home, { tag: egressTag, template: templateFile, templateFiles: true });
    const templatePolicy = {
      default: "allow",
      allowOut: [],
      denyOut: [INTERNET_HOSTS.denied, "denied.test"],
    };
    const info = await fetch(`http://127.0.0.1:${apiPort}/v1/snapshots/${egressTag}`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    assert.deepEqual(((await info.json()) as { egress_default: unknown }).egress_default, {
      egress: "allow",
      allow_out: [],
      deny_out: templatePolicy.denyOut,
    });

    const [plain] = await services.sandboxes.spawn({ snapshotTag: egressTag, n: 1, timeoutMs: 0 });
    const sb = plain as SandboxInfo;
    assert.deepEqual(sb.network.policy, templatePolicy);
    await services.sandboxes.eval(sb.id, FETCH_DEF);
    assert.match(
      await fetchIn(sb.id, "http://other.test/"),
      /^OK /,
      "the template allows what no entry names",
    );
    assert.match(await fetchIn(sb.id, "http://denied.test/"), /^ERR URLError/, "and denies its deny_out");
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.denied}/`, 4), /^ERR /);

    // An update leaves out deny_out: it keeps the template's. `{}` puts the sandbox back at the template's.
    const put = (body: unknown) =>
      fetch(`http://127.0.0.1:${apiPort}/v1/sandboxes/${sb.id}/network`, {
        method: "PUT",
        headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      }).then(async (r) => ({
        status: r.status,
        body: (await r.json()) as { network: { egress: unknown } },
      }));
    const denied = await put({ egress: "deny" });
    assert.equal(denied.status, 200, JSON.stringify(denied.body));
    assert.deepEqual(denied.body.network.egress, {
      egress: "deny",
      allow_out: [],
      deny_out: templatePolicy.denyOut,
    });
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.other}/`, 4), /^ERR /, "denied by the update");
    const reset = await put({});
    assert.deepEqual(reset.body.network.egress, {
      egress: "allow",
      allow_out: [],
      deny_out: templatePolicy.denyOut,
    });
    assert.match(await fetchIn(sb.id, `http://${INTERNET_HOSTS.other}/`), /^OK /, "the template's again");

    // A spawn that names a policy gets it, with the fields it leaves out from the template.
    const [explicit] = await services.sandboxes.spawn({
      snapshotTag: egressTag,
      n: 1,
      timeoutMs: 0,
      network: { allowOut: ["allowed.test"], denyOut: [] },
    });
    assert.deepEqual((explicit as SandboxInfo).network.policy, {
      default: "allow",
      allowOut: ["allowed.test"],
      denyOut: [],
    });
    await services.sandboxes.kill(sb.id);
    await services.sandboxes.kill((explicit as SandboxInfo).id);
    await services.snapshots.delete(egressTag);
  });

  it("never reaches a sibling, the daemon or the host, even under allow", async () => {
    const [a, b] = await services.sandboxes.spawn({
      snapshotTag: tag,
      n: 2,
      timeoutMs: 0,
      network: { default: "allow" },
    });
    const [sa, sb] = [a as SandboxInfo, b as SandboxInfo];
    await services.sandboxes.eval(sa.id, FETCH_DEF);
    await startServer(sb.id, "python3 -m http.server 8080 -d /tmp");
    await waitFor("the sibling's server", 60_000, async () => {
      const r = await fetch(`http://127.0.0.1:${apiPort}/v1/sandboxes/${sb.id}/ports/8080/`, {
        headers: { authorization: `Bearer ${TOKEN}` },
      }).catch(() => undefined);
      return r?.status === 200 ? true : undefined;
    });
    const config = resolveNetworkConfig({}, {}, home.home);
    const hostAddress = Object.values(os.networkInterfaces())
      .flat()
      .find((i) => i && i.family === "IPv4" && !i.internal && !i.address.startsWith("198.51.100."))?.address;
    assert.match(
      await fetchIn(sa.id, `http://${INTERNET_HOSTS.other}/`),
      /^OK /,
      "the internet is reachable",
    );
    for (const url of [
      `http://${sb.network.address}:8080/`,
      `http://${config.bridgeAddress}:${apiPort}/v1/network`,
      `http://${config.bridgeAddress}:${hostPort}/`,
      `http://${INTERNET_GATEWAY}:${hostPort}/`,
      ...(hostAddress
        ? [`http://${hostAddress}:${apiPort}/v1/network`, `http://${hostAddress}:${hostPort}/`]
        : []),
      `http://169.254.169.254/`,
    ]) {
      assert.match(await fetchIn(sa.id, url, 4), /^ERR /, url);
    }
    await services.sandboxes.kill(sa.id);
    await services.sandboxes.kill(sb.id);
  });

  it("20 children of one snapshot, same guest IP, fetch at once and each gets its own answer", async () => {
    const children = await services.sandboxes.spawn({
      snapshotTag: tag,
      n: 20,
      timeoutMs: 0,
      network: { allowOut: [`${INTERNET_HOSTS.other}/32`] },
    });
    assert.equal(new Set(children.map((c) => c.network.address)).size, 20, "distinct on the host side");
    assert.deepEqual(
      [...new Set(children.map((c) => c.network.guestAddress))],
      ["10.42.0.2"],
      "same in the guest",
    );
    const answers = await Promise.all(
      children.map(async (c) => {
        await services.sandboxes.eval(c.id, FETCH_DEF);
        return fetchIn(c.id, `http://${INTERNET_HOSTS.other}/echo/${c.id}`, 30);
      }),
    );
    for (const [i, c] of children.entries()) {
      assert.match(answers[i] as string, new RegExp(`"path":"/echo/${c.id}"`), c.id);
    }
    await services.sandboxes.killAll();
  });

  it("proxies HTTP and WebSocket to a server in the sandbox", async () => {
    const sb = await spawnOne();
    await services.sandboxes.files.write(sb.id, "/tmp/ws.py", Buffer.from(WS_ECHO));
    await services.sandboxes.files.write(sb.id, "/tmp/http_echo.py", Buffer.from(HTTP_ECHO));
    await startServer(sb.id, "python3 /tmp/http_echo.py 8080");
    await startServer(sb.id, "python3 /tmp/ws.py 8081");
    const auth = { authorization: `Bearer ${TOKEN}` };
    const base = `127.0.0.1:${apiPort}/v1/sandboxes/${sb.id}/ports`;
    const page = await waitFor("the guest's HTTP server", 60_000, async () => {
      const r = await fetch(`http://${base}/8080/hello.txt?x=1`, {
        method: "POST",
        headers: { ...auth, "x-app": "kept" },
        body: "posted body",
      }).catch(() => undefined);
      return r?.status === 200
        ? ((await r.json()) as { path: string; headers: Record<string, string>; body: string })
        : undefined;
    });
    assert.equal(page.path, "/hello.txt?x=1");
    assert.equal(page.body, "posted body");
    assert.equal(page.headers["x-app"], "kept");
    assert.equal(page.headers.authorization, undefined, "the daemon's token is not passed on to the guest");
    const closed = await fetch(`http://${base}/8099/`, { headers: auth });
    assert.equal(closed.status, 502, "nothing listens on 8099");
    assert.equal((await fetch(`http://${base}/8080/hello.txt`)).status, 401, "the proxy needs the token");
    const echoed = await waitFor("the guest's WebSocket server", 60_000, async () => {
      try {
        return await new Promise<string>((resolve, reject) => {
          const ws = new WebSocket(`ws://${base}/8081/`, { headers: auth });
          ws.once("open", () => ws.send("ping through the proxy"));
          ws.once("message", (data) => {
            resolve(String(data));
            ws.close();
          });
          ws.once("error", reject);
        });
      } catch {
        return undefined;
      }
    });
    assert.equal(echoed, "ping through the proxy");
    const unauthorized = await new Promise<number>((resolve) => {
      const ws = new WebSocket(`ws://${base}/8081/`);
      ws.once("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
      ws.once("error", () => resolve(-1));
    });
    assert.equal(unauthorized, 401);
    // A tunnel open when its sandbox goes is ended at once: its guest side could never finish closing.
    const open = new WebSocket(`ws://${base}/8081/`, { headers: auth });
    await new Promise((resolve, reject) => open.once("open", resolve).once("error", reject));
    const ended = new Promise<number>((resolve) => open.once("close", () => resolve(performance.now())));
    const killed = performance.now();
    await services.sandboxes.kill(sb.id);
    const closedAfter = (await Promise.race([ended, sleep(15_000).then(() => Number.NaN)])) - killed;
    assert.ok(closedAfter < 15_000, `the tunnel closed with its sandbox (after ${closedAfter} ms)`);
  });

  it("a daemon SIGKILLed mid-spawn leaves no namespace, veth or record after the restart", async () => {
    const crashHome = await tempHome("forkd-net-crash-");
    try {
      const crashTag = await linkSharedSnapshot(crashHome.home, "pyagent");
      const config = resolveNetworkConfig({}, {}, crashHome.home);
      const self = fileURLToPath(import.meta.url);
      const helper = path.join(path.dirname(self), "..", "support", `spawn-then-hang${path.extname(self)}`);
      const child = spawn(process.execPath, [...process.execArgv, helper, crashTag, "3"], {
        env: { ...process.env, FORKD_HOME: crashHome.home },
        stdio: ["ignore", "pipe", "inherit"],
      });
      // Killed once a sandbox's namespace exists, i.e. in the middle of its network setup or its restore.
      await waitFor("a sandbox namespace", 120_000, async () =>
        (await entries(`/sys/class/net/${config.bridge}/brif`)).length > 0 ? true : undefined,
      );
      child.kill("SIGKILL");
      await new Promise((r) => child.once("exit", r));
      const db = new StateDb(path.join(crashHome.home, "state.db"));
      const recorded = db.networks().map((r) => r.sandbox_id);
      db.close();
      assert.ok(recorded.length > 0, "the namespaces were recorded before they were created");
      const reopened = await openServices(crashHome);
      try {
        for (const id of recorded)
          assert.equal(await sandboxNetworkExists(id), false, `${id}'s network is gone`);
        assert.deepEqual(await entries(`/sys/class/net/${config.bridge}/brif`), [], "no veth on the bridge");
        const netns = (await readdir("/run/netns").catch(() => [] as string[])).filter((n) =>
          recorded.some((id) => n.endsWith(id)),
        );
        assert.deepEqual(netns, []);
        assert.deepEqual(await qemusMentioning(crashHome.home), [], "no QEMU left");
        const check = new StateDb(path.join(crashHome.home, "state.db"));
        assert.deepEqual(check.networks(), [], "no network record left");
        check.close();
        for (const row of reopened.sandboxes.list()) assert.equal(row.status, "dead");
        await reopened.sandboxes.killAll();
      } finally {
        await reopened.close({ killSandboxes: true });
      }
      const { stdout } = await run("ip", ["-o", "link", "show", "master", config.bridge]);
      assert.equal(stdout.trim(), "");
    } finally {
      await crashHome.cleanup();
    }
  });
});
