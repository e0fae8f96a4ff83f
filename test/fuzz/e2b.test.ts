/**
 * Property-based: the E2B surfaces under hostile requests. Control plane (routes from docs/e2b-openapi.json), envd's
 * Connect services (every unary method, JSON), and the data plane's plain HTTP routes (files, the code
 * interpreter's contexts) get arbitrary JSON, wrong types, garbage and hostile ids. Every answer is a known status
 * with E2B's error body for its surface (control plane `{code: number, message}`, Connect `{code: string,
 * message}`), never a 500 and never a request that reaches another surface. Services: the HTTP test double.
 */
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import fc from "fast-check";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { repoRoot } from "../agent/harness.js";
import { ServicesDouble } from "../api/services-double.js";

const RUNS = Number(process.env.FORKD_FUZZ_RUNS ?? 300);
const TOKEN = "e2b-fuzz-test-token-0123456789abcdef";
const STATUSES = new Set([
  200, 201, 202, 204, 400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 501, 502, 503, 504,
]);
const CONNECT_UNARY = [
  "filesystem.Filesystem/Stat",
  "filesystem.Filesystem/MakeDir",
  "filesystem.Filesystem/Move",
  "filesystem.Filesystem/ListDir",
  "filesystem.Filesystem/Remove",
  "filesystem.Filesystem/CreateWatcher",
  "filesystem.Filesystem/GetWatcherEvents",
  "filesystem.Filesystem/RemoveWatcher",
  "process.Process/List",
  "process.Process/Update",
  "process.Process/SendInput",
  "process.Process/SendSignal",
  "process.Process/CloseStdin",
];

const hostile = fc.oneof(
  fc.constantFrom(
    "%2E%2E",
    "..%2F..%2Fetc",
    "%00",
    "sb-000000000000",
    "sb-zzzzzzzzzzzz",
    "",
    "x".repeat(300),
  ),
  fc.string({ maxLength: 60 }),
);
const jsonBody = fc.oneof(
  fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)),
  fc
    .dictionary(
      fc.constantFrom(
        "templateID",
        "timeout",
        "metadata",
        "envVars",
        "path",
        "process",
        "input",
        "signal",
        "pty",
        "count",
        "network",
      ),
      fc.jsonValue({ maxDepth: 3 }),
    )
    .map((v) => JSON.stringify(v)),
  fc.uint8Array({ maxLength: 256 }).map((b) => Buffer.from(b).toString("latin1")),
);

describe("E2B API under hostile requests", () => {
  let app: FastifyInstance;
  let control: { method: string; path: string }[];
  let sandbox: string;
  const double = new ServicesDouble();

  before(async () => {
    app = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [tokenFromString(TOKEN)],
    });
    await app.ready();
    const [sb] = await double.sandboxes.spawn({ snapshotTag: "py", n: 1 });
    sandbox = (sb as { id: string }).id;
    const doc = JSON.parse(await readFile(path.join(repoRoot(), "docs/e2b-openapi.json"), "utf8")) as {
      paths: Record<string, Record<string, unknown>>;
    };
    control = Object.entries(doc.paths).flatMap(([path, methods]) =>
      Object.keys(methods)
        .filter((m) => m !== "query")
        .map((method) => ({ method: method.toUpperCase(), path })),
    );
  });
  after(() => app.close());

  it("control plane: known statuses, {code: number, message} errors", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.nat(),
        fc.array(fc.oneof(hostile, fc.constant("LIVE")), { minLength: 2, maxLength: 2 }),
        jsonBody,
        fc.boolean(),
        async (n, params, body, keyed) => {
          const route = control[n % control.length] as { method: string; path: string };
          let i = 0;
          // Dot segments and empty segments are resolved away by every HTTP client (and by the URL parser) before
          // a request reaches any route: keep dots encoded and segments non-empty, as the SDK's ids always are.
          const url = route.path.replace(/\{[^}]+\}/g, () => {
            const p = params[i++ % 2] as string;
            if (p === "LIVE") return sandbox;
            return p === "" ? "%20" : encodeURIComponent(p).replaceAll(".", "%2E");
          });
          const res = await app.inject({
            method: route.method as "GET",
            url,
            payload: ["GET", "HEAD", "DELETE", "OPTIONS", "TRACE"].includes(route.method) ? undefined : body,
            headers: { "content-type": "application/json", ...(keyed ? { "x-api-key": TOKEN } : {}) },
          });
          assert.ok(
            STATUSES.has(res.statusCode),
            `${route.method} ${url}: ${res.statusCode} ${res.body.slice(0, 200)}`,
          );
          if (!keyed && res.statusCode < 400)
            assert.fail(`${route.method} ${url} answered ${res.statusCode} without a key`);
          if (res.statusCode >= 400 && route.method !== "HEAD") {
            const err = JSON.parse(res.body) as { code?: unknown; message?: unknown };
            assert.equal(err.code, res.statusCode, res.body);
            assert.equal(typeof err.message, "string");
          }
        },
      ),
      { numRuns: RUNS },
    );
  });

  it("envd's Connect services: known statuses, Connect error bodies, the access token required", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...CONNECT_UNARY),
        jsonBody,
        fc.constantFrom("own", "none", "wrong"),
        fc.oneof(fc.constant("LIVE"), hostile),
        async (method, body, token, id) => {
          const target = id === "LIVE" ? sandbox : id;
          const res = await app.inject({
            method: "POST",
            url: `/${method}`,
            payload: body,
            headers: {
              "content-type": "application/json",
              "connect-protocol-version": "1",
              "e2b-sandbox-id": target,
              "e2b-sandbox-port": "49983",
              ...(token === "own"
                ? { "x-access-token": `envd-${target}` }
                : token === "wrong"
                  ? { "x-access-token": "envd-sb-111111111111" }
                  : {}),
            },
          });
          assert.ok(STATUSES.has(res.statusCode), `${method}: ${res.statusCode} ${res.body.slice(0, 200)}`);
          if (res.statusCode >= 400) {
            const err = JSON.parse(res.body) as { code?: unknown; message?: unknown };
            assert.equal(typeof err.code, "string", res.body);
            assert.equal(typeof err.message, "string", res.body);
          }
          if (token !== "own" || id !== "LIVE")
            assert.ok(res.statusCode >= 400, `${method} without its token: ${res.statusCode}`);
        },
      ),
      { numRuns: RUNS },
    );
  });

  it("data-plane HTTP routes: known statuses and JSON errors, never the forkd API behind them", async () => {
    const route = fc.constantFrom(
      { method: "GET", path: "/files", port: 49983 },
      { method: "POST", path: "/files", port: 49983 },
      { method: "GET", path: "/health", port: 49983 },
      { method: "GET", path: "/contexts", port: 49999 },
      { method: "POST", path: "/contexts", port: 49999 },
      { method: "DELETE", path: "/contexts/x", port: 49999 },
      { method: "GET", path: "/v1/sandboxes", port: 49983 },
      { method: "POST", path: "/v2/sandboxes", port: 49999 },
      { method: "GET", path: "/", port: 8080 },
    );
    await fc.assert(
      fc.asyncProperty(
        route,
        jsonBody,
        fc.dictionary(fc.constantFrom("path", "username", "signature"), hostile, { maxKeys: 3 }),
        async (r, body, query) => {
          const qs = new URLSearchParams(query).toString();
          const res = await app.inject({
            method: r.method as "GET",
            url: qs ? `${r.path}?${qs}` : r.path,
            payload: r.method === "GET" || r.method === "DELETE" ? undefined : body,
            headers: {
              "content-type": "application/json",
              "e2b-sandbox-id": sandbox,
              "e2b-sandbox-port": String(r.port),
              "x-access-token": `envd-${sandbox}`,
              "x-api-key": TOKEN,
            },
          });
          assert.ok(
            STATUSES.has(res.statusCode),
            `${r.method} ${r.path}: ${res.statusCode} ${res.body.slice(0, 200)}`,
          );
          // A request addressed to a sandbox never reaches the forkd API or the control plane.
          if (r.path.startsWith("/v1/") || r.path.startsWith("/v2/"))
            assert.ok(res.statusCode >= 400, res.body);
          if (res.statusCode >= 400 && r.port === 49999) {
            // The code interpreter answers errors as plain text, as E2B's does (its SDK reads them as text).
            assert.match(String(res.headers["content-type"]), /^text\/plain/, res.body);
            assert.ok(res.body.length > 0);
          } else if (res.statusCode >= 400) {
            const err = JSON.parse(res.body) as Record<string, unknown>;
            assert.equal(typeof (err.message ?? err.error), "string", res.body);
          }
        },
      ),
      { numRuns: RUNS },
    );
  });
});
