/**
 * Malformed and refused E2B requests get the status and body E2B's SDK turns into its matching error class,
 * asserted through the real `e2b` / `@e2b/code-interpreter` packages over a real TCP listener. The services
 * behind the API are the test double (test/api/services-double.ts): these checks are about the HTTP contract
 * (validation, auth, routing, error shapes, the translation of E2B's network options into forkd's); the
 * end-to-end behaviour is in sdk-e2e.test.ts on real VMs. The double's sandbox ports echo what reached them.
 */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, it } from "node:test";
import {
  ALL_TRAFFIC,
  AuthenticationError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from "@e2b/code-interpreter";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { send } from "../api/raw-http.js";
import { ServicesDouble } from "../api/services-double.js";

const TOKEN = "e2b-bad-input-test-token-0123456789";
const UNKNOWN = "sb-00000000dead";
const DOMAIN = "sandbox.test";

interface Echo {
  sandbox: string;
  port: number;
  method: string;
  url: string;
  headers: Record<string, string>;
}

/** A request with exactly these headers (Host too, which fetch does not allow to set); the body as text. */
async function request(
  url: string,
  options: { method?: string; headers?: Record<string, string> },
): Promise<{ status: number; body: string }> {
  const { hostname, port, pathname, search } = new URL(url);
  const response = await send(
    { host: hostname, port: Number(port) },
    options.method ?? "GET",
    pathname + search,
    {
      headers: options.headers,
    },
  );
  return { status: response.status, body: response.text };
}

// biome-ignore lint/suspicious/noTemplateCurlyInString: E2B's literal placeholder for the port.
const MASK = "app-${PORT}.internal";
const upgradeHeaders = { connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13" };

describe("E2B API: bad input, through the SDK's error classes", () => {
  let app: FastifyInstance;
  let url: string;
  let opts: { apiUrl: string; sandboxUrl: string; apiKey: string };
  let sbx: Sandbox;
  const double = new ServicesDouble();

  before(async () => {
    app = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [tokenFromString(TOKEN)],
      origin: { bindHost: "127.0.0.1", allowedHosts: [`*.${DOMAIN}`] },
    });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const address = app.server.address();
    if (address === null || typeof address === "string") throw new Error("no TCP address");
    url = `http://127.0.0.1:${address.port}`;
    opts = { apiUrl: url, sandboxUrl: url, apiKey: TOKEN };
    sbx = await Sandbox.create("py", opts);
  });

  after(async () => {
    await app?.close();
  });

  const raw = (path: string, init: RequestInit = {}) =>
    fetch(`${url}${path}`, {
      ...init,
      headers: { "x-api-key": TOKEN, "content-type": "application/json", ...init.headers },
    });

  it("a missing or wrong API key is 401 {code, message}: AuthenticationError", async () => {
    const missing = await fetch(`${url}/v2/sandboxes`, { method: "POST", body: "{}" });
    assert.equal(missing.status, 401);
    assert.deepEqual(Object.keys((await missing.json()) as object).sort(), ["code", "message"]);
    await assert.rejects(
      Sandbox.create("py", { ...opts, apiKey: "wrong-key-of-enough-length" }),
      AuthenticationError,
    );
    await assert.rejects(
      Sandbox.list({ ...opts, apiKey: "wrong-key-of-enough-length" }).nextItems(),
      AuthenticationError,
    );
  });

  it("bad JSON and wrong types are 400 naming the problem", async () => {
    const bad = await raw("/v2/sandboxes", { method: "POST", body: "{not json" });
    assert.equal(bad.status, 400);
    const body = (await bad.json()) as { code: number; message: string };
    assert.equal(body.code, 400);
    assert.match(body.message, /malformed JSON/);
    const typed = await raw("/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: 7 }) });
    assert.equal(typed.status, 400);
    assert.match(((await typed.json()) as { message: string }).message, /templateID/);
    const timeout = await Sandbox.create("py", { ...opts, timeoutMs: -5000 }).catch((e: unknown) => e);
    assert.ok(timeout instanceof SandboxError && timeout.statusCode === 400, `negative timeout: ${timeout}`);
    const metadata = await Sandbox.create("py", {
      ...opts,
      metadata: { n: 5 as unknown as string },
    }).catch((e: unknown) => e);
    assert.ok(
      metadata instanceof SandboxError && metadata.statusCode === 400,
      `non-string metadata: ${metadata}`,
    );
  });

  it("an unknown sandbox is 404: SandboxNotFoundError (kill answers false)", async () => {
    for (const id of [UNKNOWN, "not-even-an-id"]) {
      await assert.rejects(Sandbox.getInfo(id, opts), SandboxNotFoundError);
      await assert.rejects(Sandbox.setTimeout(id, 60_000, opts), SandboxNotFoundError);
      await assert.rejects(Sandbox.connect(id, opts), SandboxNotFoundError);
      await assert.rejects(Sandbox.fork(id, { ...opts, count: 1 }), SandboxNotFoundError);
      await assert.rejects(Sandbox.getMetrics(id, opts), SandboxNotFoundError);
      assert.equal(await Sandbox.kill(id, opts), false);
    }
  });

  it("an unknown template is 404 (the SDK's create raises SandboxError with statusCode 404)", async () => {
    const err = await Sandbox.create("no-such-template", opts).catch((e: unknown) => e);
    assert.ok(err instanceof SandboxError, `${err}`);
    assert.equal(err.statusCode, 404);
    const unusable = await Sandbox.create("bad template name!", opts).catch((e: unknown) => e);
    assert.ok(unusable instanceof SandboxError && unusable.statusCode === 404, `${unusable}`);
  });

  it("a fork count out of range is 400 before anything is attempted", async () => {
    for (const count of [0, 1001, 2.5]) {
      const err = await Sandbox.fork(sbx.sandboxId, { ...opts, count }).catch((e: unknown) => e);
      assert.ok(err instanceof SandboxError && err.statusCode === 400, `count ${count}: ${err}`);
    }
  });

  it("features forkd does not have yet are refused by name, never faked", async () => {
    // A filesystem-only pause is supported (pause-e2e.test.ts); a filesystem-only snapshot (a template that
    // cold-boots its sandboxes) is not.
    const snapshot = await raw(`/sandboxes/${sbx.sandboxId}/snapshots`, {
      method: "POST",
      body: JSON.stringify({ memory: false }),
    });
    assert.equal(snapshot.status, 501, "a filesystem-only snapshot is refused, not taken with memory");
    const rules = await Sandbox.create("py", {
      ...opts,
      network: { allowOut: ["api.example.com"], denyOut: [ALL_TRAFFIC], rules: { "api.example.com": [{}] } },
    }).catch((e: unknown) => e);
    assert.ok(rules instanceof SandboxError && rules.statusCode === 501, `network.rules: ${rules}`);
    assert.match((rules as SandboxError).message, /network\.rules/);
    const proxy = await Sandbox.create("py", {
      ...opts,
      network: { egressProxy: { address: "proxy.example.com:1080" } },
    }).catch((e: unknown) => e);
    assert.ok(proxy instanceof SandboxError && proxy.statusCode === 501, `network.egressProxy: ${proxy}`);
    assert.equal(
      await sbx
        .updateNetwork({ rules: { "a.example": [{}] } })
        .catch((e: unknown) => (e as SandboxError).statusCode),
      501,
    );
    const secrets = await raw("/secrets", { method: "GET" });
    assert.equal(secrets.status, 501);
    // Template builds are served: a build request without a name is E2B's 400, not 501.
    const build = await raw("/v3/templates", { method: "POST", body: "{}" });
    assert.equal(build.status, 400);
    assert.match(((await build.json()) as { message: string }).message, /name is required/);
  });

  it("the data plane refuses another sandbox's access token (AuthenticationError) and a missing one", async () => {
    const other = await Sandbox.create("py", opts);
    const tokenOf = (s: Sandbox) => s as unknown as { envdAccessToken: string };
    tokenOf(sbx).envdAccessToken = tokenOf(other).envdAccessToken;
    try {
      await assert.rejects(sbx.commands.list(), AuthenticationError);
      // A short request timeout: the SDK leaves its timer running when the request is refused (its runCode clears
      // it only on success), and the default 60 s one kept this file's process alive a minute after its tests.
      const code = await sbx.runCode("1", { requestTimeoutMs: 2_000 }).catch((e: unknown) => e);
      assert.ok(code instanceof SandboxError && /401/.test(code.message), `runCode: ${code}`);
    } finally {
      tokenOf(sbx).envdAccessToken = `envd-${sbx.sandboxId}`;
    }
    const bare = await fetch(`${url}/files?path=/etc/passwd`, {
      headers: { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "49983" },
    });
    assert.equal(bare.status, 401);
  });

  it("a sandbox that is gone is E2B's 502: isRunning() false, TimeoutError, SandboxNotFoundError", async () => {
    const doomed = await Sandbox.create("py", opts);
    assert.equal(await doomed.isRunning(), true);
    assert.equal(await Sandbox.kill(doomed.sandboxId, opts), true);
    assert.equal(await doomed.isRunning(), false);
    await assert.rejects(doomed.files.read("/etc/passwd"), TimeoutError);
    await assert.rejects(doomed.commands.run("true"), SandboxNotFoundError);
    const code = await doomed.runCode("1", { requestTimeoutMs: 2_000 }).catch((e: unknown) => e);
    assert.ok(code instanceof TimeoutError, `runCode on a gone sandbox: ${code}`);
  });

  it("an unknown Connect method is Connect's unimplemented; a path with NUL is 400", async () => {
    const headers = {
      "e2b-sandbox-id": sbx.sandboxId,
      "e2b-sandbox-port": "49983",
      "x-access-token": `envd-${sbx.sandboxId}`,
      "content-type": "application/json",
      "connect-protocol-version": "1",
    };
    const rpc = await fetch(`${url}/process.Process/Teleport`, { method: "POST", headers, body: "{}" });
    assert.equal(rpc.status, 404);
    assert.equal(((await rpc.json()) as { code: string }).code, "unimplemented");
    const nul = await fetch(`${url}/files?path=%00`, { headers });
    assert.equal(nul.status, 400);
  });

  it("signed file URLs open /files without the token, only for their path, operation and lifetime", async () => {
    const id = sbx.sandboxId;
    double.filesByPath.set(
      `${id}:/etc/passwd`,
      Buffer.from("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"),
    );
    double.filesByPath.set(`${id}:/home/user/signed.txt`, Buffer.from("signed content"));
    double.filesByPath.set(`${id}:/home/user/other.txt`, Buffer.from("other"));
    // With E2B_SANDBOX_URL a signed URL names no sandbox: it is used with the host-name form.
    const get = (signed: string, replacePath?: string) => {
      const target = new URL(signed);
      if (replacePath) target.searchParams.set("path", replacePath);
      return new Promise<{ status: number | undefined; body: string }>((resolve, reject) => {
        http
          .get(
            `${url}${target.pathname}${target.search}`,
            { headers: { host: `49983-${id}.sandbox.test` } },
            (res) => {
              let body = "";
              res.on("data", (c) => {
                body += c;
              });
              res.on("end", () => resolve({ status: res.statusCode, body }));
            },
          )
          .on("error", reject);
      });
    };
    const fresh = await sbx.downloadUrl("/home/user/signed.txt", { useSignatureExpiration: 60 });
    assert.deepEqual(await get(fresh), { status: 200, body: "signed content" });
    assert.equal((await get(fresh, "/home/user/other.txt")).status, 401, "a signature is for its own path");
    const forged = new URL(fresh);
    forged.searchParams.set("signature", "v1_forged");
    assert.equal((await get(forged.toString())).status, 401);
    const expired = await sbx.downloadUrl("/home/user/signed.txt", { useSignatureExpiration: -10 });
    assert.match((await get(expired)).body, /expired/);
    const forWriting = await sbx.uploadUrl("/home/user/signed.txt");
    assert.equal((await get(forWriting)).status, 401, "an upload signature does not open a download");
  });

  it("create's network options become forkd's egress policy and inbound settings, as E2B defines them", async () => {
    const created = async (options: Parameters<typeof Sandbox.create>[1]) => {
      const sandbox = await Sandbox.create("py", { ...opts, ...options });
      return { sandbox, spawn: double.lastSpawn };
    };
    const plain = await created({});
    assert.equal(plain.spawn?.network, undefined, "no network option: the daemon's --egress");
    assert.deepEqual(plain.spawn?.inbound, { requireTrafficToken: false, hostHeader: null, httpsPorts: [] });
    const plainInfo = await plain.sandbox.getInfo();
    assert.equal(plainInfo.allowInternetAccess, true);
    assert.deepEqual(plainInfo.network, {
      allowOut: [],
      denyOut: [],
      allowPublicTraffic: true,
      maskRequestHost: undefined,
      httpsPorts: undefined,
      rules: undefined,
      egressProxy: undefined,
    });

    const offline = await created({ allowInternetAccess: false });
    assert.deepEqual(offline.spawn?.network, { default: "deny" });
    const offlineInfo = await offline.sandbox.getInfo();
    assert.equal(offlineInfo.allowInternetAccess, false);
    assert.deepEqual(offlineInfo.network?.denyOut, [ALL_TRAFFIC]);
    assert.equal(
      (await created({ allowInternetAccess: true })).spawn?.network,
      undefined,
      "allowInternetAccess: true (what older Python SDKs always send) is the default: it never widens --egress deny",
    );
    const allowList = await created({
      network: {
        allowOut: ["pypi.org", "*.pythonhosted.org", "1.1.1.1"],
        denyOut: ({ allTraffic }) => [allTraffic],
      },
    });
    assert.deepEqual(allowList.spawn?.network, {
      default: "deny",
      allowOut: ["pypi.org", "*.pythonhosted.org", "1.1.1.1"],
      denyOut: [ALL_TRAFFIC],
    });
    // The newest SDKs' dnsServers: allowed with a domain in allowOut (E2B's rule); an IPv4 address only.
    const withDns = await raw("/v2/sandboxes", {
      method: "POST",
      body: JSON.stringify({
        templateID: "py",
        network: { allowOut: ["pypi.org"], denyOut: [ALL_TRAFFIC], dnsServers: ["192.0.2.53"] },
      }),
    });
    assert.equal(withDns.status, 201);
    assert.deepEqual(double.lastSpawn?.network, {
      default: "deny",
      allowOut: ["pypi.org", "192.0.2.53"],
      denyOut: [ALL_TRAFFIC],
    });
    const badDns = await raw("/v2/sandboxes", {
      method: "POST",
      body: JSON.stringify({
        templateID: "py",
        network: { allowOut: ["pypi.org"], denyOut: [ALL_TRAFFIC], dnsServers: ["dns.example"] },
      }),
    });
    assert.equal(badDns.status, 400);
    assert.match(((await badDns.json()) as { message: string }).message, /dnsServers.*IPv4/);
    assert.deepEqual((await allowList.sandbox.getInfo()).network?.allowOut, [
      "*.pythonhosted.org",
      "1.1.1.1",
      "pypi.org",
    ]);
    assert.deepEqual(
      (await created({ allowInternetAccess: false, network: { allowOut: ["pypi.org"] } })).spawn?.network,
      { default: "deny", allowOut: ["pypi.org"] },
      "allowInternetAccess: false denies what allowOut does not name, as ALL_TRAFFIC does",
    );
    const denyList = await created({ network: { denyOut: ["10.0.0.0/8"] } });
    assert.deepEqual(
      denyList.spawn?.network,
      { denyOut: ["10.0.0.0/8"] },
      "a deny list narrows the default (the template's, else the daemon's): it never turns egress on",
    );
    assert.deepEqual((await denyList.sandbox.getInfo()).network?.denyOut, ["10.0.0.0/8"]);

    const inbound = await created({
      network: { allowPublicTraffic: false, maskRequestHost: MASK, httpsPorts: [8443] },
    });
    assert.deepEqual(inbound.spawn?.inbound, {
      requireTrafficToken: true,
      hostHeader: MASK,
      httpsPorts: [8443],
    });
    const inboundInfo = await inbound.sandbox.getInfo();
    assert.equal(inboundInfo.network?.allowPublicTraffic, false);
    assert.equal(inboundInfo.network?.maskRequestHost, MASK);
    assert.deepEqual(inboundInfo.network?.httpsPorts, [8443]);

    const refused = async (options: Parameters<typeof Sandbox.create>[1], pattern: RegExp) => {
      const err = await Sandbox.create("py", { ...opts, ...options }).catch((e: unknown) => e);
      assert.ok(err instanceof SandboxError && err.statusCode === 400, `${JSON.stringify(options)}: ${err}`);
      assert.match(err.message, pattern);
    };
    await refused({ network: { allowOut: ["pypi.org"] } }, /ALL_TRAFFIC/);
    await refused({ network: { allowOut: ["2001:db8::1"], denyOut: [ALL_TRAFFIC] } }, /IPv6/);
    await refused({ network: { denyOut: ["10.0.0.300/8"] } }, /not an IPv4 address or CIDR/);
    await refused({ network: { maskRequestHost: "evil\r\nx-injected: 1" } }, /host\[:port\]/);
    await refused({ network: { httpsPorts: [49983] } }, /served by the daemon/);
  });

  it("updateNetwork replaces the egress policy (a field left out is cleared); unknown sandboxes are 404", async () => {
    await sbx.updateNetwork({ allowOut: ["allowed.example"], denyOut: [ALL_TRAFFIC] });
    assert.deepEqual(double.lastNetworkPolicy, {
      default: "deny",
      allowOut: ["allowed.example"],
      denyOut: [ALL_TRAFFIC],
    });
    assert.deepEqual((await sbx.getInfo()).network?.allowOut, ["allowed.example"]);
    await sbx.updateNetwork({ allowInternetAccess: false });
    assert.deepEqual(double.lastNetworkPolicy, { default: "deny", allowOut: [], denyOut: [] });
    await sbx.updateNetwork({});
    assert.deepEqual(double.lastNetworkPolicy, {}, "nothing said: the daemon's default");
    await sbx.updateNetwork({ allowInternetAccess: false });
    await sbx.updateNetwork({ allowInternetAccess: true });
    assert.deepEqual(
      double.lastNetworkPolicy,
      {},
      "allowInternetAccess: true is the default again, no wider",
    );
    await sbx.updateNetwork({ denyOut: ["10.0.0.0/8"] });
    assert.deepEqual(double.lastNetworkPolicy, { allowOut: [], denyOut: ["10.0.0.0/8"] });
    assert.equal((await sbx.getInfo()).allowInternetAccess, true);
    const bad = await sbx.updateNetwork({ denyOut: ["not a host!"] }).catch((e: unknown) => e);
    assert.ok(bad instanceof SandboxError && bad.statusCode === 400, `${bad}`);
    await assert.rejects(Sandbox.updateNetwork(UNKNOWN, {}, opts), SandboxNotFoundError);
  });

  it("a sandbox the forkd API spawns with public_ports false needs its traffic token on the E2B data plane", async () => {
    const spawn = async (body: Record<string, unknown>) => {
      const answer = await send(
        { host: "127.0.0.1", port: Number(new URL(url).port) },
        "POST",
        "/v1/sandboxes",
        { json: { snapshot_tag: "py", ...body }, headers: { authorization: `Bearer ${TOKEN}` } },
      );
      assert.equal(answer.status, 201, answer.text);
      return answer.json<{ id: string; public_ports: boolean }[]>()[0] as {
        id: string;
        public_ports: boolean;
      };
    };
    const port = (id: string, extra: Record<string, string> = {}) =>
      request(`${url}/`, { headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8080", ...extra } });
    const closed = await spawn({ public_ports: false });
    assert.equal(closed.public_ports, false);
    const refused = await port(closed.id);
    assert.equal(refused.status, 403, refused.body);
    assert.match(refused.body, /does not allow public traffic/);
    assert.equal((await port(closed.id, { "e2b-traffic-access-token": `traffic-${closed.id}` })).status, 200);
    const open = await spawn({});
    assert.equal(open.public_ports, true, "public by default, as E2B's");
    assert.equal((await port(open.id)).status, 200);
    // --e2b-private-traffic: every sandbox's ports, the forkd API's public ones included.
    const strict = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [tokenFromString(TOKEN)],
      origin: { bindHost: "127.0.0.1" },
      e2b: { privateTraffic: true },
    });
    try {
      await strict.listen({ host: "127.0.0.1", port: 0 });
      const address = strict.server.address() as { port: number };
      const viaStrict = await request(`http://127.0.0.1:${address.port}/`, {
        headers: { "e2b-sandbox-id": open.id, "e2b-sandbox-port": "8080" },
      });
      assert.equal(viaStrict.status, 403, viaStrict.body);
    } finally {
      await strict.close();
    }
  });

  it("other ports are proxied to the guest: by header and by host name, no path reaches the daemon's API", async () => {
    const byHeader = await request(`${url}/v1/sandboxes?x=1`, {
      headers: {
        "e2b-sandbox-id": sbx.sandboxId,
        "e2b-sandbox-port": "8080",
        authorization: `Bearer ${TOKEN}`,
        "x-api-key": TOKEN,
        "x-app-header": "kept",
        "x-access-token": "the-sandbox-envd-token",
        cookie: "forkd-console=a-console-session; app=kept; __Host-forkd-console=another",
      },
    });
    assert.equal(byHeader.status, 200, byHeader.body);
    const echoed = JSON.parse(byHeader.body) as Echo;
    assert.equal(echoed.sandbox, sbx.sandboxId);
    assert.equal(echoed.port, 8080);
    assert.equal(echoed.url, "/v1/sandboxes?x=1", "a forkd API path is only a path in the guest");
    assert.equal(echoed.headers["x-app-header"], "kept");
    assert.equal(echoed.headers.authorization, undefined, "a daemon token never reaches a guest");
    assert.equal(echoed.headers["x-api-key"], undefined);
    assert.equal(echoed.headers["x-access-token"], undefined, "nor the sandbox's envd token");
    assert.equal(echoed.headers.cookie, "app=kept", "the console's session cookie never reaches a guest");
    const ownAuth = await request(`${url}/`, {
      headers: {
        "e2b-sandbox-id": sbx.sandboxId,
        "e2b-sandbox-port": "8080",
        authorization: "Bearer app-own",
      },
    });
    assert.equal((JSON.parse(ownAuth.body) as Echo).headers.authorization, "Bearer app-own");

    const byHost = await request(`${url}/v2/sandboxes`, {
      method: "POST",
      headers: { host: `3000-${sbx.sandboxId}.${DOMAIN}`, "x-api-key": TOKEN },
    });
    assert.equal(byHost.status, 200, byHost.body);
    assert.deepEqual(
      [(JSON.parse(byHost.body) as Echo).port, (JSON.parse(byHost.body) as Echo).url],
      [3000, "/v2/sandboxes"],
      "a control-plane path addressed to a sandbox is the sandbox's",
    );

    const noPort = await request(`${url}/`, {
      headers: { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "http" },
    });
    assert.equal(noPort.status, 400);
    assert.match((JSON.parse(noPort.body) as { message: string }).message, /E2b-Sandbox-Port/);
    const gone = await request(`${url}/`, {
      headers: { "e2b-sandbox-id": UNKNOWN, "e2b-sandbox-port": "8080" },
    });
    assert.equal(gone.status, 502);

    const isolated = await Sandbox.create("py", opts);
    (double.sandboxesById.get(isolated.sandboxId) as { network: { kind: string } }).network.kind = "private";
    const unreachable = await request(`${url}/`, {
      headers: { "e2b-sandbox-id": isolated.sandboxId, "e2b-sandbox-port": "8080" },
    });
    assert.equal(unreachable.status, 502);
    assert.match(
      (JSON.parse(unreachable.body) as { message: string }).message,
      /no network the daemon can reach \(it was spawned with network "none"\)/,
    );
  });

  it("a sandbox without public traffic answers only its own traffic token (403 otherwise), also for upgrades", async () => {
    const closed = await Sandbox.create("py", { ...opts, network: { allowPublicTraffic: false } });
    const other = await Sandbox.create("py", { ...opts, network: { allowPublicTraffic: false } });
    const tokenOf = (s: Sandbox) => (s as unknown as { trafficAccessToken: string }).trafficAccessToken;
    const to = (token?: string, extra: Record<string, string> = {}) =>
      request(`${url}/index.html`, {
        headers: {
          "e2b-sandbox-id": closed.sandboxId,
          "e2b-sandbox-port": "8080",
          ...(token === undefined ? {} : { "e2b-traffic-access-token": token }),
          ...extra,
        },
      });
    const missing = await to();
    assert.equal(missing.status, 403);
    assert.match((JSON.parse(missing.body) as { message: string }).message, /E2B-Traffic-Access-Token/);
    assert.equal((await to("wrong-token")).status, 403);
    assert.equal((await to(tokenOf(other))).status, 403, "another sandbox's token does not open this one");
    assert.equal(
      (await to(undefined, { "x-access-token": `envd-${closed.sandboxId}` })).status,
      403,
      "the envd token is not a traffic token",
    );
    const allowed = await to(tokenOf(closed));
    assert.equal(allowed.status, 200, allowed.body);
    assert.equal(
      (JSON.parse(allowed.body) as Echo).headers["e2b-traffic-access-token"],
      undefined,
      "the token is the proxy's, not the guest's",
    );

    const upgrade = (headers: Record<string, string>, path = "/ws") =>
      request(`${url}${path}`, {
        headers: { ...upgradeHeaders, "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", ...headers },
      });
    const wsMissing = await upgrade({ "e2b-sandbox-id": closed.sandboxId, "e2b-sandbox-port": "8080" });
    assert.equal(wsMissing.status, 403);
    assert.match(wsMissing.body, /"code":403/, "E2B's error body");
    const wsOther = await upgrade({
      "e2b-sandbox-id": closed.sandboxId,
      "e2b-sandbox-port": "8080",
      "e2b-traffic-access-token": tokenOf(other),
    });
    assert.equal(wsOther.status, 403);
    const wsOk = await upgrade({
      host: `8080-${closed.sandboxId}.${DOMAIN}`,
      "e2b-traffic-access-token": tokenOf(closed),
      authorization: `Bearer ${TOKEN}`,
    });
    assert.equal(wsOk.status, 200, wsOk.body);
    const upgraded = JSON.parse(wsOk.body) as Echo;
    assert.deepEqual([upgraded.sandbox, upgraded.port, upgraded.url], [closed.sandboxId, 8080, "/ws"]);
    assert.equal(upgraded.headers.authorization, undefined);
    assert.equal(upgraded.headers["e2b-traffic-access-token"], undefined);

    // The forkd port route's path with E2B headers is the named sandbox's path, never the forkd route.
    const disguised = await upgrade(
      { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8080", authorization: `Bearer ${TOKEN}` },
      `/v1/sandboxes/${closed.sandboxId}/ports/8080/`,
    );
    assert.equal(disguised.status, 200, disguised.body);
    assert.equal((JSON.parse(disguised.body) as Echo).sandbox, sbx.sandboxId);
    const envdUpgrade = await upgrade({ "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "49983" });
    assert.equal(envdUpgrade.status, 404);
    // The listener's Host/Origin check comes first, for upgrades to sandboxes too.
    const rebound = await upgrade({
      host: `8080-${closed.sandboxId}.attacker.example`,
      "e2b-traffic-access-token": tokenOf(closed),
    });
    assert.equal(rebound.status, 403);
    const crossSite = await upgrade({
      host: `8080-${closed.sandboxId}.${DOMAIN}`,
      "e2b-traffic-access-token": tokenOf(closed),
      origin: "https://attacker.example",
    });
    assert.equal(crossSite.status, 403);
    assert.match(crossSite.body, /cross-origin/);
  });

  it("pages served from a sandbox's port cannot call the daemon's API or the control plane", async () => {
    // The listener's own scheme and port, as a sandbox page served through this listener has.
    const origin = `http://8080-${sbx.sandboxId}.${DOMAIN}:${new URL(url).port}`;
    const forkd = await request(`${url}/v1/sandboxes`, {
      headers: { authorization: `Bearer ${TOKEN}`, origin },
    });
    assert.equal(forkd.status, 403);
    assert.match(forkd.body, /sandbox's page/);
    const control = await request(`${url}/v2/sandboxes`, { headers: { "x-api-key": TOKEN, origin } });
    assert.equal(control.status, 403);
    const forkdUpgrade = await request(`${url}/v1/sandboxes/${sbx.sandboxId}/ports/8080/`, {
      headers: {
        ...upgradeHeaders,
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        authorization: `Bearer ${TOKEN}`,
        origin,
      },
    });
    assert.equal(forkdUpgrade.status, 403);
    const toSandbox = await request(`${url}/`, {
      headers: { host: `8080-${sbx.sandboxId}.${DOMAIN}`, origin },
    });
    assert.equal(toSandbox.status, 200, "the data plane serves them, as E2B's does");
    const rebinding = await request(`${url}/`, {
      headers: { host: `8080-${sbx.sandboxId}.attacker.example` },
    });
    assert.equal(rebinding.status, 403, "a sandbox host name under another domain is not this listener's");
  });

  it("a daemon serving no public sandbox traffic (--e2b-private-traffic) makes every sandbox need its token", async () => {
    const strict = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [tokenFromString(TOKEN)],
      e2b: { privateTraffic: true },
    });
    try {
      await strict.listen({ host: "127.0.0.1", port: 0 });
      const address = strict.server.address() as { port: number };
      const strictUrl = `http://127.0.0.1:${address.port}`;
      const strictOpts = { apiUrl: strictUrl, sandboxUrl: strictUrl, apiKey: TOKEN };
      const sandbox = await Sandbox.create("py", strictOpts);
      assert.equal(double.lastSpawn?.inbound?.requireTrafficToken, true);
      assert.equal((await sandbox.getInfo()).network?.allowPublicTraffic, false);
      const headers = { "e2b-sandbox-id": sandbox.sandboxId, "e2b-sandbox-port": "8080" };
      assert.equal((await request(`${strictUrl}/`, { headers })).status, 403);
      const token = (sandbox as unknown as { trafficAccessToken: string }).trafficAccessToken;
      assert.equal(
        (await request(`${strictUrl}/`, { headers: { ...headers, "e2b-traffic-access-token": token } }))
          .status,
        200,
      );
      const askedPublic = await Sandbox.create("py", {
        ...strictOpts,
        network: { allowPublicTraffic: true },
      }).catch((e: unknown) => e);
      assert.ok(askedPublic instanceof SandboxError && askedPublic.statusCode === 403, `${askedPublic}`);
      assert.match(askedPublic.message, /--e2b-private-traffic/);
    } finally {
      await strict.close();
    }
  });
});
