/**
 * Every body field of every E2B route replayed absent and as null, against the HTTP contract (the services
 * double behind a real listener, as bad-input.test.ts): the Python SDKs send null where E2B's servers take it,
 * and a client that sends a field as null must get what E2B gives it.
 *
 * - Absent: a field that is not required never makes the request fail validation.
 * - null: where E2B accepts null it means "not given", the answer is the one the field's absence gets; where E2B's
 *   server does not (its spec: a non-nullable field, which its request validator refuses), 400 naming the field.
 *
 * The control plane's routes and fields are read from forkd's own E2B OpenAPI document (docs/e2b-openapi.json,
 * generated from the routes), so a route or field added later is replayed too: each field needs a sample value
 * here, and the test fails naming any that has none. What E2B accepts as null is from E2B's spec
 * (e2b-dev/infra spec/openapi.yml: `nullable` only on NewSandbox.mcp and the network's egressProxy; the newest
 * SDK's models add network.allowPublicTraffic) and from its code interpreter's request models (every field of
 * /execute and /contexts but `code` is Optional).
 */
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { packageRoot } from "../../src/image/package-root.js";
import { ServicesDouble } from "../api/services-double.js";

const TOKEN = "e2b-null-replay-test-token-0123456789";

/**
 * Fields of which E2B wants one, though its spec marks each optional (POST /v3/templates: `name`, or the
 * deprecated `alias`). A replay leaving one of them out (or null) sends another of its group.
 */
const E2B_ONE_OF: Record<string, readonly (readonly string[])[]> = {
  "POST /v3/templates": [["name", "alias"]],
};

/** Where E2B's servers take null (as "not given"), by route and field path. */
const E2B_NULLABLE: Record<string, readonly string[]> = {
  // network.allowPublicTraffic: null is "the default" in the newest SDKs' models (e2b 2.63).
  "POST /sandboxes": ["mcp", "network.egressProxy", "network.allowPublicTraffic"],
  "POST /v2/sandboxes": ["mcp", "network.egressProxy", "network.allowPublicTraffic"],
  "PUT /sandboxes/{sandboxID}/network": ["egressProxy"],
  "POST /execute": ["context_id", "language", "env_vars"],
  "POST /contexts": ["cwd", "language"],
};

/** A valid value of each field (dotted paths for nested ones), so a body can hold every field at once. */
const SAMPLES: Record<string, unknown> = {
  templateID: "py",
  timeout: 60,
  metadata: { suite: "null-replay" },
  envVars: { A: "1" },
  secure: true,
  allow_internet_access: true,
  network: {},
  "network.allowOut": ["192.0.2.1"],
  "network.denyOut": ["0.0.0.0/0"],
  "network.allowPublicTraffic": true,
  "network.maskRequestHost": "app.internal",
  "network.httpsPorts": [8443],
  "network.rules": {},
  "network.egressProxy": { address: "socks5://192.0.2.9:1080" },
  "network.dnsServers": ["192.0.2.53"],
  dnsServers: ["192.0.2.53"],
  requireHealthyGuest: false,
  autoPause: false,
  autoPauseMemory: true,
  autoResume: { enabled: false },
  "autoResume.enabled": false,
  mcp: { servers: {} },
  iam: { role: "r" },
  volumeMounts: [],
  memory: true,
  count: 1,
  allowOut: ["192.0.2.1"],
  denyOut: ["0.0.0.0/0"],
  rules: {},
  egressProxy: { address: "socks5://192.0.2.9:1080" },
  duration: 60,
  name: "replayed",
  // template builds
  tags: ["v1"],
  target: "replayed:v1",
  alias: "replayed",
  teamID: "team",
  cpuCount: 1,
  memoryMB: 512,
  minFreeDiskMb: 0,
  fromImage: "debian:bookworm",
  fromTemplate: "base",
  fromImageRegistry: { type: "registry", username: "u", password: "p" },
  force: false,
  steps: [],
  startCmd: "true",
  readyCmd: "true",
  // the code interpreter
  code: "1 + 1",
  context_id: "default",
  language: "python",
  env_vars: { A: "1" },
  cwd: "/home/user",
};

interface Schema {
  type?: string;
  properties?: Record<string, Schema>;
  required?: string[];
  anyOf?: Schema[];
}

/** The fields of a body schema, one level into objects (network, autoResume), as dotted paths. */
function fieldsOf(schema: Schema, prefix = ""): { path: string; required: boolean }[] {
  const fields: { path: string; required: boolean }[] = [];
  for (const [name, sub] of Object.entries(schema.properties ?? {})) {
    const field = `${prefix}${name}`;
    fields.push({ path: field, required: (schema.required ?? []).includes(name) });
    const object = [sub, ...(sub.anyOf ?? [])].find((s) => s.properties !== undefined);
    if (prefix === "" && object) fields.push(...fieldsOf(object, `${field}.`));
  }
  return fields;
}

function sample(field: string): unknown {
  assert.ok(field in SAMPLES, `no sample value for body field ${field}: add one to SAMPLES`);
  return structuredClone(SAMPLES[field]);
}

/**
 * The route's body with every required field (and the parents of `field`) set, another member of each of its
 * one-of groups, and `field` as `value`.
 */
function bodyWith(
  fields: { path: string; required: boolean }[],
  field: string,
  value: unknown | typeof ABSENT,
  oneOf: readonly (readonly string[])[] = [],
): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const f of fields) if (f.required && !f.path.includes(".")) body[f.path] = sample(f.path);
  for (const group of oneOf) {
    const other = group.find((member) => member !== field);
    if (other !== undefined) body[other] = sample(other);
  }
  const [parent, child] = field.split(".") as [string, string | undefined];
  if (child === undefined) {
    if (value === ABSENT) delete body[parent];
    else body[parent] = value;
  } else {
    const object = (body[parent] ?? {}) as Record<string, unknown>;
    if (value !== ABSENT) object[child] = value;
    body[parent] = object;
  }
  return body;
}

const ABSENT = Symbol("absent");

describe("E2B routes replayed with absent and null fields", () => {
  let app: FastifyInstance;
  let url: string;
  let sandboxId: string;
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
    const created = await post("POST", "/v2/sandboxes", { templateID: "py" });
    assert.equal(created.status, 201, created.text);
    sandboxId = (JSON.parse(created.text) as { sandboxID: string }).sandboxID;
  });

  after(async () => {
    await app?.close();
  });

  async function post(method: string, route: string, body: unknown, headers: Record<string, string> = {}) {
    const response = await fetch(`${url}${route}`, {
      method,
      headers: { "x-api-key": TOKEN, "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });
    return { status: response.status, text: await response.text() };
  }

  /** Replays `fields` of route `key` (`METHOD /path`), sending to `target` with `headers`. */
  async function replay(
    key: string,
    target: string,
    fields: { path: string; required: boolean }[],
    headers: Record<string, string> = {},
  ): Promise<void> {
    const [method] = key.split(" ") as [string];
    const nullable = new Set(E2B_NULLABLE[key] ?? []);
    for (const field of fields) {
      const oneOf = E2B_ONE_OF[key] ?? [];
      const absent = await post(method, target, bodyWith(fields, field.path, ABSENT, oneOf), headers);
      const nulled = await post(method, target, bodyWith(fields, field.path, null, oneOf), headers);
      // A body this listener cannot act on at all (a template build without a build service behind the double)
      // answers 501 once it is valid: only its refusal of bad bodies is checked here
      // (test/e2b/template-build-e2e drives the served route).
      if ([absent, nulled].some((r) => r.status === 501 && /not available on this listener/.test(r.text))) {
        continue;
      }
      const named = new RegExp(field.path.split(".").at(-1) as string);
      const what = `${key} ${field.path}`;
      assert.ok(
        absent.status < 500 || absent.status === 501,
        `${what} absent: ${absent.status} ${absent.text}`,
      );
      if (field.required) {
        assert.equal(absent.status, 400, `${what} is required: ${absent.text}`);
        assert.match(absent.text, named, `${what}: the refusal names the field`);
      } else {
        assert.ok(
          !(absent.status === 400 && named.test(absent.text)),
          `${what} is optional, so its absence is no error: ${absent.text}`,
        );
      }
      if (nullable.has(field.path)) {
        assert.equal(nulled.status, absent.status, `${what}: null means not given (${nulled.text})`);
      } else {
        assert.equal(nulled.status, 400, `${what}: E2B refuses null here, so does forkd (${nulled.text})`);
        assert.match(nulled.text, named, `${what}: the refusal names the field`);
      }
    }
  }

  it("every control-plane route's body fields", async () => {
    const document = JSON.parse(
      await readFile(path.join(packageRoot(), "docs", "e2b-openapi.json"), "utf8"),
    ) as {
      paths: Record<
        string,
        Record<string, { requestBody?: { content: Record<string, { schema: Schema }> } }>
      >;
    };
    let routes = 0;
    for (const [route, operations] of Object.entries(document.paths)) {
      for (const [method, operation] of Object.entries(operations)) {
        const schema = operation.requestBody?.content["application/json"]?.schema;
        if (schema === undefined) continue;
        const key = `${method.toUpperCase()} ${route}`;
        await replay(key, route.replace("{sandboxID}", sandboxId), fieldsOf(schema));
        routes++;
      }
    }
    assert.ok(routes >= 11, `every route with a body was replayed (${routes})`);
  });

  it("the code interpreter's /execute and /contexts", async () => {
    const dataPlane = {
      "e2b-sandbox-id": sandboxId,
      "e2b-sandbox-port": "49999",
      "x-access-token": `envd-${sandboxId}`,
    };
    await replay(
      "POST /execute",
      "/execute",
      [
        { path: "code", required: true },
        { path: "context_id", required: false },
        { path: "language", required: false },
        { path: "env_vars", required: false },
      ],
      dataPlane,
    );
    await replay(
      "POST /contexts",
      "/contexts",
      [
        { path: "cwd", required: false },
        { path: "language", required: false },
      ],
      dataPlane,
    );
  });
});
