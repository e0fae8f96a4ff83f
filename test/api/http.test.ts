/**
 * HTTP-level behaviour of the REST API through in-process injection (no socket needed for these): validation,
 * error shapes and statuses, v0.5 client bodies, 501 for unbuilt features, files, request ids, metrics. The services
 * behind it are the test double (test/api/services-double.ts): nothing here says anything about real sandboxes.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { FastifyInstance } from "fastify";
import { buildApi, MAX_JSON_BODY_BYTES } from "../../src/api/app.js";
import { redactHostPaths } from "../../src/api/errors.js";
import { MAX_FILE_TRANSFER_BYTES } from "../../src/api/schemas.js";
import { ServicesDouble } from "./services-double.js";

describe("REST API over the services test double", () => {
  let app: FastifyInstance;
  let double: ServicesDouble;
  let id: string;

  const call = async (
    method: string,
    url: string,
    payload?: unknown,
    headers: Record<string, string> = {},
  ) => {
    const response = await app.inject({ method: method as "GET", url, payload: payload as string, headers });
    const json = response.headers["content-type"]?.toString().startsWith("application/json")
      ? (response.json() as Record<string, unknown>)
      : undefined;
    return { status: response.statusCode, json, response };
  };
  const expectError = async (
    method: string,
    url: string,
    payload: unknown,
    status: number,
    pattern: RegExp,
    headers?: Record<string, string>,
  ) => {
    const { status: got, json, response } = await call(method, url, payload, headers);
    assert.equal(got, status, `${method} ${url}: ${response.body}`);
    assert.equal(typeof json?.error, "string", `error body: ${response.body}`);
    assert.match(json?.error as string, pattern);
    assert.deepEqual(Object.keys(json ?? {}).sort(), ["code", "error"]);
  };

  before(async () => {
    double = new ServicesDouble();
    app = await buildApi({ services: double, snapshotsDir: "/srv/snaps", transport: "inject" });
    const [first] = await double.sandboxes.spawn({ snapshotTag: "py", n: 1 });
    id = (first as { id: string }).id;
  });
  after(() => app.close());

  it("answers /healthz and /version", async () => {
    assert.deepEqual((await call("GET", "/healthz")).json, { ok: true });
    const version = (await call("GET", "/version")).json;
    assert.equal(version?.api, "v1");
    assert.match(String(version?.version), /^\d+\.\d+\.\d+/);
  });

  it("accepts the exact spawn bodies forkd v0.5 clients send", async () => {
    const bodies = [
      { snapshot_tag: "py", n: 2, per_child_netns: false }, // TypeScript SDK
      { snapshot_tag: "py", n: 1, per_child_netns: false, memory_limit_mib: null, prewarm: false }, // MCP server
      {
        snapshot_tag: "py",
        n: 1,
        per_child_netns: false,
        prewarm: false,
        live_fork: false,
        hugepages: false,
      }, // CLI
      { snapshot_tag: "py" },
    ];
    for (const body of bodies) {
      const { status, json, response } = await call("POST", "/v1/sandboxes", body);
      assert.equal(status, 201, response.body);
      const list = JSON.parse(response.body) as Record<string, unknown>[];
      assert.equal(list.length, body.n ?? 1);
      for (const key of [
        "id",
        "snapshot_tag",
        "netns",
        "guest_addr",
        "created_at_unix",
        "pid",
        "memory_limit_mib",
      ]) {
        assert.ok(key in (list[0] as object), `SandboxInfo has ${key}`);
      }
      assert.ok(Array.isArray(json), "an array of SandboxInfo");
    }
    assert.equal(double.lastSpawn?.memoryLimitMiB, undefined, "memory_limit_mib: null means no limit");
  });

  it("passes spawn options through and defaults n to 1", async () => {
    const { status } = await call("POST", "/v1/sandboxes", {
      snapshot_tag: "py",
      memory_limit_mib: 256,
      timeout_ms: 0,
    });
    assert.equal(status, 201);
    assert.deepEqual(
      { n: double.lastSpawn?.n, mem: double.lastSpawn?.memoryLimitMiB, t: double.lastSpawn?.timeoutMs },
      { n: 1, mem: 256, t: 0 },
    );
  });

  it("passes live_fork through to the spawn", async () => {
    const { status } = await call("POST", "/v1/sandboxes", { snapshot_tag: "py", live_fork: true });
    assert.equal(status, 201);
    assert.equal(double.lastSpawn?.liveFork, true);
  });

  it("accepts per_child_netns (every networked sandbox has one) and passes the network policy on", async () => {
    const spawned = await app.inject({
      method: "POST",
      url: "/v1/sandboxes",
      payload: {
        snapshot_tag: "py",
        per_child_netns: true,
        network: { egress: "deny", allow_out: ["pypi.org"] },
      },
    });
    assert.equal(spawned.statusCode, 201, spawned.body);
    // A list the request leaves out is not sent as []: the controller takes it from the template's default.
    assert.deepEqual(double.lastSpawn?.network, { default: "deny", allowOut: ["pypi.org"] });
    const info = (spawned.json() as { netns: string; guest_addr: string }[])[0];
    assert.match(info?.netns ?? "", /^forkd-sb-/);
    assert.equal(info?.guest_addr, "10.42.0.2:0");
    await expectError(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "py", per_child_netns: true, network: "none" },
      400,
      /contradicts network "none"/,
    );
    await expectError(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "py", network: { allow_out: "x" } },
      400,
      /"network"/,
    );
  });

  it("answers 501 naming the feature for v0.5 flags set to true", async () => {
    for (const flag of ["prewarm", "hugepages"]) {
      await expectError(
        "POST",
        "/v1/sandboxes",
        { snapshot_tag: "py", [flag]: true },
        501,
        new RegExp(`${flag}=true`),
      );
    }
  });

  it("rejects bad spawn requests with 400 naming the field", async () => {
    await expectError(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "py", n: 0 },
      400,
      /"n".*greater or equal to 1/,
    );
    await expectError(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "py", n: 100000 },
      400,
      /"n".*less or equal to 1000/,
    );
    await expectError("POST", "/v1/sandboxes", { snapshot_tag: "py", n: "2" }, 400, /"n": expected integer/);
    await expectError("POST", "/v1/sandboxes", { snapshot_tag: "py", n: 1.5 }, 400, /"n"/);
    await expectError(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "py", tag: "x" },
      400,
      /unknown body field "tag"/,
    );
    await expectError("POST", "/v1/sandboxes", { n: 1 }, 400, /missing body field "snapshot_tag"/);
    await expectError("POST", "/v1/sandboxes", [1, 2], 400, /expected a JSON object/);
    await expectError(
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "py", memory_limit_mib: 1 },
      400,
      /memory_limit_mib/,
    );
    await expectError("POST", "/v1/sandboxes", { snapshot_tag: "py", prewarm: "yes" }, 400, /"prewarm"/);
    for (const tag of ["../etc", "a/b", ".hidden", "", "x".repeat(65), "-dash", "a b"]) {
      await expectError("POST", "/v1/sandboxes", { snapshot_tag: tag }, 400, /"snapshot_tag": must match/);
    }
    assert.equal(double.sandboxes.list().filter((s) => s.snapshot_tag !== "py").length, 0);
  });

  it("answers malformed JSON, wrong content types and oversized bodies", async () => {
    const json = { "content-type": "application/json" };
    await expectError(
      "POST",
      "/v1/sandboxes",
      '{"snapshot_tag": "py",',
      400,
      /malformed JSON body: .*JSON/,
      json,
    );
    await expectError("POST", "/v1/sandboxes", '{"__proto__": {"x": 1}}', 400, /forbidden __proto__/, json);
    await expectError("POST", "/v1/sandboxes", "snapshot_tag=py", 415, /content type/, {
      "content-type": "application/x-www-form-urlencoded",
    });
    // A route whose schema is given per content type must not take a type it does not list.
    await expectError("POST", `/v1/sandboxes/${id}/exec/stream`, '{"args": ["true"]}', 415, /content type/, {
      "content-type": "text/plain",
    });
    const big = JSON.stringify({ snapshot_tag: "py", pad: "x".repeat(MAX_JSON_BODY_BYTES) });
    await expectError("POST", "/v1/sandboxes", big, 413, /too large/, json);
  });

  it("treats an empty JSON body as no body (v0.5 CLI pings so)", async () => {
    const { status, json } = await call("POST", `/v1/sandboxes/${id}/ping`, "", {
      "content-type": "application/json",
    });
    assert.equal(status, 200);
    assert.equal(json?.pong, true);
    assert.equal(json?.sandbox_id, id);
    assert.equal((await call("POST", `/v1/sandboxes/${id}/ping`)).status, 200, "no body, no content type");
  });

  it("error messages never show the daemon's host directories", async () => {
    // The double names argv[0] in its "command not found" error: a message that carries a host path.
    const { status, json } = await call("POST", `/v1/sandboxes/${id}/exec`, { args: ["/srv/snaps/x/tool"] });
    assert.equal(status, 404);
    const message = String(json?.error);
    assert.ok(!message.includes("/srv/"), message);
    assert.match(message, /\$FORKD_HOME\/snaps\/x\/tool/);
    assert.equal(
      redactHostPaths("a /var/lib/forkd/snapshots/t and /var/lib/forkd-other and /dev/shm/forkd-1/m", [
        { dir: "/var/lib/forkd", name: "$FORKD_HOME" },
        { dir: "/dev/shm/forkd-1", name: "$FORKD_TMPFS" },
      ]),
      "a $FORKD_HOME/snapshots/t and /var/lib/forkd-other and $FORKD_TMPFS/m",
    );
  });

  it("answers unknown and malformed ids", async () => {
    await expectError(
      "GET",
      "/v1/sandboxes/sb-ffffffffffff",
      undefined,
      404,
      /sandbox sb-ffffffffffff not found/,
    );
    await expectError("DELETE", "/v1/sandboxes/sb-ffffffffffff", undefined, 404, /not found/);
    await expectError("POST", "/v1/sandboxes/sb-ffffffffffff/exec", { args: ["echo"] }, 404, /not found/);
    await expectError("POST", "/v1/sandboxes/sb-ffffffffffff/eval", { code: "1" }, 404, /not found/);
    await expectError("GET", "/v1/sandboxes/..%2F..%2Fetc", undefined, 400, /"id": must match/);
    await expectError("GET", "/v1/snapshots/nope", undefined, 404, /snapshot "nope" not found/);
    await expectError("GET", "/v1/snapshots/..%2Fx/info", undefined, 400, /"tag"/);
    await expectError("DELETE", "/v1/snapshots/nope", undefined, 404, /not found/);
    await expectError("GET", "/v1/nothing", undefined, 404, /no route GET \/v1\/nothing/);
  });

  it("exec: v0.5 shape, exit codes, timeouts, stdin, argv limits", async () => {
    const ok = await call("POST", `/v1/sandboxes/${id}/exec`, { args: ["echo", "hi"], timeout_secs: 30 });
    assert.equal(ok.status, 200);
    assert.deepEqual([ok.json?.stdout, ok.json?.stderr, ok.json?.exit_code], ["hi\n", "", 0]);
    const failed = await call("POST", `/v1/sandboxes/${id}/exec`, { args: ["exit", "3"] });
    assert.deepEqual([failed.json?.exit_code, failed.json?.stderr], [3, "bye\n"]);
    const cat = await call("POST", `/v1/sandboxes/${id}/exec`, {
      args: ["cat"],
      stdin_b64: "AAH/",
      encoding: "base64",
    });
    assert.equal(cat.json?.stdout, "AAH/", "bytes round-trip with base64");
    await expectError("POST", `/v1/sandboxes/${id}/exec`, { args: [] }, 400, /"args".*1/);
    await expectError("POST", `/v1/sandboxes/${id}/exec`, { args: "echo hi" }, 400, /"args": expected array/);
    await expectError(
      "POST",
      `/v1/sandboxes/${id}/exec`,
      { args: ["echo"], timeout_secs: 0 },
      400,
      /timeout_secs/,
    );
    await expectError(
      "POST",
      `/v1/sandboxes/${id}/exec`,
      { args: ["echo"], timeout_secs: 1, timeout_ms: 1000 },
      400,
      /not both/,
    );
    await expectError(
      "POST",
      `/v1/sandboxes/${id}/exec`,
      { args: ["echo"], cwd: "tmp" },
      400,
      /"cwd".*absolute/,
    );
    await expectError(
      "POST",
      `/v1/sandboxes/${id}/exec`,
      { args: ["echo"], env: { "A=B": "x" } },
      400,
      /env/,
    );
    const huge = { args: Array.from({ length: 5000 }, () => "x") };
    await expectError("POST", `/v1/sandboxes/${id}/exec`, huge, 400, /"args".*4096/);
    const hugeBytes = { args: ["echo", ...Array.from({ length: 40 }, () => "y".repeat(100_000))] };
    await expectError("POST", `/v1/sandboxes/${id}/exec`, hugeBytes, 413, /too large/);
    const overHeader = { args: ["echo", ...Array.from({ length: 400 }, () => "z".repeat(200))] };
    await expectError(
      "POST",
      `/v1/sandboxes/${id}/exec`,
      overHeader,
      413,
      /take \d+ bytes; at most \d+ fit in one exec/,
    );
    const atLimit = await call("POST", `/v1/sandboxes/${id}/exec`, {
      args: ["echo", ...Array.from({ length: 250 }, () => "z".repeat(200))],
    });
    assert.equal(atLimit.status, 200, "a large argv under the limit runs");
  });

  it("eval: v0.5 shape with the exception as a string", async () => {
    const ok = await call("POST", `/v1/sandboxes/${id}/eval`, { code: "1+1" });
    assert.deepEqual([ok.json?.result, ok.json?.error, ok.json?.exit_code], ["'1+1'", null, 0]);
    const bad = await call("POST", `/v1/sandboxes/${id}/eval`, { code: "1/0" });
    assert.equal(bad.status, 200, "a Python exception is not an HTTP error");
    assert.deepEqual(
      [bad.json?.result, bad.json?.error, bad.json?.exit_code],
      [null, "ZeroDivisionError: division by zero", 1],
    );
    assert.equal(bad.json?.error_type, "ZeroDivisionError");
    await expectError("POST", `/v1/sandboxes/${id}/eval`, { code: 42 }, 400, /"code": expected string/);
    await expectError("POST", `/v1/sandboxes/${id}/eval`, {}, 400, /missing body field "code"/);
  });

  it("lifetimes, kill-many, kill", async () => {
    const set = await call("POST", `/v1/sandboxes/${id}/timeout`, { timeout_ms: 0 });
    assert.equal(set.json?.expires_at_unix_ms, null);
    await expectError("POST", `/v1/sandboxes/${id}/timeout`, { timeout_ms: -1 }, 400, /timeout_ms/);
    await expectError("POST", `/v1/sandboxes/${id}/timeout`, {}, 400, /missing body field "timeout_ms"/);
    await expectError("DELETE", "/v1/sandboxes", undefined, 400, /refusing to kill without a filter/);
    await expectError("DELETE", "/v1/sandboxes?all=true&snapshot_tag=py", undefined, 400, /not both/);
    await expectError("DELETE", "/v1/sandboxes?all=maybe", undefined, 400, /"all"/);
    double.addSnapshot("other");
    const [victim] = await double.sandboxes.spawn({ snapshotTag: "other", n: 1 });
    const killed = await call("DELETE", "/v1/sandboxes?snapshot_tag=other");
    assert.deepEqual(killed.json, { killed: [(victim as { id: string }).id] });
    const [single] = await double.sandboxes.spawn({ snapshotTag: "py", n: 1 });
    const sid = (single as { id: string }).id;
    const deleted = await call("DELETE", `/v1/sandboxes/${sid}`);
    assert.equal(deleted.status, 204);
    assert.equal(deleted.response.body, "");
    assert.equal((await call("GET", `/v1/sandboxes/${sid}`)).status, 404);
  });

  it("snapshots: list, info, create from a template or v0.5's kernel/rootfs, delete (cascade), compact", async () => {
    const list = JSON.parse((await call("GET", "/v1/snapshots")).response.body) as Record<string, unknown>[];
    const py = list.find((s) => s.tag === "py");
    assert.deepEqual([py?.dir, py?.status, py?.bootable], ["/srv/snaps/py", "ready", true]);
    double.addSnapshot("child", { parent_tag: "py" });
    double.addSnapshot("grandchild", { parent_tag: "child" });
    const info = (await call("GET", "/v1/snapshots/child/info")).json;
    assert.deepEqual([info?.chain_depth, info?.ancestors, info?.dependents], [1, ["py"], ["grandchild"]]);
    const created = await call("POST", "/v1/snapshots", { tag: "fresh", template: "python" });
    assert.equal(created.status, 201);
    assert.equal(created.json?.template, "python");
    await expectError("POST", "/v1/snapshots", { tag: "fresh", template: "python" }, 409, /already exists/);
    // forkd v0.5's MCP create_snapshot body: the files go to the service, which checks them (imageOfFiles).
    const v05 = await call("POST", "/v1/snapshots", {
      tag: "v05",
      kernel: "/k",
      rootfs: "/r",
      rw: false,
      boot_wait_secs: 10,
    });
    assert.equal(v05.status, 201, v05.response.body);
    assert.deepEqual(double.lastCreate?.image, { kernel: "/k", rootfs: "/r" });
    assert.equal(double.lastCreate?.template, undefined);
    await expectError("POST", "/v1/snapshots", { tag: "v05b", kernel: "/k" }, 400, /go together/);
    await expectError(
      "POST",
      "/v1/snapshots",
      { tag: "v05c", kernel: "/k", rootfs: "/r", tap: "forkd-tap0" },
      501,
      /tap/,
    );
    await expectError(
      "POST",
      "/v1/snapshots",
      { tag: "x", template: "../evil" },
      400,
      /"template": must match/,
    );
    assert.equal((await call("DELETE", "/v1/snapshots/fresh")).status, 204);
    await expectError("DELETE", "/v1/snapshots/child", undefined, 409, /dependents: grandchild/);
    assert.equal((await call("DELETE", "/v1/snapshots/child?cascade=true")).status, 204);
    assert.equal((await call("GET", "/v1/snapshots/grandchild")).status, 404);
    const compacted = await call("POST", "/v1/snapshots/py/compact", { to: "flat" });
    // 200, as forkd v0.5 answers a compaction.
    assert.deepEqual(
      [compacted.status, compacted.json?.tag, compacted.json?.parent_tag],
      [200, "flat", null],
    );
    await expectError("POST", "/v1/snapshots/py/compact", { to: "../x" }, 400, /"to"/);
  });

  it("snapshot-diff: a shell string runs under sh -c, argv as given; bad bodies are 400", async () => {
    const made = await call("POST", "/v1/snapshots/py/diff", { tag: "py-numpy", exec: "pip install numpy" });
    assert.equal(made.status, 201);
    assert.deepEqual([made.json?.tag, made.json?.exit_code, made.json?.stdout], ["py-numpy", 0, "ok\n"]);
    assert.deepEqual(double.lastSnapshotDiff?.command, ["/bin/sh", "-c", "pip install numpy"]);
    await call("POST", "/v1/snapshots/py/diff", {
      tag: "py-2",
      exec: ["python3", "-c", "1"],
      timeout_ms: 5000,
    });
    assert.deepEqual(double.lastSnapshotDiff?.command, ["python3", "-c", "1"]);
    assert.equal(double.lastSnapshotDiff?.timeoutMs, 5000);
    await expectError("POST", "/v1/snapshots/py/diff", { tag: "../x", exec: "true" }, 400, /"tag"/);
    await expectError("POST", "/v1/snapshots/py/diff", { tag: "ok" }, 400, /exec/);
    await expectError("POST", "/v1/snapshots/py/diff", { tag: "ok", exec: [] }, 400, /exec/);
  });

  it("branch: v0.5 bodies map onto modes; 201 with the snapshot and its cost; bad bodies are 400", async () => {
    const made = await call("POST", `/v1/sandboxes/${id}/branch`, {
      tag: "b1",
      mode: "diff",
      parent_tag: "py",
    });
    assert.equal(made.status, 201);
    // pause_ms is whole milliseconds (v0.5's CLI parses an integer); diff mode reports v0.5's measurements.
    assert.deepEqual(
      [made.json?.tag, made.json?.mode, made.json?.branched_from, made.json?.pause_ms, made.json?.status],
      ["b1", "diff", id, 4, "ready"],
    );
    assert.deepEqual(
      [made.json?.diff_ms, made.json?.diff_physical_bytes, made.json?.diff_logical_bytes],
      [2, 8192, 512 * 1024 * 1024],
    );
    assert.equal(double.lastBranch?.parentTag, "py");
    for (const [body, mode] of [
      [{ diff: true, measure_diff: false, wait: true }, "diff"],
      [{ diff: false }, "full"],
      [{ live: true, wait: false }, "live"],
      [{}, "full"],
      [{ measure_diff: true }, "full"],
    ] as const) {
      const res = await call("POST", `/v1/sandboxes/${id}/branch`, body);
      assert.equal(double.lastBranch?.mode, mode, JSON.stringify(body));
      assert.equal(res.status, mode === "live" ? 202 : 201);
      const measured = mode === "diff" || "measure_diff" in body;
      assert.equal("diff_ms" in (res.json ?? {}), measured, `${JSON.stringify(body)}: ${res.response.body}`);
      if (mode === "full") assert.equal(res.json?.parent_tag, null, "a full branch stands alone");
    }
    await expectError("POST", `/v1/sandboxes/${id}/branch`, { mode: "full", live: true }, 400, /contradicts/);
    await expectError("POST", `/v1/sandboxes/${id}/branch`, { mode: "turbo" }, 400, /"mode"/);
    await expectError("POST", `/v1/sandboxes/${id}/branch`, { tag: "../x" }, 400, /"tag"/);
    await expectError("POST", `/v1/sandboxes/${id}/branch`, { bogus: 1 }, 400, /unknown body field "bogus"/);
  });

  it("files: binary-safe round trip, listing, stat, remove, bad paths, 413", async () => {
    const bytes = Buffer.from([0, 1, 2, 0xff, 0x0a, 0x0d, 0x7b]);
    const put = await call("PUT", `/v1/sandboxes/${id}/files?path=/tmp/dir/a.bin&mode=0644`, bytes, {
      "content-type": "application/json", // still raw bytes: the files route never parses its body
    });
    assert.deepEqual(put.json, { path: "/tmp/dir/a.bin", bytes: bytes.length });
    const get = await call("GET", `/v1/sandboxes/${id}/files?path=/tmp/dir/a.bin`);
    assert.deepEqual(get.response.rawPayload, bytes);
    assert.equal(get.response.headers["content-type"], "application/octet-stream");
    const empty = await call("PUT", `/v1/sandboxes/${id}/files?path=/tmp/dir/empty`);
    assert.equal(empty.json?.bytes, 0);
    const listing = (await call("GET", `/v1/sandboxes/${id}/files/list?path=/tmp/dir`)).json;
    assert.deepEqual(((listing?.entries ?? []) as { name: string }[]).map((e) => e.name).sort(), [
      "a.bin",
      "empty",
    ]);
    const stat = (await call("GET", `/v1/sandboxes/${id}/files/stat?path=/tmp/dir/a.bin`)).json;
    assert.deepEqual([stat?.type, stat?.size, stat?.mode], ["file", bytes.length, 0o644]);
    assert.equal((await call("DELETE", `/v1/sandboxes/${id}/files?path=/tmp/dir/a.bin`)).status, 204);
    await expectError("GET", `/v1/sandboxes/${id}/files?path=/tmp/dir/a.bin`, undefined, 404, /no such file/);
    for (const bad of ["relative/x", "/tmp/../etc/passwd", "/tmp/./x", "/a\u0000b", ".."]) {
      await expectError(
        "GET",
        `/v1/sandboxes/${id}/files?path=${encodeURIComponent(bad)}`,
        undefined,
        400,
        /"path"/,
      );
    }
    await expectError(
      "GET",
      `/v1/sandboxes/${id}/files`,
      undefined,
      400,
      /missing query parameter field "path"/,
    );
    await expectError("DELETE", `/v1/sandboxes/${id}/files?path=/`, undefined, 400, /refusing to remove/);
    await expectError("PUT", `/v1/sandboxes/${id}/files?path=/tmp/x&mode=999`, "x", 400, /"mode"/);
    const tooBig = Buffer.alloc(MAX_FILE_TRANSFER_BYTES + 1);
    await expectError("PUT", `/v1/sandboxes/${id}/files?path=/tmp/big`, tooBig, 413, /too large/, {
      "content-type": "application/octet-stream",
    });
    double.filesByPath.set(`${id}:/tmp/huge`, Buffer.alloc(MAX_FILE_TRANSFER_BYTES + 10));
    await expectError("GET", `/v1/sandboxes/${id}/files?path=/tmp/huge`, undefined, 413, /larger than/);
  });

  it("echoes a well-formed X-Request-Id and replaces a malformed one", async () => {
    const echoed = await call("GET", "/healthz", undefined, { "x-request-id": "trace-42.a:b" });
    assert.equal(echoed.response.headers["x-request-id"], "trace-42.a:b");
    const replaced = await call("GET", "/healthz", undefined, { "x-request-id": "bad id\u0001" });
    assert.match(String(replaced.response.headers["x-request-id"]), /^[0-9a-f-]{36}$/);
    const generated = await call("GET", "/healthz");
    assert.match(String(generated.response.headers["x-request-id"]), /^[0-9a-f-]{36}$/);
  });

  it("exports Prometheus metrics computed from the services", async () => {
    const { response } = await call("GET", "/metrics");
    assert.match(String(response.headers["content-type"]), /^text\/plain/);
    const text = response.body;
    assert.match(text, /^forkd_build_info\{version="[^"]+",api="v1"\} 1$/m);
    assert.match(text, new RegExp(`^forkd_sandboxes_active ${double.sandboxes.list().length}$`, "m"));
    assert.match(text, new RegExp(`^forkd_snapshots_total ${double.snapshotsByTag.size}$`, "m"));
    assert.match(text, /^forkd_snapshot_bytes\{tag="py"\} 1234$/m);
    assert.match(text, /^forkd_spawn_duration_seconds_count\{outcome="ok"\} [1-9]/m);
    assert.match(text, /^forkd_exec_duration_seconds_count\{op="exec",outcome="ok"\} [1-9]/m);
    assert.match(
      text,
      /^forkd_http_errors_total\{method="POST",route="\/v1\/sandboxes",code="invalid_argument"\} [1-9]/m,
    );
    assert.match(text, /^forkd_sandbox_ready_seconds_count [1-9]/m);
    double.branchLoadNow = { inFlight: 1, cap: 7 };
    const again = (await call("GET", "/metrics")).response.body;
    assert.match(again, /^forkd_branches_in_flight 1$/m);
    assert.match(again, /^forkd_branch_concurrency_cap 7$/m);
  });

  it("times E2B's creates in the same spawn metrics as the forkd API's (the controller observes every spawn)", async () => {
    const count = async (series: RegExp) => {
      const text = (await call("GET", "/metrics")).response.body;
      return Number(series.exec(text)?.[1] ?? 0);
    };
    const spawnsOk = /^forkd_spawn_duration_seconds_count\{outcome="ok"\} (\d+)$/m;
    const spawnsFailed = /^forkd_spawn_duration_seconds_count\{outcome="error"\} (\d+)$/m;
    const ready = /^forkd_sandbox_ready_seconds_count (\d+)$/m;
    const [okBefore, failedBefore, readyBefore] = [
      await count(spawnsOk),
      await count(spawnsFailed),
      await count(ready),
    ];
    const created = await call("POST", "/sandboxes", { templateID: "py" });
    assert.equal(created.status, 201, created.response.body);
    assert.equal(await count(spawnsOk), okBefore + 1);
    assert.equal(await count(ready), readyBefore + 1);
    // A spawn the controller refuses counts as a failed one, whichever API asked.
    double.addSnapshot("unbootable", { bootable: false });
    const refused = await call("POST", "/sandboxes", { templateID: "unbootable" });
    assert.equal(refused.status, 409, refused.response.body);
    assert.equal(await count(spawnsFailed), failedBefore + 1);
  });

  it("packs: GET streams the pack and removes it after; POST unpack takes the raw body", async () => {
    const packed = await call("GET", "/v1/snapshots/py/pack?without_image=true&level=5");
    assert.equal(packed.status, 200, packed.response.body);
    assert.equal(packed.response.headers["content-type"], "application/zstd");
    assert.equal(packed.response.headers["x-forkd-pack-chain"], "py");
    assert.equal(packed.response.rawPayload.toString(), "pack of py\n".repeat(1000));
    assert.equal(packed.response.headers["content-length"], String(packed.response.rawPayload.length));
    await expectError("GET", "/v1/snapshots/nope/pack", undefined, 404, /not found/);
    await expectError("GET", "/v1/snapshots/py/pack?level=99", undefined, 400, /level/);
    const pack = Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0, 1, 2, 255]);
    const unpacked = await call("POST", "/v1/snapshots/unpack?tag=moved", pack, {
      "content-type": "application/zstd",
    });
    assert.equal(unpacked.status, 201, unpacked.response.body);
    assert.deepEqual([unpacked.json?.head, double.lastUnpacked], ["moved", pack]);
    await expectError(
      "POST",
      "/v1/snapshots/unpack",
      { not: "a pack" },
      400,
      /send the pack as application\/zstd/,
    );
    await expectError("POST", "/v1/snapshots/unpack?tag=../x", pack, 400, /"tag"/, {
      "content-type": "application/zstd",
    });
  });

  it("answers 404 for an unknown sandbox id of any safe shape, 400 for one that could be a path", async () => {
    for (const unknown of ["sb-abc-0000", "sb-0123456789ab-0001", "sandbox_7", "x"]) {
      for (const [method, suffix] of [
        ["GET", ""],
        ["DELETE", ""],
        ["POST", "/ping"],
      ] as const) {
        await expectError(method, `/v1/sandboxes/${unknown}${suffix}`, undefined, 404, /not found/);
      }
      await expectError(
        "POST",
        `/v1/sandboxes/${unknown}/exec`,
        { args: ["true"], timeout_secs: 30 },
        404,
        /not found/,
      );
    }
    for (const bad of [".hidden", "..x", "-x", "a%2Fb", "a%2F..%2Fb", "a%00b", "x".repeat(129)]) {
      await expectError("GET", `/v1/sandboxes/${bad}`, undefined, 400, /"id"/);
    }
  });

  it("a single daemon refuses a durable pause (a cluster's gateway makes them) and pauses nothing", async () => {
    double.lastPause = undefined;
    await expectError("POST", `/v1/sandboxes/${id}/pause`, { durable: true }, 400, /cluster's gateway/);
    assert.equal(double.lastPause, undefined);
  });
});
