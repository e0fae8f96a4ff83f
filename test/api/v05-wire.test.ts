/**
 * forkd v0.5's clients against a real `forkd daemon` with real VMs: every request here is the exact body, path
 * and headers one of v0.5's reference clients sends (its Python SDK `sdk/python/forkd/controller.py`, TypeScript
 * SDK `sdk/typescript/src/controller.ts`, MCP server `sdk/mcp/forkd_mcp/server.py`, CLI), over TCP with a bearer
 * token as they talk, and the daemon is started with the flags v0.5's systemd and Kubernetes files pass. Each test
 * is one gap those clients hit before (issue 11).
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, stat, symlink, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { buildImage, loadTemplate } from "../../src/image/index.js";
import { packageRoot } from "../../src/image/package-root.js";
import { qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import { type DaemonProcess, startDaemonProcess } from "./daemon-process.js";
import { type RawResponse, send, type Target } from "./raw-http.js";

const FORKD_BIN = path.join(packageRoot(), "bin", "forkd.js");
const FORKD_CONTROLLER_BIN = path.join(packageRoot(), "bin", "forkd-controller.js");

interface Sandbox {
  id: string;
  expires_at_unix_ms: number | null;
  has_branched: boolean;
  branch_count: number;
  last_branch_memory_path: string | null;
}

describe("forkd v0.5 clients' requests on real VMs", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let daemon: DaemonProcess | undefined;
  let tcp: Target;
  let token: string;
  let port: number;
  let tokenFile: string;

  /** What v0.5's Python SDK sends: JSON body with Content-Type, bearer token, nothing else. */
  const v05 = (method: string, route: string, body?: unknown): Promise<RawResponse> =>
    send(tcp, method, route, {
      headers: { authorization: `Bearer ${token}` },
      ...(body === undefined ? {} : { json: body }),
    });
  const ok = (answer: RawResponse, status: number): RawResponse => {
    assert.equal(answer.status, status, `${answer.text}\n${daemon?.log() ?? ""}`);
    return answer;
  };
  /** v0.5's Python `spawn_sandboxes(tag)`: per_child_netns always sent, nothing about a lifetime. */
  const spawnV05 = async (snapshotTag: string): Promise<Sandbox> => {
    const answer = ok(
      await v05("POST", "/v1/sandboxes", { snapshot_tag: snapshotTag, n: 1, per_child_netns: false }),
      201,
    );
    return (answer.json<Sandbox[]>() as Sandbox[])[0] as Sandbox;
  };
  const evalV05 = async (id: string, code: string): Promise<string | null> => {
    const answer = ok(await v05("POST", `/v1/sandboxes/${id}/eval`, { code }), 200);
    assert.equal(answer.json().error, null, answer.text);
    return answer.json().result as string | null;
  };
  const startDaemon = async (extra: string[] = []) => {
    daemon = await startDaemonProcess(
      home.home,
      [
        "--bind",
        `127.0.0.1:${port}`,
        "--token-file",
        tokenFile,
        // The flags forkd v0.5's packaging passes (packaging/systemd, packaging/k8s), naming this test's home.
        "--state",
        path.join(home.home, "state.json"),
        "--snapshot-root",
        home.snapshots,
        "--branch-concurrency",
        "3",
        ...extra,
      ],
      // The flags win over FORKD_HOME, which names a directory that does not even exist.
      { env: { FORKD_HOME: path.join(home.home, "not-the-home") } },
    );
    tcp = { host: "127.0.0.1", port };
  };

  before(async () => {
    home = await tempHome("forkd-v05-wire-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    token = randomBytes(24).toString("hex");
    tokenFile = path.join(home.home, "token");
    await writeFile(tokenFile, `${token}\n`, { mode: 0o600 });
    port = await freePort();
    await startDaemon();
  });
  after(async () => {
    if (daemon) await v05("DELETE", "/v1/sandboxes?all=true").catch(() => {});
    await daemon?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("the daemon takes v0.5's --state, --snapshot-root and --branch-concurrency, and exports v0.5's metrics", async () => {
    const listed = ok(await v05("GET", "/v1/snapshots"), 200).json<{ tag: string }[]>() as unknown as {
      tag: string;
    }[];
    assert.ok(
      listed.some((s) => s.tag === tag),
      "the home named by --state/--snapshot-root is used",
    );
    const metrics = ok(await v05("GET", "/metrics"), 200).text;
    assert.match(metrics, /^forkd_branch_concurrency_cap 3$/m);
    assert.match(metrics, /^forkd_branches_in_flight 0$/m);
    // v0.5's command line, `forkd-controller serve ...`; a snapshot root that is not <home>/snapshots is refused
    // before anything starts.
    const refused = await runCliProcess(
      ["serve", "--socket", path.join(home.home, "x.sock"), "--snapshot-root", "/var/tmp/elsewhere"],
      FORKD_CONTROLLER_BIN,
    ).done;
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /--snapshot-root \/var\/tmp\/elsewhere: .*named snapshots/);
    const notServe = await runCliProcess(["fork"], FORKD_CONTROLLER_BIN).done;
    assert.equal(notServe.code, 2);
  });

  it("a sandbox spawned without a lifetime lives until DELETE; unknown ids of v0.5's shape are 404", async () => {
    const sandbox = await spawnV05(tag);
    assert.equal(sandbox.expires_at_unix_ms, null, "no default lifetime on the v1 routes");
    assert.deepEqual(
      [sandbox.has_branched, sandbox.branch_count, sandbox.last_branch_memory_path],
      [false, 0, null],
    );
    // v0.5 ids look like sb-<hex>-<hex>: unknown here, so 404 with v0.5's message, on every route.
    for (const [method, route, body] of [
      ["GET", "/v1/sandboxes/sb-abc-0000", undefined],
      ["DELETE", "/v1/sandboxes/sb-abc-0000", undefined],
      ["POST", "/v1/sandboxes/sb-abc-0000/exec", { args: ["true"], timeout_secs: 30 }],
      ["POST", "/v1/sandboxes/sb-abc-0000/branch", {}],
    ] as const) {
      const answer = await v05(method, route, body);
      assert.equal(answer.status, 404, `${method} ${route}: ${answer.text}`);
      assert.equal(answer.json().error, "sandbox sb-abc-0000 not found");
    }
    // Still refused: an id that could be a path.
    const pathLike = await v05("GET", "/v1/sandboxes/..%2F..%2Fetc");
    assert.equal(pathLike.status, 400, pathLike.text);
    ok(await v05("DELETE", `/v1/sandboxes/${sandbox.id}`), 204);
  });

  it("BRANCH: v0.5 bodies default to full, a full branch stands alone, diff keeps its chain", async () => {
    const source = await spawnV05(tag);
    await evalV05(source.id, "X = 41");
    ok(
      await v05("POST", `/v1/sandboxes/${source.id}/exec`, {
        args: ["sh", "-c", "echo kept > /root/note"],
        timeout_secs: 30,
      }),
      200,
    );
    // v0.5 TypeScript SDK `branchSandbox(id, { diff: true })`.
    const diff = ok(await v05("POST", `/v1/sandboxes/${source.id}/branch`, { diff: true }), 201).json();
    assert.deepEqual([diff.mode, diff.parent_tag, diff.branched_from], ["diff", tag, source.id]);
    assert.ok(Number.isInteger(diff.pause_ms), `pause_ms ${diff.pause_ms} is an integer`);
    assert.ok(
      Number.isInteger(diff.diff_ms) && (diff.diff_physical_bytes as number) > 0,
      JSON.stringify(diff),
    );
    assert.equal(diff.diff_logical_bytes, 512 * 1024 * 1024);
    ok(await v05("DELETE", `/v1/sandboxes/${source.id}`), 204);

    const middle = await spawnV05(diff.tag as string);
    assert.equal(await evalV05(middle.id, "X += 1\nX"), "42");
    // v0.5 Python SDK `branch_sandbox(id, tag="full-1", measure_diff=True)`: neither mode nor diff, so full.
    const full = ok(
      await v05("POST", `/v1/sandboxes/${middle.id}/branch`, { tag: "full-1", measure_diff: true }),
      201,
    ).json();
    assert.deepEqual([full.tag, full.mode, full.parent_tag], ["full-1", "full", null]);
    assert.ok(Number.isInteger(full.pause_ms) && Number.isInteger(full.diff_ms), JSON.stringify(full));
    const info = ok(
      await v05("GET", `/v1/sandboxes/${middle.id}`),
      200,
    ).json<Sandbox>() as unknown as Sandbox;
    assert.deepEqual([info.has_branched, info.branch_count], [true, 1]);
    assert.equal(info.last_branch_memory_path, path.join(home.snapshots, "full-1", "memory.bin"));
    assert.ok((await stat(info.last_branch_memory_path as string)).size > 0);
    const detail = ok(await v05("GET", "/v1/snapshots/full-1/info"), 200).json();
    assert.deepEqual([detail.chain_depth, detail.ancestors], [0, []]);

    // v0.5 CLI `snapshot-compact` of the diff chain: 200 as v0.5 answers.
    const compacted = ok(
      await v05("POST", `/v1/snapshots/${diff.tag}/compact`, { to: "flat-diff" }),
      200,
    ).json();
    assert.deepEqual([compacted.tag, compacted.parent_tag], ["flat-diff", null]);

    // With the source gone nothing depends on the diff snapshot any more: v0.5's plain DELETE works (it was a 409
    // while full branches kept a parent edge).
    ok(await v05("DELETE", `/v1/sandboxes/${middle.id}`), 204);
    ok(await v05("DELETE", `/v1/snapshots/${diff.tag}`), 204);
    const child = await spawnV05("full-1");
    assert.equal(await evalV05(child.id, "X"), "42", "the full branch carries the state by itself");
    const note = ok(
      await v05("POST", `/v1/sandboxes/${child.id}/exec`, { args: ["cat", "/root/note"], timeout_secs: 30 }),
      200,
    );
    assert.equal(note.json().stdout, "kept\n", "and the disk the deleted chain wrote");
    ok(await v05("DELETE", `/v1/sandboxes/${child.id}`), 204);
    ok(await v05("DELETE", "/v1/snapshots/flat-diff"), 204);
  });

  it("POST /v1/snapshots with v0.5's kernel/rootfs: a built image is booted, anything else is a clear 400", async () => {
    const image = await buildImage(await loadTemplate("pyagent"), {});
    // Exactly v0.5's MCP `create_snapshot(tag, kernel, rootfs)` body (rw and boot_wait_secs always sent).
    const body = (kernel: string, rootfs: string, snapshotTag = "v05-raw") => ({
      tag: snapshotTag,
      kernel,
      rootfs,
      rw: false,
      boot_wait_secs: 10,
    });
    for (const [kernel, rootfs, why] of [
      ["/etc/passwd", image.rootfs, /kernel "\/etc\/passwd" is not allowed: .*allowed image directory/],
      [image.kernel, "/etc/shadow", /rootfs "\/etc\/shadow" is not allowed/],
      [image.kernel, "relative/rootfs.ext4", /not an absolute path/],
      [image.kernel, path.join(image.dir, "missing.ext4"), /does not exist/],
    ] as const) {
      const refused = await v05("POST", "/v1/snapshots", body(kernel, rootfs));
      assert.equal(refused.status, 400, refused.text);
      assert.match(refused.json().error as string, why);
    }
    // A symlink that leads out of the allowed directories is judged by its target.
    const outward = path.join(home.home, "links", "vmlinuz");
    await mkdir(path.dirname(outward), { recursive: true });
    await symlink("/etc/hostname", outward);
    const viaLink = await v05("POST", "/v1/snapshots", body(outward, image.rootfs));
    assert.equal(viaLink.status, 400, viaLink.text);
    assert.equal((await v05("GET", "/v1/snapshots/v05-raw")).status, 404, "a refusal leaves no trace");

    const created = ok(await v05("POST", "/v1/snapshots", body(image.kernel, image.rootfs)), 201).json();
    assert.deepEqual(
      [created.tag, created.status, created.bootable, created.template],
      ["v05-raw", "ready", true, "pyagent"],
    );
    const child = await spawnV05("v05-raw");
    assert.equal(await evalV05(child.id, "numpy.arange(4).sum()"), "6");
    ok(await v05("DELETE", `/v1/sandboxes/${child.id}`), 204);
    ok(await v05("DELETE", "/v1/snapshots/v05-raw"), 204);
  });

  it("forkd fork --settle-secs keeps the children until the time is up or SIGTERM (v0.5's Sandbox runs it)", async () => {
    const short = await runCli(["fork", "--tag", tag, "-n", "1", "--settle-secs", "2", "--json"]);
    assert.equal(short.code, 0, short.stderr);
    const result = JSON.parse(short.stdout) as { settle_ms: number; alive_after_settle: number };
    assert.ok(result.settle_ms >= 2000, `settled ${result.settle_ms} ms`);
    assert.equal(result.alive_after_settle, 1);

    // v0.5's Python `Sandbox` runs `forkd fork --tag T -n 1 --settle-secs 3600` and ends it with SIGTERM.
    const long = runCliProcess(["fork", "--tag", tag, "-n", "1", "--settle-secs", "3600"]);
    await waitFor("the child to settle", 300_000, async () =>
      long.stderr().includes("letting them run for 3600 s") ? true : undefined,
    );
    assert.equal(
      (await qemusMentioning(path.join(home.home, "run"))).length,
      1,
      "the child runs while settling",
    );
    const terminated = Date.now();
    long.child.kill("SIGTERM");
    const done = await long.done;
    assert.ok(Date.now() - terminated < 15_000, "SIGTERM ends the settle promptly");
    assert.equal(done.code, 130, done.stderr);
    assert.match(done.stdout, /1\/1 still alive after settling/);
    assert.deepEqual(await qemusMentioning(path.join(home.home, "run")), [], "the child was stopped");
  });

  it("--default-timeout-ms gives v1 spawns without timeout_ms a lifetime", async () => {
    await daemon?.stop();
    await startDaemon(["--default-timeout-ms", "120000"]);
    const before = Date.now();
    const sandbox = await spawnV05(tag);
    const expires = sandbox.expires_at_unix_ms as number;
    assert.ok(
      expires >= before + 110_000 && expires <= Date.now() + 120_000,
      `expires ${expires - before} ms after`,
    );
    ok(await v05("DELETE", `/v1/sandboxes/${sandbox.id}`), 204);
  });

  function runCliProcess(args: string[], bin = FORKD_BIN) {
    const child = spawn(process.execPath, [bin, ...args], {
      env: { ...process.env, FORKD_HOME: home.home },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout?.on("data", (d) => {
      stdout += d;
    });
    child.stderr?.on("data", (d) => {
      stderr += d;
    });
    const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) =>
      child.on("close", (code) => resolve({ code, stdout, stderr })),
    );
    return { child, done, stdout: () => stdout, stderr: () => stderr };
  }

  function runCli(args: string[]) {
    return runCliProcess(args).done;
  }
});

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no TCP port");
  return address.port;
}
