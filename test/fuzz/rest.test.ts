/**
 * Property-based: every route of the forkd REST API (read from its own OpenAPI document) under hostile requests:
 * path parameters that are traversal attempts, huge or odd strings; bodies that are arbitrary JSON, wrong types,
 * garbage bytes or another content type; query strings likewise. Every answer is a known status and every error is
 * the API's `{"error", "code"}` with a catalogue code, never a 500 and never a crash. The services are the HTTP test
 * double (test/api/services-double.ts): this is about the HTTP layer; the VMs' side is covered by the e2e suites.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import fc from "fast-check";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { ERROR_CODES } from "../../src/common/errors.js";
import { ServicesDouble } from "../api/services-double.js";

const RUNS = Number(process.env.FORKD_FUZZ_RUNS ?? 400);
const STATUSES = new Set([200, 201, 202, 204, 400, 404, 405, 409, 413, 415, 422, 429, 501, 502, 503, 504]);

const hostileString = fc.oneof(
  fc.constantFrom(
    "..",
    "../etc/passwd",
    "%2e%2e%2f",
    "a/b",
    "\u0000",
    "sb-000000000000",
    ".hidden",
    "-x",
    " ",
    "",
  ),
  fc.string({ maxLength: 80 }),
  fc.string({ minLength: 200, maxLength: 2000 }),
  fc.stringMatching(/^[A-Za-z0-9._-]{1,70}$/),
);

describe("REST API under hostile requests", () => {
  let app: FastifyInstance;
  let routes: { method: string; path: string }[];
  let liveId: string;
  const double = new ServicesDouble();

  before(async () => {
    app = await buildApi({ services: double, snapshotsDir: "/srv/snaps", transport: "inject" });
    await app.ready();
    const [sb] = await double.sandboxes.spawn({ snapshotTag: "py", n: 1 });
    liveId = (sb as { id: string }).id;
    const doc = app.swagger() as { paths: Record<string, Record<string, unknown>> };
    routes = Object.entries(doc.paths).flatMap(([path, methods]) =>
      Object.keys(methods).map((method) => ({ method: method.toUpperCase(), path })),
    );
    assert.ok(routes.length > 30, "the OpenAPI document lists the routes");
  });
  after(() => app.close());

  it("answers every route with a known status and a well-formed error", async () => {
    const request = fc.record({
      route: fc.nat(),
      params: fc.array(fc.oneof(hostileString, fc.constant("LIVE"), fc.constant("py")), {
        minLength: 4,
        maxLength: 4,
      }),
      query: fc.dictionary(
        fc.constantFrom("path", "mode", "cascade", "force", "tag", "level", "x"),
        hostileString,
        {
          maxKeys: 3,
        },
      ),
      body: fc.oneof(
        fc.jsonValue({ maxDepth: 4 }).map((v) => ({ type: "application/json", payload: JSON.stringify(v) })),
        fc
          .dictionary(
            fc.constantFrom("snapshot_tag", "n", "args", "code", "tag", "timeout_ms", "mode", "network"),
            fc.jsonValue(),
          )
          .map((v) => ({ type: "application/json", payload: JSON.stringify(v) })),
        fc.uint8Array({ maxLength: 512 }).map((b) => ({ type: "application/json", payload: Buffer.from(b) })),
        fc.string().map((s) => ({
          type: fc.sample(fc.constantFrom("text/plain", "application/x-ndjson", "x/y"), 1)[0] as string,
          payload: s,
        })),
        fc.constant(undefined),
      ),
    });
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const route = routes[r.route % routes.length] as { method: string; path: string };
        let i = 0;
        const url = route.path.replace(/\{[^}]+\}/g, () => {
          const p = r.params[i++ % r.params.length] as string;
          return encodeURIComponent(p === "LIVE" ? liveId : p);
        });
        const query = new URLSearchParams(r.query).toString();
        const res = await app.inject({
          method: route.method as "GET",
          url: query ? `${url}?${query}` : url,
          ...(r.body ? { payload: r.body.payload, headers: { "content-type": r.body.type } } : {}),
        });
        assert.ok(
          STATUSES.has(res.statusCode),
          `${route.method} ${url}: status ${res.statusCode} ${res.body.slice(0, 300)}`,
        );
        // HEAD answers carry no body by definition.
        if (res.statusCode >= 400 && route.method !== "HEAD") {
          const body = JSON.parse(res.body) as { error?: unknown; code?: unknown };
          assert.equal(typeof body.error, "string", res.body);
          assert.ok(Object.hasOwn(ERROR_CODES, body.code as string), `unknown code in ${res.body}`);
        }
      }),
      { numRuns: RUNS },
    );
  });
});
