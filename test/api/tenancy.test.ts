/**
 * Tenancy over the HTTP contract: two tenants' tokens and an admin's on one real TCP listener, the forkd REST API
 * through fetch and the E2B control plane through the real `e2b` SDK. The services behind the API are the test
 * double (test/api/services-double.ts), which records owners as the real services do; what is tested here is
 * the scope every route goes through (controller/tenancy): another tenant's sandboxes and snapshots answer
 * exactly what an unknown one answers, and never appear in lists. Real VMs: test/e2b/tenancy-e2e.test.ts.
 */
import assert from "node:assert/strict";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { Sandbox, SandboxNotFoundError } from "e2b";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { loadTokenFile } from "../../src/api/auth.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { limitTenants } from "../../src/controller/tenancy/tenant-view.js";
import { packageRoot } from "../../src/image/package-root.js";
import { send } from "./raw-http.js";
import { ServicesDouble } from "./services-double.js";

const ADMIN = "tenancy-test-admin-token-0123456789";
const ALICE = "tenancy-test-alice-token-0123456789";
const BOB = "tenancy-test-bob-token-000123456789";
const UNKNOWN = "sb-00000000dead";

describe("token files with tenants", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-tenancy-tokens-"));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const file = async (name: string, text: string, mode = 0o600) => {
    const p = path.join(dir, name);
    await writeFile(p, text, { mode });
    await chmod(p, mode);
    return p;
  };

  it("reads admin lines, tenant lines, comments and blank lines", async () => {
    const tokens = await loadTokenFile(
      await file("ok", `# admin\n${ADMIN}\n\n${ALICE} tenant=alice\n  ${BOB}\ttenant=bob-2_x  \n`),
    );
    assert.deepEqual(
      tokens.map((t) => t.tenant),
      [null, "alice", "bob-2_x"],
    );
    assert.match(tokens[1]?.id ?? "", /^token:[0-9a-f]{8}:alice$/);
    assert.ok(!(tokens[1]?.id ?? "").includes(ALICE), "the audit id never contains the token");
  });

  it("refuses bad tenant names, anything else after the token, and one token with two scopes", async () => {
    for (const [line, why] of [
      [`${ALICE} tenant=Alice`, /invalid tenant "Alice"/],
      [`${ALICE} tenant=`, /invalid tenant ""/],
      [`${ALICE} tenant=../x`, /invalid tenant/],
      [`${ALICE} tenant=${"a".repeat(64)}`, /invalid tenant/],
      [`${ALICE} team=alice`, /expected "<token>" or "<token> tenant=<name>"/],
      [`${ALICE} tenant=a tenant=b`, /expected/],
    ] as const) {
      await assert.rejects(loadTokenFile(await file("bad", `${line}\n`)), why, line);
    }
    await assert.rejects(
      loadTokenFile(await file("dup", `${ALICE} tenant=alice\n${ALICE}\n`)),
      /one token .* with two different scopes/,
    );
    // The same line twice is harmless (old files may have that).
    assert.equal((await loadTokenFile(await file("twice", `${ADMIN}\n${ADMIN}\n`))).length, 2);
  });

  it("keeps the owner and mode checks", async () => {
    await assert.rejects(loadTokenFile(await file("open", `${ALICE} tenant=alice\n`, 0o640)), /chmod 600/);
  });
});

describe("tenancy over the forkd API and the E2B control plane", () => {
  let app: FastifyInstance;
  let url: string;
  let port: number;
  const double = new ServicesDouble();
  // An admin's snapshot BRANCHed from its own sandbox: not a shared template.
  double.addSnapshot("admin-branch", { source_sandbox: "sb-0000000000aa" });
  double.addSnapshot("admin-fork-point", { ephemeral: true });

  before(async () => {
    app = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [
        tokenFromString(ADMIN),
        tokenFromString(ALICE, "t", "alice"),
        tokenFromString(BOB, "t", "bob"),
      ],
      origin: { bindHost: "127.0.0.1" },
    });
    await app.listen({ host: "127.0.0.1", port: 0 });
    const address = app.server.address();
    if (address === null || typeof address === "string") throw new Error("no TCP address");
    port = address.port;
    url = `http://127.0.0.1:${port}`;
  });
  after(async () => {
    await app?.close();
  });

  const call = async (token: string, method: string, route: string, body?: unknown) => {
    const response = await fetch(`${url}${route}`, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body === undefined ? {} : { "content-type": "application/json" }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    const isJson = response.headers.get("content-type")?.startsWith("application/json") === true;
    return { status: response.status, text, json: isJson ? (JSON.parse(text) as unknown) : undefined };
  };
  const spawn = async (token: string, tag = "py") => {
    const r = await call(token, "POST", "/v1/sandboxes", { snapshot_tag: tag });
    assert.equal(r.status, 201, r.text);
    return (r.json as { id: string }[])[0]?.id as string;
  };
  const ids = async (token: string) =>
    ((await call(token, "GET", "/v1/sandboxes")).json as { id: string }[]).map((s) => s.id);
  const tags = async (token: string) =>
    ((await call(token, "GET", "/v1/snapshots")).json as { tag: string }[]).map((s) => s.tag);

  /** `route` (with `:ID`) answers for the foreign id exactly what it answers for an id that does not exist. */
  const assertLikeUnknown = async (
    token: string,
    method: string,
    route: string,
    id: string,
    body?: unknown,
  ) => {
    const foreign = await call(token, method, route.replace(":ID", id), body);
    const unknown = await call(token, method, route.replace(":ID", UNKNOWN), body);
    assert.equal(foreign.status, 404, `${method} ${route}: ${foreign.text}`);
    assert.equal(foreign.text.replaceAll(id, UNKNOWN), unknown.text, `${method} ${route}`);
  };

  it("a tenant's sandbox is 404 to another tenant on every sandbox route, like an unknown id", async () => {
    const a = await spawn(ALICE);
    double.filesByPath.set(`${a}:/etc/secret`, Buffer.from("alice's"));
    for (const [method, route, body] of [
      ["GET", "/v1/sandboxes/:ID"],
      ["DELETE", "/v1/sandboxes/:ID"],
      ["POST", "/v1/sandboxes/:ID/timeout", { timeout_ms: 1000 }],
      ["POST", "/v1/sandboxes/:ID/ping"],
      ["POST", "/v1/sandboxes/:ID/exec", { args: ["echo", "hi"] }],
      ["POST", "/v1/sandboxes/:ID/eval", { code: "1" }],
      ["POST", "/v1/sandboxes/:ID/branch", { tag: "stolen" }],
      ["POST", "/v1/sandboxes/:ID/fork", { count: 1 }],
      ["GET", "/v1/sandboxes/:ID/metrics"],
      ["PUT", "/v1/sandboxes/:ID/network", { egress: "deny" }],
      ["GET", "/v1/sandboxes/:ID/files?path=/etc/secret"],
      ["DELETE", "/v1/sandboxes/:ID/files?path=/etc/secret"],
      ["GET", "/v1/sandboxes/:ID/files/list?path=/etc"],
      ["GET", "/v1/sandboxes/:ID/files/stat?path=/etc/secret"],
      ["GET", "/v1/sandboxes/:ID/ports/8080/"],
      ["GET", "/v1/sandboxes/:ID/console"],
      ["GET", "/v1/sandboxes/:ID/usage"],
      ["POST", "/v1/sandboxes/:ID/pause"],
      ["POST", "/v1/sandboxes/:ID/resume"],
    ] as [string, string, unknown?][]) {
      await assertLikeUnknown(BOB, method, route, a, body);
    }
    // Writes and streams, whose bodies are not JSON.
    const put = await fetch(`${url}/v1/sandboxes/${a}/files?path=/etc/secret`, {
      method: "PUT",
      headers: { authorization: `Bearer ${BOB}`, "content-type": "application/octet-stream" },
      body: "bob's",
    });
    assert.equal(put.status, 404);
    const stream = await fetch(`${url}/v1/sandboxes/${a}/exec/stream`, {
      method: "POST",
      headers: { authorization: `Bearer ${BOB}`, "content-type": "application/x-ndjson" },
      body: `${JSON.stringify({ args: ["cat"] })}\n`,
    });
    assert.equal(stream.status, 404);
    // A WebSocket upgrade to its port route.
    const upgrade = await send({ host: "127.0.0.1", port }, "GET", `/v1/sandboxes/${a}/ports/8080/`, {
      headers: {
        authorization: `Bearer ${BOB}`,
        connection: "Upgrade",
        upgrade: "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
      },
    });
    assert.equal(upgrade.status, 404, upgrade.text);
    // Nothing of Bob's reached it: the sandbox and its file are as Alice left them.
    assert.equal(double.filesByPath.get(`${a}:/etc/secret`)?.toString(), "alice's");
    assert.equal((await call(ALICE, "GET", `/v1/sandboxes/${a}`)).status, 200);
    const mine = await call(ALICE, "GET", `/v1/sandboxes/${a}/files?path=/etc/secret`);
    assert.equal(mine.text, "alice's");
  });

  it("lists and kill-all see only the caller's sandboxes; an admin sees and kills everyone's", async () => {
    const a = await spawn(ALICE);
    const b = await spawn(BOB);
    const admin = await spawn(ADMIN);
    assert.ok((await ids(ALICE)).includes(a));
    assert.ok(!(await ids(ALICE)).includes(b) && !(await ids(ALICE)).includes(admin));
    assert.ok(!(await ids(BOB)).includes(a) && (await ids(BOB)).includes(b));
    const all = await ids(ADMIN);
    assert.ok(all.includes(a) && all.includes(b) && all.includes(admin));
    // The admin sees whose each one is; a tenant sees its own name on its own.
    const owners = (await call(ADMIN, "GET", "/v1/sandboxes")).json as { id: string; owner: string | null }[];
    assert.deepEqual(
      [a, b, admin].map((id) => owners.find((s) => s.id === id)?.owner),
      ["alice", "bob", null],
    );
    assert.equal(((await call(ALICE, "GET", `/v1/sandboxes/${a}`)).json as { owner: string }).owner, "alice");
    const killed = await call(BOB, "DELETE", "/v1/sandboxes?all=true");
    assert.equal(killed.status, 200, killed.text);
    assert.ok(!killed.text.includes(a) && killed.text.includes(b), killed.text);
    assert.ok(double.sandboxesById.has(a) && double.sandboxesById.has(admin) && !double.sandboxesById.has(b));
    assert.equal((await call(ADMIN, "DELETE", `/v1/sandboxes/${a}`)).status, 204);
  });

  it("snapshots: a tenant's are its own, the admin's templates are shared read-only, the rest invisible", async () => {
    const created = await call(ALICE, "POST", "/v1/snapshots", { tag: "alice-snap", template: "python" });
    assert.equal(created.status, 201, created.text);
    assert.equal(double.snapshotsByTag.get("alice-snap")?.owner, "alice");
    // Alice sees hers and the shared template; nobody but the admin sees the admin's branch or fork point.
    assert.deepEqual((await tags(ALICE)).sort(), ["alice-snap", "py"]);
    assert.deepEqual(await tags(BOB), ["py"]);
    assert.ok((await tags(ADMIN)).includes("alice-snap") && (await tags(ADMIN)).includes("admin-branch"));
    for (const tag of ["alice-snap", "admin-branch", "admin-fork-point"]) {
      const unknown = (route: string) => route.replace(tag, "no-such-tag");
      for (const [method, route, body] of [
        ["GET", `/v1/snapshots/${tag}`],
        ["GET", `/v1/snapshots/${tag}/info`],
        ["DELETE", `/v1/snapshots/${tag}`],
        ["POST", `/v1/snapshots/${tag}/compact`, { to: "bob-flat" }],
        ["POST", `/v1/snapshots/${tag}/diff`, { tag: "bob-diff", exec: "true" }],
        ["GET", `/v1/snapshots/${tag}/pack`],
      ] as [string, string, unknown?][]) {
        const foreign = await call(BOB, method, route, body);
        const none = await call(BOB, method, unknown(route), body);
        assert.equal(foreign.status, 404, `${method} ${route}: ${foreign.text}`);
        assert.equal(foreign.text.replaceAll(tag, "no-such-tag"), none.text, `${method} ${route}`);
      }
      const spawned = await call(BOB, "POST", "/v1/sandboxes", { snapshot_tag: tag });
      const spawnedNone = await call(BOB, "POST", "/v1/sandboxes", { snapshot_tag: "no-such-tag" });
      assert.equal(spawned.status, 404, spawned.text);
      assert.equal(spawned.text.replaceAll(tag, "no-such-tag"), spawnedNone.text);
    }
    // Bob may spawn from the shared template, not change it.
    const fromShared = await spawn(BOB, "py");
    assert.equal(double.sandboxesById.get(fromShared)?.owner, "bob");
    const del = await call(BOB, "DELETE", "/v1/snapshots/py");
    assert.equal(del.status, 403, del.text);
    assert.ok(double.snapshotsByTag.has("py"));
    // Alice's own snapshot works for her, and what she compacts from it is hers.
    assert.equal((await spawn(ALICE, "alice-snap")).length > 0, true);
    const flat = await call(ALICE, "POST", "/v1/snapshots/alice-snap/compact", { to: "alice-flat" });
    assert.equal(flat.status, 200, flat.text);
    assert.equal(double.snapshotsByTag.get("alice-flat")?.owner, "alice");
    // Snapshot-diff's sandbox and snapshot are the caller's.
    const diff = await call(ALICE, "POST", "/v1/snapshots/py/diff", { tag: "alice-diff", exec: "true" });
    assert.equal(diff.status, 201, diff.text);
    assert.equal(double.lastSnapshotDiff?.owner, "alice");
    // Unpacking installs into the daemon's shared store: admins only.
    const unpack = await fetch(`${url}/v1/snapshots/unpack`, {
      method: "POST",
      headers: { authorization: `Bearer ${ALICE}`, "content-type": "application/octet-stream" },
      body: "pack",
    });
    assert.equal(unpack.status, 403);
  });

  it("a snapshot's detail names only dependents the caller may see", async () => {
    double.addSnapshot("bob-child", { parent_tag: "py", owner: "bob" });
    const forAlice = (await call(ALICE, "GET", "/v1/snapshots/py/info")).json as { dependents: string[] };
    assert.ok(!forAlice.dependents.includes("bob-child"), JSON.stringify(forAlice));
    const forBob = (await call(BOB, "GET", "/v1/snapshots/py/info")).json as { dependents: string[] };
    assert.ok(forBob.dependents.includes("bob-child"));
    const forAdmin = (await call(ADMIN, "GET", "/v1/snapshots/py/info")).json as { dependents: string[] };
    assert.ok(forAdmin.dependents.includes("bob-child"));
  });

  it("template aliases: per owner, another's is not found, a taken name is only 'taken'", async () => {
    assert.equal(
      (await call(ALICE, "PUT", "/v1/template-aliases/alice-agent", { tag: "alice-snap" })).status,
      200,
    );
    assert.equal((await call(ADMIN, "PUT", "/v1/template-aliases/shared-py", { tag: "py" })).status, 200);
    assert.equal(
      (await call(ADMIN, "PUT", "/v1/template-aliases/admin-only", { tag: "admin-branch" })).status,
      200,
    );
    const names = async (token: string) =>
      ((await call(token, "GET", "/v1/template-aliases")).json as { alias: string }[]).map((a) => a.alias);
    assert.deepEqual((await names(BOB)).sort(), ["shared-py"]);
    assert.deepEqual((await names(ALICE)).sort(), ["alice-agent", "shared-py"]);
    assert.equal((await call(BOB, "GET", "/v1/template-aliases/alice-agent")).status, 404);
    assert.equal((await call(BOB, "GET", "/v1/template-aliases/admin-only")).status, 404);
    assert.equal((await call(BOB, "DELETE", "/v1/template-aliases/alice-agent")).status, 404);
    // Bob cannot point Alice's name at his own snapshot (nor at hers).
    const taken = await call(BOB, "PUT", "/v1/template-aliases/alice-agent", { tag: "py" });
    assert.equal(taken.status, 409, taken.text);
    assert.ok(!taken.text.includes("alice-snap"), taken.text);
    assert.equal((await call(BOB, "PUT", "/v1/template-aliases/bob-x", { tag: "alice-snap" })).status, 404);
    assert.equal((await call(BOB, "DELETE", "/v1/template-aliases/shared-py")).status, 403);
    assert.equal(double.aliasesByName.get("alice-agent")?.tag, "alice-snap");
    // Resolving Alice's alias name is, for Bob, a name that does not exist (E2B resolves names: see below).
    const alias = await call(BOB, "GET", "/v1/template-aliases/alice-agent");
    const none = await call(BOB, "GET", "/v1/template-aliases/no-such-alias");
    assert.equal(alias.text.replaceAll("alice-agent", "no-such-alias"), none.text);
    // The snapshot's alias list is scrubbed the same way.
    const py = (await call(BOB, "GET", "/v1/snapshots/py")).json as { aliases?: string[] };
    assert.ok(!(py.aliases ?? []).includes("alice-agent"));
  });

  it("v0.5 workspaces are an admin's: a tenant lists none, any name is 404, create is 403", async () => {
    assert.deepEqual(JSON.parse((await call(BOB, "GET", "/v1/workspaces")).text), []);
    const created = await call(BOB, "POST", "/v1/workspaces", { name: "bobs", snapshot_tag: "py" });
    assert.equal(created.status, 403, created.text);
    for (const [method, route] of [
      ["GET", "/v1/workspaces/anyname"],
      ["DELETE", "/v1/workspaces/anyname"],
      ["POST", "/v1/workspaces/anyname/suspend"],
      ["POST", "/v1/workspaces/anyname/resume"],
    ] as [string, string][]) {
      assert.equal((await call(BOB, method, route)).status, 404, `${method} ${route}`);
    }
  });

  it("/metrics, which names every sandbox, is for admins", async () => {
    assert.equal((await call(ALICE, "GET", "/metrics")).status, 403);
    const admin = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${ADMIN}` } });
    assert.equal(admin.status, 200);
  });

  it("/v1/host is for admins; /v1/usage lists only the caller's sandboxes", async () => {
    const a = await spawn(ALICE);
    const b = await spawn(BOB);
    const host = await call(ALICE, "GET", "/v1/host");
    assert.equal(host.status, 403, host.text);
    assert.equal((host.json as { code: string }).code, "forbidden");
    assert.equal((await call(ADMIN, "GET", "/v1/host")).status, 200);
    const usage = async (token: string, query = "") =>
      ((await call(token, "GET", `/v1/usage${query}`)).json as { sandboxes: { id: string }[] }).sandboxes.map(
        (u) => u.id,
      );
    const bobs = await usage(BOB);
    assert.ok(bobs.includes(b) && !bobs.includes(a), JSON.stringify(bobs));
    assert.deepEqual(await usage(BOB, `?id=${a}&id=${b}`), [b]);
    const all = await usage(ADMIN);
    assert.ok(all.includes(a) && all.includes(b), JSON.stringify(all));
  });

  it("E2B control plane through the SDK: another tenant's sandbox is SandboxNotFoundError everywhere", async () => {
    const opts = (apiKey: string) => ({ apiUrl: url, sandboxUrl: url, apiKey });
    const alice = await Sandbox.create("py", opts(ALICE));
    const bobs = await Sandbox.create("py", opts(BOB));
    const id = alice.sandboxId;
    await assert.rejects(Sandbox.connect(id, opts(BOB)), SandboxNotFoundError);
    await assert.rejects(Sandbox.getInfo(id, opts(BOB)), SandboxNotFoundError);
    await assert.rejects(Sandbox.setTimeout(id, 60_000, opts(BOB)), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(id, opts(BOB)), false);
    const listed = async (key: string) => (await Sandbox.list(opts(key)).nextItems()).map((s) => s.sandboxId);
    assert.ok(!(await listed(BOB)).includes(id) && (await listed(BOB)).includes(bobs.sandboxId));
    const forAdmin = await listed(ADMIN);
    assert.ok(forAdmin.includes(id) && forAdmin.includes(bobs.sandboxId));
    // Raw routes the SDK has no call for answer E2B's 404 body, the same as for an unknown id.
    for (const route of ["/sandboxes/:ID/fork", "/sandboxes/:ID/snapshots", "/sandboxes/:ID/metrics"]) {
      const ask = (sandboxId: string) =>
        fetch(`${url}${route.replace(":ID", sandboxId)}`, {
          method: route.endsWith("metrics") ? "GET" : "POST",
          headers: { "x-api-key": BOB, "content-type": "application/json" },
          body: route.endsWith("metrics") ? undefined : "{}",
        });
      const foreign = await ask(id);
      const unknown = await ask(UNKNOWN);
      assert.equal(foreign.status, 404, route);
      assert.equal((await foreign.text()).replaceAll(id, UNKNOWN), await unknown.text(), route);
    }
    const many = await fetch(`${url}/sandboxes/metrics?sandbox_ids=${id},${bobs.sandboxId}`, {
      headers: { "x-api-key": BOB },
    });
    assert.ok(!(await many.text()).includes(id));
    // The data plane needs the sandbox's own secret, which only its owner was given: Bob's does not open it.
    const envd = await fetch(`${url}/files?path=/etc/hostname`, {
      headers: {
        "e2b-sandbox-id": id,
        "e2b-sandbox-port": "49983",
        "x-access-token": `envd-${bobs.sandboxId}`,
      },
    });
    assert.equal(envd.status, 401);
    // Templates: Alice's snapshot is not Bob's to list, see or delete.
    const templates = await fetch(`${url}/templates`, { headers: { "x-api-key": BOB } });
    assert.ok(!(await templates.text()).includes("alice-snap"));
    const exists = await fetch(`${url}/templates/aliases/alice-agent`, { headers: { "x-api-key": BOB } });
    assert.equal(exists.status, 404);
    const del = await fetch(`${url}/templates/alice-snap`, {
      method: "DELETE",
      headers: { "x-api-key": BOB },
    });
    assert.equal(del.status, 404);
    assert.ok(double.snapshotsByTag.has("alice-snap"));
    await assert.rejects(Sandbox.create("alice-agent", opts(BOB)));
    // Alice's own calls still work.
    assert.equal((await Sandbox.getInfo(id, opts(ALICE))).sandboxId, id);
    assert.equal(await Sandbox.kill(id, opts(ALICE)), true);
  });

  it("the MCP server, run with a tenant's token, sees what that tenant sees", async () => {
    const a = await spawn(ALICE);
    double.filesByPath.set(`${a}:/etc/secret`, Buffer.from("alice's"));
    const client = new Client({ name: "tenancy-test", version: "1" });
    await client.connect(
      new StdioClientTransport({
        command: process.execPath,
        args: [path.join(packageRoot(), "bin", "forkd-mcp.js")],
        env: { ...(process.env as Record<string, string>), FORKD_URL: url, FORKD_TOKEN: BOB },
      }),
    );
    try {
      const text = (answer: Awaited<ReturnType<Client["callTool"]>>) =>
        (answer.content as { text: string }[])[0]?.text ?? "";
      const read = await client.callTool({
        name: "read_file",
        arguments: { sandbox_id: a, path: "/etc/secret" },
      });
      assert.equal(read.isError, true, text(read));
      assert.match(text(read), /not found/);
      assert.ok(!text(read).includes("alice's"), text(read));
      const snapshots = await client.callTool({ name: "list_snapshots", arguments: {} });
      assert.notEqual(snapshots.isError, true, text(snapshots));
      assert.match(text(snapshots), /"py"/);
      assert.ok(!text(snapshots).includes("alice-snap"), text(snapshots));
      const killed = await client.callTool({ name: "kill_sandbox", arguments: { sandbox_id: a } });
      assert.equal(killed.isError, true, text(killed));
      assert.ok(double.sandboxesById.has(a));
    } finally {
      await client.close();
    }
  });
});

describe("--tenant-max-sandboxes", () => {
  it("refuses a tenant's spawn beyond its limit with 429, counts concurrent spawns, and never limits admins", async () => {
    const double = new ServicesDouble();
    limitTenants(double.sandboxes, { maxSandboxes: 3 });
    const app = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [
        tokenFromString(ADMIN),
        tokenFromString(ALICE, "t", "alice"),
        tokenFromString(BOB, "t", "bob"),
      ],
      origin: { bindHost: "127.0.0.1" },
    });
    try {
      await app.listen({ host: "127.0.0.1", port: 0 });
      const address = app.server.address();
      if (address === null || typeof address === "string") throw new Error("no TCP address");
      const spawn = (token: string, n: number) =>
        fetch(`http://127.0.0.1:${address.port}/v1/sandboxes`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify({ snapshot_tag: "py", n }),
        });
      // Two spawns at once that fit only one after the other: at most one of them is admitted.
      const both = await Promise.all([spawn(ALICE, 2), spawn(ALICE, 2)]);
      assert.deepEqual(both.map((r) => r.status).sort(), [201, 429]);
      const refused = both.find((r) => r.status === 429) as Response;
      assert.match(
        ((await refused.json()) as { error: string }).error,
        /limit of 3 \(--tenant-max-sandboxes\)/,
      );
      assert.equal((await spawn(ALICE, 1)).status, 201);
      assert.equal((await spawn(ALICE, 1)).status, 429);
      // Another tenant has its own count; an admin has none.
      assert.equal((await spawn(BOB, 3)).status, 201);
      assert.equal((await spawn(ADMIN, 5)).status, 201);
      // A killed sandbox frees its place.
      const alices = [...double.sandboxesById.values()].filter((s) => s.owner === "alice");
      assert.equal(alices.length, 3);
      double.sandboxesById.delete((alices[0] as { id: string }).id);
      assert.equal((await spawn(ALICE, 1)).status, 201);
    } finally {
      await app.close();
    }
  });
});
