/**
 * Snapshot chains over the REST API on the real controller, without VMs: the daemon's real services
 * (openServices: DaemonSnapshots over controller/snapshots/chains.ts and the store) serve synthetic chains
 * (test/controller/chains-synthetic.ts) through the real routes, by in-process injection. What snapshot-info
 * reports, rmi's rules (dependents, cascade, force) and compaction are asserted here on what chains.ts computes.
 *
 * The HTTP tests that need no snapshot at all run over the services double (test/api/services-double.ts), which
 * computes chains of its own: the last test sends the same requests to both on the same chain shape and checks
 * that the double answers as the real controller does, so what those tests assert about chains holds for the
 * real thing.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { syntheticChain, syntheticLayer } from "../controller/chains-synthetic.js";
import { tempHome } from "../support/host.js";
import { ServicesDouble } from "./services-double.js";

type Json = Record<string, unknown>;

interface Answer {
  status: number;
  json: Json | undefined;
  body: string;
}

async function call(app: FastifyInstance, method: string, url: string, payload?: unknown): Promise<Answer> {
  const response = await app.inject({ method: method as "GET", url, payload: payload as string });
  const json = response.headers["content-type"]?.toString().startsWith("application/json")
    ? (response.json() as Json)
    : undefined;
  return { status: response.statusCode, json, body: response.body };
}

/** The tags a "has dependents" refusal names, in its order. */
function namedDependents(message: unknown): string[] | null {
  const match = /has dependents: ([^ ,(]+(?:, [^ ,(]+)*)/.exec(String(message));
  return match ? (match[1] as string).split(", ") : null;
}

/** A chain and one sibling: p0 -> p1 -> p2, and p1 -> p2b. */
async function forkedChain(home: Awaited<ReturnType<typeof tempHome>>, prefix: string): Promise<string[]> {
  const tags = await syntheticChain(home, 2, prefix);
  await syntheticLayer(home, `${prefix}2b`, `${prefix}1`, 5);
  return [...tags, `${prefix}2b`];
}

describe("snapshot chains over the REST API on the real controller (no VM)", { timeout: 5 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let services: Awaited<ReturnType<typeof openServices>>;
  let app: FastifyInstance;

  before(async () => {
    home = await tempHome("forkd-api-chains-");
    services = await openServices(home);
    app = await buildApi({ services, snapshotsDir: home.snapshots, transport: "inject" });
  });
  after(async () => {
    await app?.close();
    await services?.close();
    await home?.cleanup();
  });

  it("snapshot-info: depth, ancestors, direct and all dependents, bytes per layer", async () => {
    await forkedChain(home, "i");
    const head = await call(app, "GET", "/v1/snapshots/i2/info");
    assert.equal(head.status, 200, head.body);
    assert.deepEqual(
      [head.json?.chain_depth, head.json?.ancestors, head.json?.dependents, head.json?.parent_tag],
      [2, ["i0", "i1"], [], "i1"],
    );
    const layers = head.json?.layers as { tag: string; memory: { format: string; pages: number } }[];
    assert.deepEqual(
      layers.map((l) => [l.tag, l.memory.format, l.memory.pages]),
      [
        ["i0", "flat", 16384],
        ["i1", "layer", 3],
        ["i2", "layer", 3],
      ],
    );
    const bytes = head.json?.chain_bytes as {
      memory_physical: number;
      disk_physical: number;
      vmstate: number;
    };
    assert.ok(bytes.memory_physical > 0 && bytes.disk_physical > 0 && bytes.vmstate === 4096, head.body);
    assert.match(String(head.json?.parent_content_hash), /^[0-9a-f]{64}$/);
    assert.equal(head.json?.chain_error, null);

    const middle = (await call(app, "GET", "/v1/snapshots/i1/info")).json;
    assert.deepEqual(
      [middle?.dependents, middle?.all_dependents],
      [
        ["i2", "i2b"],
        ["i2", "i2b"],
      ],
    );
    const root = (await call(app, "GET", "/v1/snapshots/i0/info")).json;
    assert.deepEqual(
      [root?.chain_depth, root?.ancestors, root?.parent_content_hash, root?.dependents, root?.all_dependents],
      [0, [], null, ["i1"], ["i1", "i2", "i2b"]],
    );
    const listed = JSON.parse((await call(app, "GET", "/v1/snapshots")).body) as Json[];
    const parents = Object.fromEntries(
      listed.filter((s) => String(s.tag).startsWith("i")).map((s) => [s.tag, s.parent_tag]),
    );
    assert.deepEqual(parents, { i0: null, i1: "i0", i2: "i1", i2b: "i1" });
    const missing = await call(app, "GET", "/v1/snapshots/i9/info");
    assert.equal(missing.status, 404);
    assert.match(String(missing.json?.error), /snapshot "i9" not found/);
  });

  it("delete: dependents refuse it (409 naming all of them), cascade takes the subtree, force orphans", async () => {
    await forkedChain(home, "d");
    const refused = await call(app, "DELETE", "/v1/snapshots/d0");
    assert.equal(refused.status, 409, refused.body);
    assert.deepEqual(namedDependents(refused.json?.error), ["d1", "d2", "d2b"]);
    assert.deepEqual(Object.keys(refused.json ?? {}).sort(), ["code", "error"]);
    const both = await call(app, "DELETE", "/v1/snapshots/d1?cascade=true&force=true");
    assert.equal(both.status, 400, both.body);
    assert.match(String(both.json?.error), /exclude each other/);

    assert.equal((await call(app, "DELETE", "/v1/snapshots/d2b")).status, 204);
    assert.deepEqual((await call(app, "GET", "/v1/snapshots/d1/info")).json?.dependents, ["d2"]);
    const forced = await call(app, "DELETE", "/v1/snapshots/d1?force=true");
    assert.equal(forced.status, 204, forced.body);
    const orphan = (await call(app, "GET", "/v1/snapshots/d2/info")).json;
    assert.match(String(orphan?.chain_error), /layer d2 depends on d1, which is missing/);
    // Its files are all there; its chain is not: a spawn is refused before any VM starts, naming the gap.
    const spawned = await call(app, "POST", "/v1/sandboxes", { snapshot_tag: "d2" });
    assert.equal(spawned.status, 409, spawned.body);
    assert.match(String(spawned.json?.error), /d1/);
    assert.deepEqual(
      JSON.parse((await call(app, "GET", "/v1/sandboxes")).body),
      [],
      "nothing left of the spawn",
    );
    // The orphan no longer hangs on d0: d0 goes alone.
    assert.deepEqual((await call(app, "GET", "/v1/snapshots/d0/info")).json?.all_dependents, []);

    await forkedChain(home, "c");
    assert.equal((await call(app, "DELETE", "/v1/snapshots/c1?cascade=true")).status, 204);
    for (const gone of ["c1", "c2", "c2b"]) {
      assert.equal((await call(app, "GET", `/v1/snapshots/${gone}`)).status, 404, gone);
    }
    assert.deepEqual((await call(app, "GET", "/v1/snapshots/c0/info")).json?.dependents, []);
  });

  it("compact: one flat snapshot (200, no parent) of the chain, which stays as it was", async () => {
    await syntheticChain(home, 2, "k");
    const compacted = await call(app, "POST", "/v1/snapshots/k2/compact", { to: "k-flat" });
    assert.equal(compacted.status, 200, compacted.body);
    assert.deepEqual(
      [compacted.json?.tag, compacted.json?.parent_tag, compacted.json?.origin, compacted.json?.bootable],
      ["k-flat", null, "compact", true],
    );
    const flat = (await call(app, "GET", "/v1/snapshots/k-flat/info")).json;
    const layers = flat?.layers as { tag: string; memory: { format: string } }[];
    assert.deepEqual([flat?.chain_depth, flat?.ancestors], [0, []]);
    assert.deepEqual(
      layers.map((l) => [l.tag, l.memory.format]),
      [["k-flat", "flat"]],
    );
    assert.deepEqual((await call(app, "GET", "/v1/snapshots/k2/info")).json?.ancestors, ["k0", "k1"]);
    const again = await call(app, "POST", "/v1/snapshots/k2/compact", { to: "k-flat" });
    assert.equal(again.status, 409, again.body);
  });

  it("the HTTP tests' services double answers chain requests as the real controller does", async () => {
    const real = await forkedChain(home, "s");
    const double = new ServicesDouble();
    const listed = JSON.parse((await call(app, "GET", "/v1/snapshots")).body) as Json[];
    for (const tag of real) {
      const parent = listed.find((s) => s.tag === tag)?.parent_tag as string | null;
      double.addSnapshot(tag, { parent_tag: parent });
    }
    const doubled = await buildApi({ services: double, snapshotsDir: home.snapshots, transport: "inject" });
    try {
      /** What both must agree on: the status, the chain's shape, the tags a refusal names. */
      const shape = (a: Answer) => ({
        status: a.status,
        code: a.json?.code,
        chain: a.status === 200 ? [a.json?.chain_depth, a.json?.ancestors, a.json?.parent_tag] : null,
        dependents: a.status === 200 ? [a.json?.dependents, a.json?.all_dependents] : null,
        broken: a.status === 200 && "chain_error" in (a.json ?? {}) ? a.json?.chain_error !== null : null,
        named: a.status === 409 ? namedDependents(a.json?.error) : null,
      });
      const tags = async (target: FastifyInstance) =>
        (JSON.parse((await call(target, "GET", "/v1/snapshots")).body) as Json[])
          .map((s) => String(s.tag))
          .filter((t) => real.includes(t) || t === "s-flat")
          .sort();
      const both = async (method: string, url: string, payload?: unknown) => {
        const [fromReal, fromDouble] = [
          await call(app, method, url, payload),
          await call(doubled, method, url, payload),
        ];
        assert.deepEqual(shape(fromDouble), shape(fromReal), `${method} ${url}: the double differs`);
        assert.deepEqual(
          await tags(doubled),
          await tags(app),
          `after ${method} ${url}: the snapshots differ`,
        );
        return fromReal;
      };
      for (const tag of real) await both("GET", `/v1/snapshots/${tag}/info`);
      await both("GET", "/v1/snapshots/s9/info");
      for (const tag of ["s0", "s1"])
        assert.equal((await both("DELETE", `/v1/snapshots/${tag}`)).status, 409);
      assert.equal((await both("DELETE", "/v1/snapshots/s1?cascade=true&force=true")).status, 400);
      assert.equal((await both("DELETE", "/v1/snapshots/s2b")).status, 204);
      await both("GET", "/v1/snapshots/s1/info");
      assert.equal((await both("POST", "/v1/snapshots/s2/compact", { to: "s-flat" })).status, 200);
      await both("GET", "/v1/snapshots/s-flat/info");
      // Forced: s1 and s2 are orphans, their chains broken where s0 was.
      assert.equal((await both("DELETE", "/v1/snapshots/s0?force=true")).status, 204);
      for (const tag of ["s1", "s2"]) await both("GET", `/v1/snapshots/${tag}/info`);
      assert.equal((await both("DELETE", "/v1/snapshots/s1?cascade=true")).status, 204);
      assert.deepEqual(await tags(app), ["s-flat"]);
    } finally {
      await doubled.close();
    }
  });
});
