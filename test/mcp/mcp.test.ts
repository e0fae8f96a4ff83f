/**
 * `forkd mcp` driven by the MCP SDK's own client, over stdio and over Streamable HTTP, against a real daemon with
 * real VMs: the tool list (forkd's tools and forkd v0.5's names), spawn, run code and commands, long output as a
 * resource, a command left running until a text appears, branch, fork from the branch, files, kill; hostile
 * arguments come back as tool errors and the server keeps serving. The HTTP transport refuses requests without
 * the token and with a foreign Host, and listens on loopback by default.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import http from "node:http";
import { createServer } from "node:net";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { packageRoot } from "../../src/image/package-root.js";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";

const FORKD_BIN = path.join(packageRoot(), "bin", "forkd.js");
const FORKD_MCP_BIN = path.join(packageRoot(), "bin", "forkd-mcp.js");

const FORKD_TOOLS = [
  "list_snapshots",
  "snapshot_info",
  "create_sandboxes",
  "fork_sandbox",
  "run_command",
  "stop_command",
  "run_code",
  "read_file",
  "write_file",
  "list_files",
  "pause_sandbox",
  "resume_sandbox",
  "kill_sandbox",
];
/** forkd v0.5's MCP server (sdk/mcp/forkd_mcp/server.py) and its argument names. */
const V05_TOOLS: Record<string, string[]> = {
  list_snapshots: [],
  spawn_sandboxes: ["snapshot_tag", "n", "per_child_netns", "memory_limit_mib", "prewarm", "live_fork"],
  branch_sandbox: ["sandbox_id", "tag", "diff", "measure_diff", "mode", "wait"],
  create_snapshot: ["tag", "kernel", "rootfs", "rw", "tap", "boot_wait_secs"],
  wait_for_text: ["sandbox_id", "path", "marker", "timeout_secs", "poll_interval_ms"],
  list_sandboxes: [],
  get_sandbox: ["sandbox_id"],
  kill_sandbox: ["sandbox_id"],
  exec_command: ["sandbox_id", "args", "timeout_secs"],
  eval_code: ["sandbox_id", "code"],
  ping_sandbox: ["sandbox_id"],
};

type Structured = Record<string, unknown>;

async function call(client: Client, name: string, args: Record<string, unknown>): Promise<Structured> {
  const answer = await client.callTool({ name, arguments: args });
  assert.notEqual(answer.isError, true, `${name}: ${JSON.stringify(answer.content)}`);
  const structured = answer.structuredContent as Structured | undefined;
  assert.ok(structured, `${name} answers structured content`);
  const text = (answer.content as { type: string; text: string }[])[0]?.text ?? "";
  assert.deepEqual(JSON.parse(text), structured, "the text content is the same JSON");
  return structured;
}

async function toolError(client: Client, name: string, args: Record<string, unknown>): Promise<string> {
  const answer = await client.callTool({ name, arguments: args });
  assert.equal(
    answer.isError,
    true,
    `${name} ${JSON.stringify(args)} should fail: ${JSON.stringify(answer.content)}`,
  );
  return (answer.content as { text: string }[])[0]?.text ?? "";
}

/** The same session on either transport: everything a model does, and what it must not be able to do. */
async function scenario(client: Client, daemon: TestDaemon): Promise<void> {
  const { tools } = await client.listTools();
  const byName = new Map(tools.map((t) => [t.name, t]));
  for (const name of [...FORKD_TOOLS, ...Object.keys(V05_TOOLS)]) {
    const tool = byName.get(name);
    assert.ok(tool, `tool ${name}`);
    assert.ok((tool.description ?? "").length > 20, `${name} has a description`);
    assert.equal(tool.inputSchema.type, "object");
  }
  for (const [name, args] of Object.entries(V05_TOOLS)) {
    assert.deepEqual(
      Object.keys(byName.get(name)?.inputSchema.properties ?? {})
        .filter((a) => args.includes(a))
        .sort(),
      [...args].sort(),
      `${name} takes v0.5's arguments`,
    );
  }

  const snapshots = (await call(client, "list_snapshots", {})).snapshots as { tag: string }[];
  assert.ok(snapshots.some((s) => s.tag === daemon.tag));
  const created = await call(client, "create_sandboxes", { snapshot_tag: daemon.tag, n: 1 });
  const [source] = created.sandboxes as { id: string; status: string }[];
  assert.equal(source?.status, "running");
  const id = (source as { id: string }).id;

  const code = await call(client, "run_code", {
    sandbox_id: id,
    code: "trail = ['start']\nimport numpy\nint(numpy.arange(10).sum())",
  });
  assert.deepEqual([code.result, code.error], ["45", null]);
  const raised = await call(client, "run_code", { sandbox_id: id, code: "1/0" });
  assert.equal((raised.error as { name: string }).name, "ZeroDivisionError");

  // Pause and resume: asleep, calls fail with the daemon's message; awake, the interpreter's state is there.
  assert.equal((await call(client, "pause_sandbox", { sandbox_id: id })).status, "paused");
  assert.match(await toolError(client, "run_code", { sandbox_id: id, code: "1" }), /paused/);
  assert.equal((await call(client, "resume_sandbox", { sandbox_id: id })).status, "running");
  assert.equal((await call(client, "run_code", { sandbox_id: id, code: "trail[0]" })).result, "'start'");

  // Long output: cut in the result, all of it in a resource.
  const long = await call(client, "run_command", { sandbox_id: id, command: "seq 1 20000" });
  assert.equal(long.exit_code, 0);
  assert.match(
    long.stdout as string,
    /truncated: \d+ characters in all; the full text is the resource forkd:\/\/outputs\/\d+/,
  );
  assert.ok((long.stdout as string).length < 10_000);
  const [resource] = long.full_output as string[];
  const full = await client.readResource({ uri: resource as string });
  assert.equal(
    (full.contents[0] as { text: string }).text,
    `${Array.from({ length: 20000 }, (_, i) => i + 1).join("\n")}\n`,
  );
  const failed = await call(client, "run_command", {
    sandbox_id: id,
    command: "echo out; echo err >&2; exit 4",
  });
  assert.deepEqual([failed.exit_code, failed.stdout, failed.stderr], [4, "out\n", "err\n"]);

  // A server-like command: answered once its text shows up, still running afterwards, then stopped.
  const started = await call(client, "run_command", {
    sandbox_id: id,
    command: "echo booting; sleep 1; echo READY >&2; exec sleep 300",
    wait_for_text: "READY",
    timeout_secs: 40,
  });
  assert.deepEqual([started.found, started.exit_code], [true, null]);
  const commandUri = `forkd://commands/${started.command_id}`;
  const state = JSON.parse(
    ((await client.readResource({ uri: commandUri })).contents[0] as { text: string }).text,
  );
  assert.equal(state.running, true);
  assert.deepEqual(await call(client, "stop_command", { command_id: started.command_id }), {
    command_id: started.command_id,
    stopped: true,
  });
  const missing = await call(client, "run_command", {
    sandbox_id: id,
    command: "echo nothing",
    wait_for_text: "NEVER",
    timeout_secs: 30,
  });
  assert.deepEqual(
    [missing.found, missing.exit_code],
    [false, 0],
    "the command ended before the text appeared",
  );

  // Files, and v0.5's wait_for_text on one.
  await call(client, "write_file", {
    sandbox_id: id,
    path: "/root/notes/plan.txt",
    content: "step 1\nREADY_TO_BRANCH\n",
  });
  const read = await call(client, "read_file", { sandbox_id: id, path: "/root/notes/plan.txt" });
  assert.deepEqual([read.content, read.encoding], ["step 1\nREADY_TO_BRANCH\n", "utf8"]);
  await call(client, "write_file", {
    sandbox_id: id,
    path: "/root/notes/bin",
    content: Buffer.from([0, 255]).toString("base64"),
    encoding: "base64",
  });
  assert.equal(
    (await call(client, "read_file", { sandbox_id: id, path: "/root/notes/bin" })).encoding,
    "base64",
  );
  const listing = await call(client, "list_files", { sandbox_id: id, path: "/root/notes" });
  assert.deepEqual((listing.entries as { name: string }[]).map((e) => e.name).sort(), ["bin", "plan.txt"]);
  const waited = await call(client, "wait_for_text", {
    sandbox_id: id,
    path: "/root/notes/plan.txt",
    marker: "READY_TO_BRANCH",
  });
  assert.equal(waited.found, true);

  // Branch (v0.5's tool and arguments), then fork from the branch; and fork_sandbox doing both at once.
  const branch = await call(client, "branch_sandbox", { sandbox_id: id, mode: "diff" });
  assert.equal(branch.branched_from, id);
  await call(client, "run_code", { sandbox_id: id, code: "trail.append('source')" });
  const fromBranch = await call(client, "create_sandboxes", { snapshot_tag: branch.tag, n: 1 });
  const child = (fromBranch.sandboxes as { id: string }[])[0]?.id as string;
  assert.equal((await call(client, "run_code", { sandbox_id: child, code: "trail" })).result, "['start']");
  const forked = await call(client, "fork_sandbox", { sandbox_id: child, n: 1 });
  const grandchild = (forked.sandboxes as { id: string }[])[0]?.id as string;
  assert.equal(
    (await call(client, "run_code", { sandbox_id: grandchild, code: "trail" })).result,
    "['start']",
  );
  const v05exec = await call(client, "exec_command", {
    sandbox_id: grandchild,
    args: ["cat", "/root/notes/plan.txt"],
  });
  assert.equal(v05exec.stdout, "step 1\nREADY_TO_BRANCH\n");

  // Hostile arguments: tool errors, with the daemon's message where the daemon refused; the server serves on.
  assert.match(await toolError(client, "run_code", { sandbox_id: "../../etc", code: "1" }), /sandbox_id/);
  assert.match(await toolError(client, "read_file", { sandbox_id: id, path: "/root/../etc/shadow" }), /path/);
  assert.match(await toolError(client, "read_file", { sandbox_id: id, path: "relative" }), /path/);
  assert.match(await toolError(client, "create_sandboxes", { snapshot_tag: "../x" }), /snapshot_tag/);
  assert.match(await toolError(client, "create_sandboxes", { snapshot_tag: daemon.tag, n: 100_000 }), /n/);
  assert.match(await toolError(client, "exec_command", { sandbox_id: id, args: [] }), /args/);
  assert.match(
    await toolError(client, "get_sandbox", { sandbox_id: "sb-abc-0000" }),
    /sandbox sb-abc-0000 not found/,
  );
  assert.match(
    await toolError(client, "read_file", { sandbox_id: id, path: "/no/such/file" }),
    /not found|no such/i,
  );
  assert.match(
    await toolError(client, "create_snapshot", { tag: "evil", kernel: "/etc/passwd", rootfs: "/etc/shadow" }),
    /is not allowed: kernel and rootfs must be/,
  );
  assert.match(await toolError(client, "run_command", { sandbox_id: id, command: "pwd", cwd: "tmp" }), /cwd/);
  assert.match(
    await toolError(client, "spawn_sandboxes", { snapshot_tag: daemon.tag, prewarm: true }),
    /prewarm=true: prewarm .* is not implemented/,
  );
  assert.match(await toolError(client, "stop_command", { command_id: "999" }), /no background command/);
  assert.match(await toolError(client, "no_such_tool", {}), /not found/);

  for (const sandbox of [grandchild, child, id]) {
    assert.deepEqual(await call(client, "kill_sandbox", { sandbox_id: sandbox }), {
      id: sandbox,
      killed: true,
    });
  }
  assert.deepEqual((await call(client, "list_sandboxes", {})).result, []);
  await daemon.controller.deleteSnapshot(forked.branch_tag as string);
  await daemon.controller.deleteSnapshot(branch.tag as string);
}

describe("forkd mcp on real VMs", { timeout: 30 * 60_000 }, () => {
  let daemon: TestDaemon;

  before(async () => {
    daemon = await startDaemon();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("over stdio, started as a forkd v0.5 MCP configuration does (forkd-mcp, FORKD_URL/FORKD_TOKEN)", async () => {
    // v0.5's documented client configuration: "command": "forkd-mcp", env FORKD_URL (TCP) and FORKD_TOKEN.
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [FORKD_MCP_BIN],
      env: {
        ...(process.env as Record<string, string>),
        FORKD_URL: daemon.tcpUrl,
        FORKD_TOKEN: daemon.token,
        FORKD_HTTP_TIMEOUT: "120",
      },
      stderr: "pipe",
    });
    let stderr = "";
    transport.stderr?.on("data", (d) => {
      stderr += d;
    });
    const client = new Client({ name: "forkd-test", version: "1.0.0" });
    await client.connect(transport);
    try {
      assert.equal(client.getServerVersion()?.name, "forkd");
      await scenario(client, daemon);
    } catch (err) {
      console.error(stderr);
      throw err;
    } finally {
      await client.close();
    }
  });

  it("over Streamable HTTP with a token, on loopback", async () => {
    const token = randomBytes(24).toString("hex");
    const port = await freePort();
    const server = startHttp(["--http", String(port)], {
      FORKD_MCP_TOKEN: token,
      FORKD_URL: daemon.socketUrl,
    });
    try {
      const url = await server.ready;
      assert.equal(url, `http://127.0.0.1:${port}/mcp`, "loopback unless told otherwise");
      const post = (headers: Record<string, string>) => postInitialize(port, headers);
      assert.equal(await post({}), 401, "no token");
      assert.equal(await post({ authorization: "Bearer not-the-token-0123456789" }), 401, "wrong token");
      assert.equal(
        await post({ authorization: `Bearer ${token}`, host: `attacker.example:${port}` }),
        403,
        "foreign Host",
      );
      assert.equal(
        await post({ authorization: `Bearer ${token}`, origin: "http://attacker.example" }),
        403,
        "foreign Origin",
      );

      const transport = new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { authorization: `Bearer ${token}` } },
      });
      const client = new Client({ name: "forkd-test", version: "1.0.0" });
      await client.connect(transport);
      try {
        assert.ok(transport.sessionId, "a session");
        await scenario(client, daemon);
        await transport.terminateSession();
      } finally {
        await client.close();
      }
    } catch (err) {
      console.error(server.stderr());
      throw err;
    } finally {
      await server.stop();
    }
    // Without a token the HTTP transport does not start.
    const refused = startHttp(["--http", String(port)], { FORKD_URL: daemon.socketUrl });
    assert.equal(await refused.exit, 2);
    assert.match(refused.stderr(), /needs a token: --token-file FILE .* or FORKD_MCP_TOKEN/);
  });
});

/** An MCP initialize request over a raw socket (so Host can be anything); resolves with the status. */
function postInitialize(port: number, headers: Record<string, string>): Promise<number> {
  const body = JSON.stringify({
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "x", version: "1" } },
  });
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        host: "127.0.0.1",
        port,
        path: "/mcp",
        method: "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          ...headers,
        },
      },
      (response) => {
        response.resume();
        resolve(response.statusCode ?? 0);
      },
    );
    request.once("error", reject);
    request.end(body);
  });
}

function startHttp(args: string[], env: Record<string, string>) {
  const child: ChildProcess = spawn(process.execPath, [FORKD_BIN, "mcp", ...args], {
    env: { ...process.env, FORKD_MCP_TOKEN: "", ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  const exit = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const ready = new Promise<string>((resolve, reject) => {
    child.stderr?.on("data", (d) => {
      stderr += d;
      const match = /MCP over HTTP at (\S+)/.exec(stderr);
      if (match) resolve(match[1] as string);
    });
    void exit.then((code) => reject(new Error(`forkd mcp exited (${code}):\n${stderr}`)));
  });
  ready.catch(() => {});
  return {
    ready,
    exit,
    stderr: () => stderr,
    stop: async () => {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exit;
    },
  };
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no TCP port");
  return address.port;
}
