/** docs/openapi.json is what the daemon serves, generated from the same schemas that validate requests. */
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { describe, it } from "node:test";
import { buildApi } from "../../src/api/app.js";
import { checkedInOpenApiPath, renderOpenApi } from "../../src/api/openapi.js";
import { ServicesDouble } from "./services-double.js";

const checkedIn = checkedInOpenApiPath();

describe("OpenAPI document", () => {
  it("docs/openapi.json matches the generated document (run `npm run openapi` if not)", async () => {
    assert.equal(await readFile(checkedIn, "utf8"), (await renderOpenApi()).forkd);
  });

  it("docs/e2b-openapi.json matches the E2B API's generated document (run `npm run openapi` if not)", async () => {
    const e2b = JSON.parse(await readFile(checkedInOpenApiPath("e2b-openapi.json"), "utf8")) as {
      paths: Record<string, Record<string, unknown>>;
    };
    assert.equal(
      await readFile(checkedInOpenApiPath("e2b-openapi.json"), "utf8"),
      (await renderOpenApi()).e2b,
    );
    for (const route of [
      "/v2/sandboxes",
      "/sandboxes/{sandboxID}/fork",
      "/snapshots",
      "/templates/aliases/{alias}",
    ]) {
      assert.ok(e2b.paths[route], `${route} documented`);
    }
    const forkd = JSON.parse(await readFile(checkedIn, "utf8")) as { paths: Record<string, unknown> };
    assert.ok(!forkd.paths["/v2/sandboxes"], "E2B routes are not in the forkd API's document");
  });

  it("is served at /openapi.json and documents every route the server has", async () => {
    const app = await buildApi({ services: new ServicesDouble(), snapshotsDir: "/s", transport: "inject" });
    try {
      const served = (await app.inject({ method: "GET", url: "/openapi.json" })).json() as {
        paths: Record<string, Record<string, unknown>>;
      };
      assert.deepEqual(served, JSON.parse(await readFile(checkedIn, "utf8")));
      for (const [path, methods] of Object.entries(served.paths)) {
        for (const method of Object.keys(methods)) {
          const url = path.replace(/\{(\w+)\}/g, (_m, name: string) =>
            name === "id" ? "sb-000000000000" : "x",
          );
          const answer = await app.inject({ method: method.toUpperCase() as "GET", url });
          assert.ok(!answer.body.includes('"error":"no route'), `${method} ${path} is a route`);
        }
      }
      for (const route of [
        "/v1/sandboxes/{id}/exec/stream",
        "/v1/sandboxes/{id}/files",
        "/v1/snapshots/{tag}/info",
      ]) {
        assert.ok(served.paths[route], `${route} documented`);
      }
    } finally {
      await app.close();
    }
  });
});
