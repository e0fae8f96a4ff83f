/**
 * Tenancy on a real daemon with real VMs, through the unmodified `e2b` SDK and the forkd REST API: two tenants'
 * tokens and an admin's in one token file. Alice's sandbox (and the fork of it) is invisible to Bob and answers
 * him 404 on get, exec, files, kill, fork and list, on both APIs; the admin sees both tenants' sandboxes.
 * The per-route contract without VMs is test/api/tenancy.test.ts.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { Sandbox, SandboxNotFoundError } from "e2b";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";

const ALICE = `alice-${randomBytes(16).toString("hex")}`;
const BOB = `bob-${randomBytes(16).toString("hex")}`;

describe("tenancy on a real daemon", { timeout: 15 * 60_000 }, () => {
  let daemon: TestDaemon;
  let alice: Sandbox;
  let bob: Sandbox;
  const opts = (apiKey: string) => ({ apiUrl: daemon.tcpUrl, sandboxUrl: daemon.tcpUrl, apiKey });

  before(async () => {
    daemon = await startDaemon(
      ["--default-snapshot", "shared-pyagent"],
      [`${ALICE} tenant=alice`, `# bob's team`, `${BOB} tenant=bob`],
    );
    alice = await Sandbox.create("base", { ...opts(ALICE), timeoutMs: 10 * 60_000 });
    bob = await Sandbox.create("base", { ...opts(BOB), timeoutMs: 10 * 60_000 });
  });

  after(async () => {
    if (daemon) {
      const log = daemon.log();
      await daemon.stop().catch((err: unknown) => {
        throw new Error(`${(err as Error).message}\ndaemon log:\n${log.slice(-4000)}`);
      });
    }
  });

  /** The forkd REST API with a tenant's (or the admin's) bearer token. */
  const forkd = async (token: string, method: string, route: string, body?: unknown) => {
    const response = await fetch(`${daemon.tcpUrl}${route}`, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body === undefined ? {} : { "content-type": "application/json" }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: response.status, text: await response.text() };
  };
  const e2bList = async (key: string) =>
    (await Sandbox.list(opts(key)).nextItems()).map((s) => s.sandboxId).sort();
  const forkdList = async (token: string) =>
    (JSON.parse((await forkd(token, "GET", "/v1/sandboxes")).text) as { id: string }[])
      .map((s) => s.id)
      .sort();

  it("Alice's sandbox works for Alice and is 404 to Bob on every call, E2B and forkd", async () => {
    await alice.files.write("/tmp/secret", "alice's");
    const ran = await alice.commands.run("cat /tmp/secret");
    assert.equal(ran.stdout, "alice's");
    const id = alice.sandboxId;

    // E2B control plane, through the SDK.
    await assert.rejects(Sandbox.connect(id, opts(BOB)), SandboxNotFoundError);
    await assert.rejects(Sandbox.getInfo(id, opts(BOB)), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(id, opts(BOB)), false);
    const fork = await fetch(`${daemon.tcpUrl}/sandboxes/${id}/fork`, {
      method: "POST",
      headers: { "x-api-key": BOB, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(fork.status, 404, await fork.text());
    assert.deepEqual(await e2bList(BOB), [bob.sandboxId]);

    // forkd REST, the same answers as for an id that does not exist.
    const unknown = "sb-00000000dead";
    for (const [method, route, body] of [
      ["GET", "/v1/sandboxes/:id"],
      ["POST", "/v1/sandboxes/:id/exec", { args: ["cat", "/tmp/secret"] }],
      ["GET", "/v1/sandboxes/:id/files?path=/tmp/secret"],
      ["POST", "/v1/sandboxes/:id/fork", { count: 1 }],
      ["DELETE", "/v1/sandboxes/:id"],
    ] as [string, string, unknown?][]) {
      const foreign = await forkd(BOB, method, route.replace(":id", id), body);
      const none = await forkd(BOB, method, route.replace(":id", unknown), body);
      assert.equal(foreign.status, 404, `${method} ${route}: ${foreign.text}`);
      assert.equal(foreign.text.replaceAll(id, unknown), none.text, `${method} ${route}`);
      assert.ok(!foreign.text.includes("alice"), foreign.text);
    }
    assert.deepEqual(await forkdList(BOB), [bob.sandboxId]);

    // Nothing Bob did reached it.
    assert.equal((await alice.commands.run("cat /tmp/secret")).stdout, "alice's");
    assert.equal((await Sandbox.getInfo(id, opts(ALICE))).sandboxId, id);
  });

  it("a signed URL on the shared sandbox URL reaches only the sandbox whose token signed it", async () => {
    // The SDK builds uploadUrl/downloadUrl on sandboxUrl: no sandbox id in them, the signature picks the sandbox.
    await bob.files.write("/tmp/secret", "bob's");
    const aliceUrl = await alice.downloadUrl("/tmp/secret", { useSignatureExpiration: 120 });
    const bobUrl = await bob.downloadUrl("/tmp/secret");
    for (const url of [aliceUrl, bobUrl]) {
      assert.ok(url.startsWith(daemon.tcpUrl) && url.includes("signature="), url);
      assert.ok(!url.includes(alice.sandboxId) && !url.includes(bob.sandboxId), url);
    }
    const read = async (url: string, headers: Record<string, string> = {}) => {
      const response = await fetch(url, { headers });
      return { status: response.status, text: await response.text() };
    };
    assert.deepEqual(await read(aliceUrl), { status: 200, text: "alice's" });
    assert.deepEqual(await read(bobUrl), { status: 200, text: "bob's" });

    // Alice's signature aimed at Bob's sandbox by name, or with Bob's key beside it: refused, nothing read.
    const aimed = await read(aliceUrl, { "e2b-sandbox-id": bob.sandboxId, "e2b-sandbox-port": "49983" });
    assert.equal(aimed.status, 401, aimed.text);
    assert.ok(!aimed.text.includes("bob's"), aimed.text);
    const withBobsKey = await read(aliceUrl, { "x-api-key": BOB });
    assert.deepEqual(withBobsKey, { status: 200, text: "alice's" });
    // A signature for one path does not open another.
    const other = new URL(aliceUrl);
    other.searchParams.set("path", "/etc/hostname");
    assert.equal((await read(other.toString())).status, 401);

    // Alice's signed upload lands in Alice's sandbox alone.
    const upload = await alice.uploadUrl("/tmp/signed-upload");
    const form = new FormData();
    form.append("file", new Blob(["uploaded by alice"]), "/tmp/signed-upload");
    const uploaded = await fetch(upload, { method: "POST", body: form });
    assert.equal(uploaded.status, 200, await uploaded.text());
    assert.equal(await alice.files.read("/tmp/signed-upload"), "uploaded by alice");
    assert.equal(await bob.files.exists("/tmp/signed-upload"), false);
    assert.equal((await bob.commands.run("cat /tmp/secret")).stdout, "bob's");
  });

  it("a fork of Alice's sandbox and its fork point are Alice's; the admin sees every tenant's", async () => {
    const forked = await fetch(`${daemon.tcpUrl}/sandboxes/${alice.sandboxId}/fork`, {
      method: "POST",
      headers: { "x-api-key": ALICE, "content-type": "application/json" },
      body: JSON.stringify({ count: 1, timeout: 600 }),
    });
    assert.equal(forked.status, 201);
    const [result] = (await forked.json()) as { sandbox?: { sandboxID: string } }[];
    const child = result?.sandbox?.sandboxID;
    assert.ok(child, JSON.stringify(result));
    const child$ = await Sandbox.connect(child, opts(ALICE));
    assert.equal((await child$.files.read("/tmp/secret")).toString(), "alice's");
    await assert.rejects(Sandbox.connect(child, opts(BOB)), SandboxNotFoundError);
    assert.deepEqual(await e2bList(ALICE), [alice.sandboxId, child].sort());

    // The fork point (a snapshot of Alice's sandbox's memory) is hers, nobody else's.
    const snapshots = async (token: string) =>
      (JSON.parse((await forkd(token, "GET", "/v1/snapshots")).text) as { tag: string }[]).map((s) => s.tag);
    const forkPoints = (await snapshots(ALICE)).filter((t) => t.startsWith("fork-"));
    assert.equal(forkPoints.length, 1, JSON.stringify(await snapshots(ALICE)));
    assert.deepEqual(await snapshots(BOB), ["shared-pyagent"]);
    const point = forkPoints[0] as string;
    assert.equal((await forkd(BOB, "POST", "/v1/sandboxes", { snapshot_tag: point })).status, 404);
    assert.ok((await snapshots(daemon.token)).includes(point));

    // The admin (the token without a tenant, and the Unix socket) sees every tenant's sandboxes.
    const everyone = [alice.sandboxId, bob.sandboxId, child].sort();
    assert.deepEqual(await e2bList(daemon.token), everyone);
    assert.deepEqual(await forkdList(daemon.token), everyone);
    assert.deepEqual((await daemon.controller.listSandboxes()).map((s) => s.id).sort(), everyone);
    assert.equal(await Sandbox.kill(child, opts(ALICE)), true);

    // Bob's kill-all kills his own sandbox only.
    const killAll = await forkd(BOB, "DELETE", "/v1/sandboxes?all=true");
    assert.equal(killAll.status, 200, killAll.text);
    assert.ok(killAll.text.includes(bob.sandboxId) && !killAll.text.includes(alice.sandboxId), killAll.text);
    assert.deepEqual(await forkdList(daemon.token), [alice.sandboxId]);
  });
});
