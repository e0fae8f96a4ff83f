/**
 * Every route a real daemon registers, walked with another tenant's ids: the forkd API (its v0.5 routes among
 * them), the E2B control plane and data plane, the console, and every tool of the MCP server run with a tenant's
 * token. The routes are not listed here: they come from the running daemon itself (RunningDaemon.routes, from
 * Fastify's onRoute) and the tools from the MCP server's tools/list, so a route or tool added tomorrow that
 * forgets the caller's view fails this test.
 *
 * Alice (a tenant) has a running sandbox (created through E2B, private traffic), a file and an env var in it, a
 * snapshot BRANCHed from it and a template alias; the admin has a v0.5 workspace. Bob (another tenant) calls each
 * route twice: with those ids, and with ids that do not exist. What he gets must be the same answer (once Alice's
 * ids are read as the unknown ones), must never contain what he did not send (her file, her env var, her tokens,
 * the workspace's sandbox), and a route that names a sandbox, snapshot, alias or workspace in its path must reach
 * the lookup (404 for the unknown one, so the request was well formed). On the data plane his own sandbox's tokens
 * must open nothing of Alice's. Real VMs.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import http from "node:http";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { RegisteredRoute } from "../../src/api/app.js";
import { type RunningDaemon, startDaemon } from "../../src/api/daemon.js";
import { consoleExtension } from "../../src/console/index.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { packageRoot } from "../../src/image/package-root.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const root = process.getuid?.() === 0;
const ADMIN = `admin-${randomBytes(16).toString("hex")}`;
const ALICE = `alice-${randomBytes(16).toString("hex")}`;
const BOB = `bob-${randomBytes(16).toString("hex")}`;
const SECRET_FILE = `alice-file-${randomBytes(8).toString("hex")}`;
const SECRET_ENV = `alice-env-${randomBytes(8).toString("hex")}`;

/** Alice's (and the admin's) names, each with a name of the same kind that does not exist. */
interface Foreign {
  sandbox: string;
  snapshot: string;
  alias: string;
  workspace: string;
  workspaceSandbox: string;
  tokens: { envd: string; traffic: string };
}
const UNKNOWN = {
  sandbox: "sb-00000000dead",
  snapshot: "walk-no-such-snapshot",
  alias: "walk-no-such-alias",
  workspace: "walk-no-such-workspace",
};

/** A route answered with a documented answer other than "as if it did not exist". */
const NAME_CLAIMS: Record<string, string> = {
  // Names are one namespace per daemon: another tenant's alias is "taken" (409), and nothing else of it shows.
  "PUT /v1/template-aliases/:alias": "409",
};
/**
 * Routes that make something new with ids of their own (E2B's POST /v3/templates: a template or build id per
 * call): the two answers differ by those ids, so only their status is compared (and neither may leak).
 */
const FRESH_IDS = new Set(["POST /v3/templates"]);
/**
 * Routes a signed URL authorizes instead of a token (a template file's upload URL): without the daemon's
 * signature every caller gets 403, whoever's ids the path names.
 */
const SIGNED = new Set(["PUT /templates/:templateID/files/:hash"]);
/** Data-plane routes anyone may call (E2B's isRunning() probes /health); everything else wants the token. */
const OPEN_DATA_PLANE = new Set(["GET /health", "HEAD /health"]);

interface Answer {
  status: number;
  text: string;
}

describe("every registered route and MCP tool, with another tenant's ids", {
  timeout: 30 * 60_000,
  skip: !root && "needs root",
}, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Awaited<ReturnType<typeof openServices>>;
  let daemon: RunningDaemon;
  let url: string;
  let port: number;
  let routes: RegisteredRoute[];
  let tag: string;
  let alice: Foreign;
  let secrets: string[];

  const call = (method: string, route: string, token: string, body?: unknown) =>
    ask(port, method, route, {
      headers: { authorization: `Bearer ${token}` },
      timeoutMs: SETUP_TIMEOUT_MS,
      ...(body === undefined ? {} : { json: body }),
    });
  const json = async <T>(method: string, route: string, token: string, body?: unknown): Promise<T> => {
    const answer = await call(method, route, token, body);
    assert.ok(answer.status < 300, `${method} ${route}: ${answer.status} ${answer.text}`);
    return JSON.parse(answer.text) as T;
  };
  const metricCount = async (series: RegExp) =>
    Number(series.exec((await call("GET", "/metrics", ADMIN)).text)?.[1] ?? 0);

  before(async () => {
    home = await tempHome("forkd-route-tenancy-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    services = await openServices(home, { defaultSnapshot: tag });
    const tokenFile = path.join(home.home, "tokens");
    await writeFile(tokenFile, `${ADMIN}\n${ALICE} tenant=alice\n${BOB} tenant=bob\n`, { mode: 0o600 });
    daemon = await startDaemon(
      {
        socketPath: null,
        bind: "127.0.0.1:0",
        tokenFile,
        auditLog: null,
        snapshotsDir: home.snapshots,
        extensions: [consoleExtension()],
      },
      { ...services, close: async () => {} },
    );
    url = daemon.urls[0] as string;
    port = Number(new URL(url).port);
    routes = daemon.routes(url);

    // Alice's sandbox through E2B (ports private), with a file and an env var of hers.
    const spawnsBefore = await metricCount(SPAWNS_OK);
    const created = await ask(port, "POST", "/sandboxes", {
      headers: { "x-api-key": ALICE },
      timeoutMs: SETUP_TIMEOUT_MS,
      json: {
        templateID: tag,
        timeout: 1800,
        envVars: { SECRET: SECRET_ENV },
        network: { allowPublicTraffic: false },
      },
    });
    assert.equal(created.status, 201, created.text);
    const sandbox = JSON.parse(created.text) as {
      sandboxID: string;
      envdAccessToken: string;
      trafficAccessToken: string;
    };
    // The E2B create is timed in the same metrics as the forkd API's spawns (the controller's spawn observer).
    assert.equal(await metricCount(SPAWNS_OK), spawnsBefore + 1);
    assert.ok((await metricCount(SANDBOXES_READY)) >= 1);
    const id = sandbox.sandboxID;
    const put = await ask(port, "PUT", `/v1/sandboxes/${id}/files?path=/tmp/secret`, {
      headers: { authorization: `Bearer ${ALICE}`, "content-type": "application/octet-stream" },
      timeoutMs: SETUP_TIMEOUT_MS,
      body: SECRET_FILE,
    });
    assert.equal(put.status, 200, put.text);
    const branched = await json<{ tag: string }>("POST", `/v1/sandboxes/${id}/branch`, ALICE, {
      tag: "alice-snapshot",
      mode: "diff",
    });
    await json("PUT", "/v1/template-aliases/alice-agent", ALICE, { tag: branched.tag });
    // The admin's v0.5 workspace: workspaces are an admin's, no tenant sees any.
    const workspace = await json<{ live_sandbox_id: string }>("POST", "/v1/workspaces", ADMIN, {
      name: "admin-workspace",
      snapshot_tag: tag,
    });
    alice = {
      sandbox: id,
      snapshot: branched.tag,
      alias: "alice-agent",
      workspace: "admin-workspace",
      workspaceSandbox: workspace.live_sandbox_id,
      tokens: { envd: sandbox.envdAccessToken, traffic: sandbox.trafficAccessToken },
    };
    // What Bob never sends (his requests name Alice's ids, and answers may echo those: the comparison with
    // unknown ids covers them).
    secrets = [alice.workspaceSandbox, alice.tokens.envd, alice.tokens.traffic, SECRET_FILE, SECRET_ENV];
  });

  after(async () => {
    await daemon?.stop("test over");
    await services?.close({ killSandboxes: true });
    const left = home ? await qemusMentioning(home.home) : [];
    await home?.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  /** Alice's answer read as an unknown id's: each of her names replaced by the unknown one of its kind. */
  const asUnknown = (text: string) =>
    text
      .replaceAll(alice.sandbox, UNKNOWN.sandbox)
      .replaceAll(alice.snapshot, UNKNOWN.snapshot)
      .replaceAll(alice.alias, UNKNOWN.alias)
      .replaceAll(alice.workspace, UNKNOWN.workspace);
  const leaks = (text: string) => secrets.filter((secret) => text.includes(secret));

  it("the daemon registers the surfaces this test walks", () => {
    const has = (method: string, url: string, surface?: string) =>
      routes.some((r) => r.method === method && r.url === url && r.surface === surface);
    assert.ok(has("GET", "/v1/sandboxes/:id"), "forkd");
    assert.ok(has("POST", "/v1/workspaces"), "v0.5");
    assert.ok(has("POST", "/sandboxes/:sandboxID/fork"), "E2B control plane");
    assert.ok(has("POST", "/process.Process/Start", "envd"), "envd");
    assert.ok(has("POST", "/execute", "interpreter"), "code interpreter");
    assert.ok(has("GET", "/*", "port"), "ports");
    assert.ok(has("GET", "/console/api/events"), "console");
    assert.ok(routes.length > 300, `${routes.length} routes`);
  });

  it("the forkd API, v0.5's routes, the E2B control plane and the console: as if Alice's ids did not exist", async () => {
    const failures: string[] = [];
    let walked = 0;
    for (const route of routes.filter((r) => r.surface === undefined)) {
      const e2b = isE2bControl(route.url);
      const auth: Record<string, string> = e2b ? { "x-api-key": BOB } : { authorization: `Bearer ${BOB}` };
      const foreign = await ask(port, route.method, ...requestFor(route, namesOf(alice), auth));
      const control = await ask(port, route.method, ...requestFor(route, UNKNOWN, auth));
      walked++;
      const where = `${route.method} ${route.url}`;
      if (foreign.status === 0 || control.status === 0)
        failures.push(`${where}: ${foreign.text || control.text}`);
      const leaked = leaks(foreign.text);
      if (leaked.length > 0)
        failures.push(`${where}: Bob's answer names ${leaked.join(", ")}: ${foreign.text.slice(0, 300)}`);
      const claim = NAME_CLAIMS[where];
      if (claim !== undefined) {
        if (String(foreign.status) !== claim)
          failures.push(`${where}: ${foreign.status} (expected ${claim}) ${foreign.text}`);
        continue;
      }
      if (FRESH_IDS.has(where)) {
        if (foreign.status !== control.status)
          failures.push(
            `${where}: Alice's ids answer ${foreign.status}; unknown ids answer ${control.status}`,
          );
        continue;
      }
      if (foreign.status !== control.status || asUnknown(foreign.text) !== control.text) {
        failures.push(
          `${where}: Alice's ids answer ${foreign.status} ${foreign.text.slice(0, 300)}; ` +
            `unknown ids answer ${control.status} ${control.text.slice(0, 300)}`,
        );
      }
      if (SIGNED.has(where)) {
        if (control.status !== 403) failures.push(`${where}: unsigned, ${control.status}, not 403`);
      } else if (namesSomething(route.url) && control.status !== 404) {
        failures.push(
          `${where}: an unknown id answers ${control.status}, not 404: ${control.text.slice(0, 300)}`,
        );
      }
    }
    assert.deepEqual(failures, []);
    assert.ok(walked > 200, `walked ${walked} routes`);
    await assertAliceIntact();
  });

  it("what Bob reads without naming anything does not change when others' sandboxes do", async () => {
    // Counts and load of the whole daemon are others' activity too (/v1/host): a route that showed them to a
    // tenant would answer differently once the admin's workspace is paused.
    const unnamed = routes.filter(
      (r) => r.surface === undefined && r.method === "GET" && !r.url.includes(":"),
    );
    const read = async () => {
      const answers = new Map<string, string>();
      for (const route of unnamed) {
        const auth: Record<string, string> = isE2bControl(route.url)
          ? { "x-api-key": BOB }
          : { authorization: `Bearer ${BOB}` };
        const answer = await ask(port, route.method, ...requestFor(route, namesOf(alice), auth));
        answers.set(route.url, `${answer.status} ${answer.text}`);
      }
      return answers;
    };
    const before = await read();
    await json("POST", `/v1/workspaces/${alice.workspace}/suspend`, ADMIN);
    const paused = await read();
    await json("POST", `/v1/workspaces/${alice.workspace}/resume`, ADMIN);
    const changed = [...before].filter(([url, answer]) => paused.get(url) !== answer).map(([url]) => url);
    assert.deepEqual(changed, [], "answers that changed when the admin's workspace was paused");
    assert.ok(unnamed.length > 20, `${unnamed.length} routes`);
    await assertAliceIntact();
  });

  it("the E2B data plane: Bob's own sandbox's tokens open nothing of Alice's sandbox", async () => {
    const bobs = await ask(port, "POST", "/sandboxes", {
      headers: { "x-api-key": BOB },
      timeoutMs: SETUP_TIMEOUT_MS,
      json: { templateID: tag, timeout: 1800, network: { allowPublicTraffic: false } },
    });
    assert.equal(bobs.status, 201, bobs.text);
    const bob = JSON.parse(bobs.text) as {
      sandboxID: string;
      envdAccessToken: string;
      trafficAccessToken: string;
    };
    const bobsTokens = {
      "x-access-token": bob.envdAccessToken,
      "e2b-traffic-access-token": bob.trafficAccessToken,
    };
    const address = (sandbox: string, surface: string) => ({
      "e2b-sandbox-id": sandbox,
      "e2b-sandbox-port": surface === "envd" ? "49983" : surface === "interpreter" ? "49999" : "8080",
    });
    // The tokens are good ones: they open Bob's own sandbox.
    const own = await ask(port, "GET", "/envs", {
      headers: { ...address(bob.sandboxID, "envd"), ...bobsTokens },
    });
    assert.equal(own.status, 200, own.text);
    const failures: string[] = [];
    let walked = 0;
    for (const route of routes.filter((r) => r.surface !== undefined)) {
      const headers = { ...address(alice.sandbox, route.surface as string), ...bobsTokens };
      const [target, options] = requestFor(route, namesOf(alice), headers);
      const answer = await ask(port, route.method, target, options);
      walked++;
      const where = `${route.method} ${route.url} (${route.surface})`;
      if (answer.status === 0) failures.push(`${where}: ${answer.text}`);
      const leaked = leaks(answer.text);
      if (leaked.length > 0) failures.push(`${where}: Bob's answer names ${leaked.join(", ")}`);
      const open = OPEN_DATA_PLANE.has(`${route.method} ${route.url}`);
      if (!open && answer.status !== 401 && answer.status !== 403) {
        failures.push(`${where}: ${answer.status} with Bob's tokens: ${answer.text.slice(0, 300)}`);
      }
    }
    assert.deepEqual(failures, []);
    assert.ok(walked > 50, `walked ${walked} data-plane routes`);
    // WebSocket upgrades reach no route: the forkd port route's and a sandbox port's, with Bob's credentials.
    const upgrade = {
      connection: "Upgrade",
      upgrade: "websocket",
      "sec-websocket-version": "13",
      "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    };
    const forkdPort = await ask(port, "GET", `/v1/sandboxes/${alice.sandbox}/ports/8080/`, {
      headers: { ...upgrade, authorization: `Bearer ${BOB}` },
    });
    assert.equal(forkdPort.status, 404, forkdPort.text);
    const e2bPort = await ask(port, "GET", "/", {
      headers: { ...upgrade, ...address(alice.sandbox, "port"), ...bobsTokens },
    });
    assert.equal(e2bPort.status, 403, e2bPort.text);
    await assertAliceIntact();
  });

  it("every MCP tool, run with Bob's token: as if Alice's ids did not exist", async () => {
    const client = new Client({ name: "route-tenancy-test", version: "1" });
    await client.connect(
      new StdioClientTransport({
        command: process.execPath,
        args: [path.join(packageRoot(), "bin", "forkd-mcp.js")],
        env: { ...(process.env as Record<string, string>), FORKD_URL: url, FORKD_TOKEN: BOB },
      }),
    );
    try {
      const { tools } = await client.listTools();
      assert.ok(tools.length >= 20, `${tools.length} tools`);
      const failures: string[] = [];
      for (const tool of tools) {
        const text = async (names: Names) => {
          const answer = await client.callTool({ name: tool.name, arguments: toolArguments(tool, names) });
          return `${answer.isError === true ? "error" : "ok"} ${JSON.stringify(answer.content)}`;
        };
        const foreign = await text(namesOf(alice));
        const control = await text(UNKNOWN);
        const leaked = leaks(foreign);
        if (leaked.length > 0)
          failures.push(`${tool.name}: Bob's answer names ${leaked.join(", ")}: ${foreign.slice(0, 300)}`);
        if (asUnknown(foreign) !== control) {
          failures.push(
            `${tool.name}: Alice's ids answer ${foreign.slice(0, 300)}; unknown ids ${control.slice(0, 300)}`,
          );
        }
      }
      assert.deepEqual(failures, []);
    } finally {
      await client.close();
    }
    await assertAliceIntact();
  });

  /** Nothing Bob did reached Alice's sandbox, snapshot and alias, or the admin's workspace. */
  async function assertAliceIntact(): Promise<void> {
    const read = await ask(port, "GET", `/v1/sandboxes/${alice.sandbox}/files?path=/tmp/secret`, {
      headers: { authorization: `Bearer ${ALICE}` },
      timeoutMs: SETUP_TIMEOUT_MS,
    });
    assert.equal(read.text, SECRET_FILE);
    assert.equal(
      (await json<{ status: string }>("GET", `/v1/sandboxes/${alice.sandbox}`, ALICE)).status,
      "running",
    );
    await json("GET", `/v1/snapshots/${alice.snapshot}`, ALICE);
    await json("GET", `/v1/template-aliases/${alice.alias}`, ALICE);
    const workspace = await json<{ live_sandbox_id: string }>(
      "GET",
      `/v1/workspaces/${alice.workspace}`,
      ADMIN,
    );
    assert.equal(workspace.live_sandbox_id, alice.workspaceSandbox);
  }
});

const SPAWNS_OK = /^forkd_spawn_duration_seconds_count\{outcome="ok"\} (\d+)$/m;
const SANDBOXES_READY = /^forkd_sandbox_ready_seconds_count (\d+)$/m;

type Names = typeof UNKNOWN;
const namesOf = (foreign: Foreign): Names => ({
  sandbox: foreign.sandbox,
  snapshot: foreign.snapshot,
  alias: foreign.alias,
  workspace: foreign.workspace,
});

const E2B_CONTROL_PREFIXES = [
  "/sandboxes",
  "/v2/",
  "/v3/",
  "/templates",
  "/snapshots",
  "/secrets",
  "/volumes",
  "/teams",
];
function isE2bControl(url: string): boolean {
  return E2B_CONTROL_PREFIXES.some((prefix) => url === prefix || url.startsWith(prefix));
}

/** A path parameter that names something of someone's (a sandbox, snapshot, alias, workspace). */
const NAMING_PARAMS = new Set(["id", "sandboxID", "tag", "templateID", "alias", "name"]);
function namesSomething(url: string): boolean {
  return (
    [...url.matchAll(/:(\w+)/g)].some((m) => NAMING_PARAMS.has(m[1] as string)) &&
    !url.startsWith("/contexts")
  );
}

/** The value of a path parameter, a query parameter or a body field, by its name (names: whose ids). */
function sample(field: string, names: Names, where: "path" | "query" | "body"): unknown {
  switch (field) {
    case "id":
      return where === "path" || where === "query" ? names.sandbox : undefined;
    case "sandboxID":
    case "sandbox_ids":
      return names.sandbox;
    case "tag":
      // In a path it names a snapshot; in a body it names a new one (branch, create, snapshot-diff).
      return where === "path" ? names.snapshot : "walk-new-snapshot";
    case "snapshot_tag":
    case "templateID":
    case "template":
      return names.snapshot;
    case "alias":
      return where === "path" ? names.alias : undefined;
    case "name":
      return where === "path" ? names.workspace : where === "query" ? names.alias : "walk-new-workspace";
    case "port":
      return 8080;
    case "*":
      return "walk";
    case "path":
      return "/tmp/secret";
    case "args":
      return ["cat", "/tmp/secret"];
    case "code":
      return "print(open('/tmp/secret').read())";
    case "exec":
      return "cat /tmp/secret";
    case "to":
      return "walk-new-flat";
    case "token":
      return "not-one-of-the-daemon-tokens";
    case "signature":
    case "hash":
      // A template build's file hash and an upload URL's signature (both sha256, hex): well formed, so the
      // lookup (or the signature check) is reached.
      return "0".repeat(64);
    default:
      return undefined;
  }
}

/** A value of JSON schema `schema` for a field no sample names. */
function schemaValue(schema: JsonSchema | undefined): unknown {
  if (schema === undefined) return "walk";
  if (schema.anyOf) return schemaValue(schema.anyOf.find((s) => s.type !== "null" && s.type !== "undefined"));
  switch (schema.type) {
    case "integer":
    case "number":
      return Math.max(1, schema.minimum ?? 1);
    case "boolean":
      return false;
    case "array":
      return [];
    case "object":
      return {};
    default:
      return "walk";
  }
}

interface JsonSchema {
  type?: string;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  anyOf?: JsonSchema[];
  minimum?: number;
  content?: Record<string, { schema: JsonSchema }>;
}

/** An object for `schema`: its required fields, and every optional field that names someone's resource. */
function objectFor(
  schema: JsonSchema | undefined,
  names: Names,
  where: "query" | "body",
): Record<string, unknown> | undefined {
  const object = schema?.anyOf?.find((s) => s.type === "object") ?? schema;
  if (object?.properties === undefined) return undefined;
  const out: Record<string, unknown> = {};
  for (const [field, fieldSchema] of Object.entries(object.properties)) {
    const value = sample(field, names, where);
    if (value !== undefined) out[field] = value;
    else if (object.required?.includes(field)) out[field] = schemaValue(fieldSchema);
  }
  return out;
}

type AskOptions = { headers?: Record<string, string>; json?: unknown; body?: string; timeoutMs?: number };

/** The request a route gets in the walk: its path and query filled from `names`, a body its schema accepts. */
function requestFor(
  route: RegisteredRoute,
  names: Names,
  headers: Record<string, string>,
): [string, AskOptions] {
  const schema = (route.schema ?? {}) as { body?: JsonSchema; querystring?: JsonSchema };
  const target = route.url
    .replace(/:(\w+)/g, (_m, param: string) =>
      encodeURIComponent(String(sample(param, names, "path") ?? "walk")),
    )
    .replace("*", "walk");
  const query = objectFor(schema.querystring, names, "query") ?? {};
  const search = new URLSearchParams(
    Object.entries(query).map(([k, v]): [string, string] => [k, String(v)]),
  ).toString();
  const withQuery = search === "" ? target : `${target}?${search}`;
  if (route.method === "GET" || route.method === "HEAD") return [withQuery, { headers }];
  // QUERY carries its query in its body (Fastify wants a Content-Type for it).
  if (route.method === "QUERY")
    return [withQuery, { headers: { ...headers, "content-type": "text/plain" }, body: "walk" }];
  if (schema.body === undefined) return [withQuery, { headers }];
  const body = schema.body.content?.["application/json"]?.schema ?? schema.body;
  const json = objectFor(body, names, "body");
  if (json !== undefined) return [withQuery, { headers, json }];
  // A body of bytes (a file, a pack).
  return [withQuery, { headers: { ...headers, "content-type": "application/octet-stream" }, body: "walk" }];
}

/** Arguments for an MCP tool from its input schema, by the same samples. */
function toolArguments(tool: { name: string; inputSchema: unknown }, names: Names): Record<string, unknown> {
  const schema = tool.inputSchema as JsonSchema;
  const out: Record<string, unknown> = {};
  for (const [field, fieldSchema] of Object.entries(schema.properties ?? {})) {
    const value = TOOL_SAMPLES[field]?.(names, tool.name);
    if (value !== undefined) out[field] = value;
    else if (schema.required?.includes(field)) out[field] = schemaValue(fieldSchema);
  }
  return out;
}

/** Tool arguments by name; a tag names a new snapshot only where the tool makes one. */
const MAKES_A_SNAPSHOT = new Set(["fork_sandbox", "branch_sandbox", "create_snapshot"]);
const TOOL_SAMPLES: Record<string, (names: Names, tool: string) => unknown> = {
  sandbox_id: (names) => names.sandbox,
  snapshot_tag: (names) => names.snapshot,
  tag: (names, tool) => (MAKES_A_SNAPSHOT.has(tool) ? "walk-new-snapshot" : names.snapshot),
  path: () => "/tmp/secret",
  command: () => "cat /tmp/secret",
  code: () => "print(open('/tmp/secret').read())",
  args: () => ["cat", "/tmp/secret"],
  marker: () => "walk",
  command_id: () => "1",
  content: () => "walk",
  timeout_secs: () => 5,
};

/** How long a walked route may take to start answering before it counts as hung (status 0). */
const ANSWER_TIMEOUT_MS = 60_000;
/** Setting up: a spawn, a BRANCH or a pause under TCG on a busy host. */
const SETUP_TIMEOUT_MS = 10 * 60_000;

/**
 * One request over a fresh connection; the answer is read for at most a few seconds, so an event stream (the
 * console's) answers with what it sent by then instead of holding the walk. No answer at all: status 0.
 */
function ask(port: number, method: string, target: string, options: AskOptions = {}): Promise<Answer> {
  const headers: Record<string, string> = { ...options.headers };
  let body = options.body;
  if (options.json !== undefined) {
    body = JSON.stringify(options.json);
    headers["content-type"] = "application/json";
  }
  return new Promise((resolve, reject) => {
    const request = http.request({ host: "127.0.0.1", port, method, path: target, headers, agent: false });
    const timeoutMs = options.timeoutMs ?? ANSWER_TIMEOUT_MS;
    const hung = setTimeout(() => {
      request.destroy();
      resolve({ status: 0, text: `no answer within ${timeoutMs} ms` });
    }, timeoutMs);
    request.on("error", (err) => {
      clearTimeout(hung);
      reject(err);
    });
    const finish = (status: number, parts: Buffer[]) => {
      clearTimeout(hung);
      resolve({ status, text: Buffer.concat(parts).toString("utf8") });
    };
    request.on("upgrade", (response, socket) => {
      socket.destroy();
      finish(response.statusCode ?? 0, []);
    });
    request.on("response", (response) => {
      const parts: Buffer[] = [];
      const cut = setTimeout(() => {
        response.destroy();
        finish(response.statusCode ?? 0, parts);
      }, 3000);
      response.on("data", (chunk: Buffer) => parts.push(chunk));
      response.on("end", () => {
        clearTimeout(cut);
        finish(response.statusCode ?? 0, parts);
      });
      response.on("error", () => {});
    });
    request.end(body);
  });
}
