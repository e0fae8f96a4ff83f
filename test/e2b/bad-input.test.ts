/**
 * Malformed and refused E2B requests get the status and body E2B's SDK turns into its matching error class,
 * asserted through the real `e2b` / `@e2b/code-interpreter` packages over a real TCP listener. The services
 * behind the API are the test double (test/api/services-double.ts): these checks are about the HTTP contract
 * (validation, auth, routing, error shapes); the end-to-end behaviour is in sdk-e2e.test.ts on real VMs.
 */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, it } from "node:test";
import {
  AuthenticationError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from "@e2b/code-interpreter";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { ServicesDouble } from "../api/services-double.js";

const TOKEN = "e2b-bad-input-test-token-0123456789";
const UNKNOWN = "sb-00000000dead";

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
    const pause = await Sandbox.pause(sbx.sandboxId, opts).catch((e: unknown) => e);
    assert.ok(pause instanceof SandboxError && pause.statusCode === 501, `pause: ${pause}`);
    assert.match((pause as SandboxError).message, /not supported/);
    const lifecycle = await Sandbox.create("py", { ...opts, lifecycle: { onTimeout: "pause" } }).catch(
      (e: unknown) => e,
    );
    assert.ok(lifecycle instanceof SandboxError && lifecycle.statusCode === 501, `autoPause: ${lifecycle}`);
    const network = await Sandbox.create("py", { ...opts, allowInternetAccess: true }).catch(
      (e: unknown) => e,
    );
    assert.ok(network instanceof SandboxError && network.statusCode === 501, `network: ${network}`);
    const build = await raw("/v3/templates", { method: "POST", body: "{}" });
    assert.equal(build.status, 501);
  });

  it("the data plane refuses another sandbox's access token (AuthenticationError) and a missing one", async () => {
    const other = await Sandbox.create("py", opts);
    const tokenOf = (s: Sandbox) => s as unknown as { envdAccessToken: string };
    tokenOf(sbx).envdAccessToken = tokenOf(other).envdAccessToken;
    try {
      await assert.rejects(sbx.commands.list(), AuthenticationError);
      const code = await sbx.runCode("1").catch((e: unknown) => e);
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
    const code = await doomed.runCode("1").catch((e: unknown) => e);
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

  it("requests addressed to a sandbox never reach the forkd API; other ports are 502 naming the network", async () => {
    const forkd = await fetch(`${url}/v1/sandboxes`, {
      headers: {
        authorization: `Bearer ${TOKEN}`,
        "e2b-sandbox-id": sbx.sandboxId,
        "e2b-sandbox-port": "49983",
      },
    });
    assert.equal(
      forkd.status,
      401,
      "without the sandbox's token the data plane refuses; it is never the forkd list",
    );
    const port = await fetch(`${url}/`, {
      headers: { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8080" },
    });
    assert.equal(port.status, 502);
    assert.match(((await port.json()) as { message: string }).message, /no network/);
    const byHost = await new Promise<number | undefined>((resolve, reject) => {
      const request = http.get(
        `${url}/health`,
        { headers: { host: `49983-${sbx.sandboxId}.sandbox.test` } },
        (response) => {
          response.resume();
          resolve(response.statusCode);
        },
      );
      request.on("error", reject);
    });
    assert.equal(byHost, 204, "the host-name form reaches envd too");
  });
});
