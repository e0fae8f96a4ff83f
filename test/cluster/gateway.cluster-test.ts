/**
 * The cluster suite (`npm run test:cluster`, not in `npm test`: it takes minutes): scripts/local-cluster.sh up
 * with 3 node daemons (each in its own network namespace and home, at most 2 sandboxes each so a fork of a few
 * spans nodes), 2 gateway replicas behind the Service's stand-in, the loopback registry and the real
 * kube-apiserver. Everything through the gateway with real clients: the forkd TypeScript and Python SDKs, MCP over
 * HTTP (the MCP SDK's client), the E2B JS SDK and the E2B Python SDK (e2b_code_interpreter); snapshot records
 * without host paths;
 * a snapshot only one node holds; a spawn that makes another node pull; a fork of N across nodes; tenants
 * isolated across nodes; faults: a registry outage (503 naming it, local work goes on), a gateway replica
 * killed and restarted (its directory rebuilt), a node daemon killed with -9 (detected, its sandboxes answered
 * "lost" at once, no call hangs, no create fails after detection, fenced when it returns), a node's link cut (the
 * same, with nothing answering at all on the way); a durable pause (forkd's, and E2B's under the gateways'
 * --durable-pause) resumed on another node after its node's kill -9. `down` leaves nothing.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, afterEach, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { KubeConfig } from "@kubernetes/client-node";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Sandbox as E2bSandbox, SandboxNotFoundError as E2bSandboxNotFound } from "e2b";
import { CLUSTER_HEADERS, NODE_ROUTES, type PushAnswer } from "../../src/cluster/protocol.js";
import { forkdObjects } from "../../src/kube/objects.js";
import {
  type ClusterState,
  listForkdNodes,
  loadState,
  NAMESPACE,
  startGateway,
  startNode,
  startRegistry,
} from "../../src/local-cluster/cluster.js";
import { leftovers, setNodeLink } from "../../src/local-cluster/network.js";
import { signalRecorded, waitGone } from "../../src/local-cluster/processes.js";
import { MCP_PATH } from "../../src/mcp/http.js";
import { Controller } from "../../src/sdk/index.js";
import { REPO_ROOT } from "../support/examples.js";
import { waitFor } from "../support/host.js";
import { e2bPythonVenv } from "../support/python-venv.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const run = promisify(execFile);
const root = process.getuid?.() === 0;
const SCRIPT = path.join(REPO_ROOT, "scripts", "local-cluster.sh");

interface Spawned {
  id: string;
  node?: string;
}

describe("a forkd cluster through its gateway", { skip: !root && "needs root", timeout: 40 * 60_000 }, () => {
  let dir: string;
  let seed: string;
  let state: ClusterState;
  /** kill -9 of a node daemon (the process local-cluster recorded for it): its entry, and when it was sent. */
  const killNodeDaemon = async (name: string) => {
    const victim = state.nodes.find((n) => n.name === name);
    assert.ok(victim?.process, `node ${name} has a recorded process`);
    const killedAt = Date.now();
    assert.ok(await signalRecorded(victim.process, "SIGKILL"));
    return { victim, killedAt };
  };
  let admin: Controller;
  let kube: KubeConfig;
  const env: Record<string, string> = {};
  const saved = { ...process.env };
  const alive: string[] = [];

  const tenant = (name: string) => new Controller({ url: state.url, token: state.tokens.tenants[name] });
  const spawn = async (
    c: Controller,
    tag: string,
    count = 1,
    requestTimeoutMs?: number,
  ): Promise<Spawned[]> => {
    const options = requestTimeoutMs === undefined ? {} : { requestTimeoutMs };
    const kids = (await c.spawnSandboxes({ snapshotTag: tag, n: count, ...options })) as unknown as Spawned[];
    alive.push(...kids.map((k) => k.id));
    return kids;
  };
  const sh = async (c: Controller, id: string, script: string) => {
    const r = await c.execCommand(id, ["sh", "-c", script]);
    assert.equal(r.exit_code, 0, r.stderr);
    return r.stdout.trim();
  };

  /** A call through the gateway this SDK has no method for: its status and JSON body. */
  const api = async (method: string, route: string, body?: unknown) => {
    const answer = await fetch(`${state.url}${route}`, {
      method,
      headers: { authorization: `Bearer ${env.FORKD_TOKEN}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: answer.status, json: (await answer.json()) as Record<string, unknown> };
  };

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-lc-"));
    seed = path.join(dir, "seed");
    // The seed home: the machine's shared warm pyagent, tagged pyagent (built once per machine).
    await linkSharedSnapshot(seed, "pyagent", "pyagent");
    const { stdout } = await run(
      SCRIPT,
      [
        "up",
        "--nodes",
        "3",
        "--gateways",
        "2",
        "--dir",
        path.join(dir, "cluster"),
        "--seed-home",
        seed,
        "--node-max-sandboxes",
        "2",
        // Every pause with memory durable, E2B's too (forkd's durable: true case says so itself).
        "--durable-pause",
      ],
      { encoding: "utf8", maxBuffer: 1 << 24 },
    );
    for (const line of stdout.split("\n")) {
      const m = /^export ([A-Z0-9_]+)=(.*)$/.exec(line);
      if (m) env[m[1] as string] = m[2] as string;
    }
    state = (await loadState(path.join(dir, "cluster"))) as ClusterState;
    Object.assign(process.env, {
      E2B_API_URL: env.E2B_API_URL,
      E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
      E2B_API_KEY: env.E2B_API_KEY,
    });
    admin = new Controller({ url: env.FORKD_URL, token: env.FORKD_TOKEN });
    kube = new KubeConfig();
    kube.loadFromFile(env.KUBECONFIG as string);
  });

  // A test that failed half-way leaves no sandbox behind to take the next tests' room (2 per node).
  afterEach(async () => {
    const ids = alive.splice(0);
    await Promise.allSettled(ids.map((id) => admin.killSandbox(id, { requestTimeoutMs: 10_000 })));
  });

  after(async () => {
    process.env = saved;
    if (state) {
      const down = await run(SCRIPT, ["down", "--dir", state.dir], { encoding: "utf8" }).catch(
        (err: { stderr?: string }) => err,
      );
      assert.equal((down as { stderr?: string }).stderr ?? "", "", "down leaves nothing");
      assert.deepEqual(await leftovers(state.network), []);
    }
    await rm(dir, { recursive: true, force: true });
  });

  it("prints the shell assignments, and kubectl's view shows the cluster", async () => {
    for (const name of [
      "FORKD_URL",
      "FORKD_TOKEN",
      "E2B_API_URL",
      "E2B_SANDBOX_URL",
      "E2B_API_KEY",
      "KUBECONFIG",
    ]) {
      assert.ok(env[name], `${name} printed`);
    }
    const nodes = await listForkdNodes(kube);
    assert.equal(nodes.length, 3);
    for (const n of nodes) {
      assert.ok(
        n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True"),
        `${n.metadata.name} Ready`,
      );
      assert.ok(
        n.status?.snapshots?.some((s) => s.digest === state.snapshot?.digest),
        `${n.metadata.name} pulled pyagent`,
      );
    }
    const status = JSON.parse(
      (await run(SCRIPT, ["status", "--dir", state.dir], { encoding: "utf8" })).stdout,
    );
    assert.equal(status.nodes.length, 3);
    assert.ok(status.nodes.every((n: { running: boolean; pid: number }) => n.running && n.pid > 0));
    assert.equal(status.gateway.replicas.length, 2);
  });

  it("the forkd TypeScript SDK: spawn, exec, list and kill through the gateway; the child says its node", async () => {
    const [kid] = await spawn(admin, "pyagent");
    assert.ok(kid?.node && /^node-[0-2]$/.test(kid.node), `node named: ${kid?.node}`);
    assert.equal(await sh(admin, kid.id, "python3 -c 'print(6*7)'"), "42");
    const listed = await admin.listSandboxes();
    assert.ok(listed.some((s) => s.id === kid.id));
    await admin.killSandbox(kid.id);
    await assert.rejects(admin.execCommand(kid.id, ["true"]), /404|not found|not_found/i);
  });

  it("the E2B JS SDK: create (default template), run a command, list, kill through the gateway", async () => {
    const sbx = await E2bSandbox.create({ timeoutMs: 300_000 });
    try {
      const ran = await sbx.commands.run("echo from-the-cluster; hostname >/dev/null");
      assert.equal(ran.stdout.trim(), "from-the-cluster");
      await sbx.files.write("/tmp/e2b.txt", "through the gateway");
      assert.equal(await sbx.files.read("/tmp/e2b.txt"), "through the gateway");
      const listed = await E2bSandbox.list().nextItems();
      assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId));
    } finally {
      await sbx.kill();
    }
  });

  it("the E2B Python SDK (e2b_code_interpreter): create, run_code, a command, kill through the gateway", async () => {
    const venv = await e2bPythonVenv();
    const script = [
      "from e2b_code_interpreter import Sandbox",
      "s = Sandbox.create(timeout=300)",
      "try:",
      "    print(s.run_code('6 * 7').text)",
      "    print(s.commands.run('echo py-through-the-gateway').stdout.strip())",
      "finally:",
      "    s.kill()",
    ].join("\n");
    const { stdout } = await run(venv.python, ["-c", script], {
      encoding: "utf8",
      timeout: 5 * 60_000,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/root",
        E2B_API_URL: env.E2B_API_URL,
        E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
        E2B_API_KEY: env.E2B_API_KEY,
      },
    });
    assert.deepEqual(stdout.trim().split("\n"), ["42", "py-through-the-gateway"]);
    process.stdout.write(`# python: e2b-code-interpreter ${venv.versions["e2b-code-interpreter"] ?? "?"}\n`);
  });

  it("the forkd Python SDK (sdk/python): create, run_code, a command, list, snapshots, kill through the gateway", async () => {
    const script = [
      "import json",
      "from forkd import Controller, Sandbox",
      "s = Sandbox.create('pyagent')",
      "try:",
      "    out = {'code': s.run_code('6 * 7').result,",
      "           'cmd': s.commands.run('echo forkd-py-through-the-gateway').stdout.strip(),",
      "           'listed': [x['id'] for x in Sandbox.list()], 'id': s.sandbox_id,",
      "           'snapshots': Controller().list_snapshots()}",
      "finally:",
      "    s.kill()",
      "print(json.dumps(out))",
    ].join("\n");
    const { stdout } = await run(
      existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3",
      ["-c", script],
      {
        encoding: "utf8",
        timeout: 5 * 60_000,
        env: {
          PATH: process.env.PATH ?? "",
          PYTHONPATH: path.join(REPO_ROOT, "sdk", "python"),
          FORKD_URL: env.FORKD_URL,
          FORKD_TOKEN: env.FORKD_TOKEN,
        },
      },
    );
    const out = JSON.parse(stdout) as {
      code: string;
      cmd: string;
      listed: string[];
      id: string;
      snapshots: Record<string, unknown>[];
    };
    assert.equal(out.code, "42");
    assert.equal(out.cmd, "forkd-py-through-the-gateway");
    assert.ok(out.listed.includes(out.id), "listed across the cluster");
    assert.ok(out.snapshots.some((s) => s.tag === "pyagent" && !("dir" in s)));
    await assert.rejects(admin.getSandbox(out.id), /not found|not_found|404/i);
  });

  it("MCP over HTTP through the Service: a tenant's session creates, runs and kills, and sees only its own", async () => {
    const other = await spawn(tenant("beta"), "pyagent");
    const mcpClient = async (url: string, sessionId?: string) => {
      const transport = new StreamableHTTPClientTransport(new URL(MCP_PATH, url), {
        sessionId,
        requestInit: { headers: { authorization: `Bearer ${state.tokens.tenants.alpha}` } },
      });
      const client = new McpClient({ name: "forkd-cluster-test", version: "0" });
      await client.connect(transport);
      return { client, sessionId: transport.sessionId as string };
    };
    const callOn = async (client: McpClient, name: string, args: Record<string, unknown>) => {
      const answer = await client.callTool({ name, arguments: args });
      assert.notEqual(answer.isError, true, `${name}: ${JSON.stringify(answer.content)}`);
      return answer.structuredContent as Record<string, unknown>;
    };
    // Through the Service's stand-in, which spreads connections over the replicas (docs/kubernetes.md).
    const { client, sessionId } = await mcpClient(state.url);
    const call = (name: string, args: Record<string, unknown>) => callOn(client, name, args);
    try {
      const created = await call("create_sandboxes", { snapshot_tag: "pyagent", n: 1 });
      const [mine] = created.sandboxes as { id: string; status: string }[];
      assert.equal(mine?.status, "running");
      alive.push(mine.id);
      const ran = await call("run_command", { sandbox_id: mine.id, command: "echo mcp-through-the-gateway" });
      assert.deepEqual([ran.exit_code, ran.stdout], [0, "mcp-through-the-gateway\n"]);
      assert.equal((await call("run_code", { sandbox_id: mine.id, code: "6 * 7" })).result, "42");
      // The same session continued at each replica by name: the one that holds it and the one that relays.
      for (const replica of state.gateways) {
        const there = await mcpClient(replica.url, sessionId);
        const echoed = await callOn(there.client, "run_command", {
          sandbox_id: mine.id,
          command: "echo again",
        });
        assert.equal(echoed.stdout, "again\n", `the session at replica ${replica.index}`);
        await there.client.close(); // closes its connection only; the session goes on
      }
      const listed = ((await call("list_sandboxes", {})).result as { id: string }[]).map((x) => x.id);
      assert.deepEqual(listed, [mine.id], "alpha's session sees alpha's sandbox only");
      const refused = await client.callTool({
        name: "kill_sandbox",
        arguments: { sandbox_id: other[0]?.id },
      });
      assert.equal(refused.isError, true, "beta's sandbox is not alpha's to kill");
      assert.equal((await call("kill_sandbox", { sandbox_id: mine.id })).killed, true);
    } finally {
      for (const k of other) await tenant("beta").killSandbox(k.id);
      await client.close();
    }
  });

  it("tenants are isolated across nodes", async () => {
    const alpha = tenant("alpha");
    const beta = tenant("beta");
    const [a] = await spawn(alpha, "pyagent");
    const [b] = await spawn(beta, "pyagent");
    assert.ok(a && b);
    assert.deepEqual(
      (await alpha.listSandboxes()).map((s) => s.id),
      [a.id],
    );
    assert.deepEqual(
      (await beta.listSandboxes()).map((s) => s.id),
      [b.id],
    );
    await assert.rejects(beta.execCommand(a.id, ["true"]), /not found|not_found|404/i);
    await assert.rejects(beta.killSandbox(a.id), /not found|not_found|404/i);
    assert.equal(await sh(alpha, a.id, "echo mine"), "mine");
    const all = (await admin.listSandboxes()).map((s) => s.id);
    assert.ok(all.includes(a.id) && all.includes(b.id), "the admin sees both");
    await alpha.killSandbox(a.id);
    await beta.killSandbox(b.id);
  });

  it("snapshot records through the gateway name no host path (list, one, info)", async () => {
    const homes = state.nodes.map((n) => n.home);
    const answers = [
      await api("GET", "/v1/snapshots"),
      await api("GET", "/v1/snapshots/pyagent"),
      await api("GET", "/v1/snapshots/pyagent/info"),
    ];
    for (const answer of answers) assert.equal(answer.status, 200, JSON.stringify(answer.json));
    const [list, one, info] = answers.map((a) => a.json as unknown);
    const records = [...(list as Record<string, unknown>[]), one, info] as Record<string, unknown>[];
    assert.ok((list as unknown[]).length > 0, "the cluster lists its snapshots");
    for (const record of records) {
      assert.ok(!("dir" in record), `no dir: ${JSON.stringify(record)}`);
      const text = JSON.stringify(record);
      for (const home of homes) assert.ok(!text.includes(home), `${home} appears in ${text}`);
    }
    const pyagent = (list as { tag: string; nodes: string[] }[]).find((s) => s.tag === "pyagent");
    assert.equal(pyagent?.nodes.length, 3, "every node holds pyagent");
  });

  it("a snapshot only one node holds is spawned there; with that node cordoned, another node pulls it", async () => {
    const [source] = await spawn(admin, "pyagent");
    assert.ok(source?.node);
    await sh(admin, source.id, "echo written-before-branch > /root/mark && sync");
    const branch = (await admin.branchSandbox(source.id)) as unknown as { tag: string; node?: string };
    assert.ok(!("dir" in branch), `the BRANCH answer names no host path: ${JSON.stringify(branch)}`);
    assert.equal(branch.node, source.node);
    // A BRANCH lives on its node only: a spawn of it goes there, also at once (before the node's event stream
    // has reported the new snapshot, and through either gateway replica).
    const [local] = await spawn(admin, branch.tag);
    assert.equal(local?.node, source.node, "placed on the only node holding it");
    assert.equal(await sh(admin, local.id, "cat /root/mark"), "written-before-branch");
    await admin.killSandbox(local.id);
    await admin.killSandbox(source.id);

    // Published: pushed by its node to the registry (as the controller would), declared as a ForkdSnapshot.
    const node = state.nodes.find((n) => n.name === source.node);
    assert.ok(node);
    const nodeObject = (await listForkdNodes(kube)).find((n) => n.metadata.name === node.name);
    const reference = `${state.registry}/forkd/branched:v1`;
    const pushed = await fetch(`${node.url}${NODE_ROUTES.push}`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        [CLUSTER_HEADERS.token]: state.tokens.node as string,
        [CLUSTER_HEADERS.epoch]: String(nodeObject?.spec.epoch ?? 0),
      },
      body: JSON.stringify({ tag: branch.tag, reference, insecure: true }),
    });
    assert.equal(pushed.status, 200, await pushed.clone().text());
    const { digest } = (await pushed.json()) as PushAnswer;
    await forkdObjects(kube, NAMESPACE).snapshots.create("branched", { reference, digest, prepull: 0 });
    await cordon(node.name, true);
    try {
      const [pulled] = await waitFor(
        "the gateway to see the cordon and the ForkdSnapshot",
        30_000,
        // A spawn that pulls the chain first (14 s quiet, minutes under load): beyond the SDK's 60 s default.
        async () =>
          spawn(admin, "branched", 1, 5 * 60_000).catch((err: Error) =>
            /not found|unschedulable|no node/i.test(err.message) ? undefined : Promise.reject(err),
          ),
      );
      assert.ok(pulled?.node && pulled.node !== node.name, `placed on another node: ${pulled?.node}`);
      assert.equal(
        await sh(admin, pulled.id, "cat /root/mark"),
        "written-before-branch",
        "the pulled chain is the branch",
      );
      const holder = (await listForkdNodes(kube)).find((n) => n.metadata.name === pulled.node);
      await waitFor("the puller's ForkdNode to list the digest", 30_000, async () => {
        const n = (await listForkdNodes(kube)).find((x) => x.metadata.name === pulled.node);
        return n?.status?.snapshots?.some((s) => s.digest === digest) ? true : undefined;
      });
      assert.ok(holder);
      await admin.killSandbox(pulled.id);
    } finally {
      await cordon(node.name, false);
    }
  });

  async function cordon(name: string, unschedulable: boolean): Promise<void> {
    await forkdObjects(kube, NAMESPACE).nodes.patchSpec(name, { unschedulable });
  }

  it("a fork of N across nodes: branched once, each child correct and independent, each saying its node", async () => {
    const [source] = await spawn(admin, "pyagent");
    assert.ok(source);
    await sh(admin, source.id, "echo parent-state > /root/fork-mark && sync");
    const forked = await api("POST", `/v1/sandboxes/${source.id}/fork`, { count: 3 });
    assert.equal(forked.status, 200, JSON.stringify(forked.json));
    const answer = forked.json as unknown as { children: { sandbox: Spawned | null; error: unknown }[] };
    const kids = answer.children.map((c) => c.sandbox).filter((s): s is Spawned => s !== null);
    alive.push(...kids.map((k) => k.id));
    assert.equal(kids.length, 3, JSON.stringify(answer.children.map((c) => c.error)));
    const nodes = new Set(kids.map((k) => k.node));
    assert.ok(nodes.size >= 2, `children on ${[...nodes].join(", ")}: 2 per node cannot hold 1 + 3 on one`);
    for (const [i, kid] of kids.entries()) {
      assert.equal(await sh(admin, kid.id, "cat /root/fork-mark"), "parent-state");
      await sh(admin, kid.id, `echo child-${i} > /root/own`);
    }
    for (const [i, kid] of kids.entries())
      assert.equal(await sh(admin, kid.id, "cat /root/own"), `child-${i}`);
    for (const id of [source.id, ...kids.map((k) => k.id)]) await admin.killSandbox(id);
  });

  it("a registry outage answers 503 naming the registry; local work goes on", async () => {
    // A ForkdSnapshot no node holds (its digest was never pushed): a spawn of it needs a pull.
    const digest = `sha256:${createHash("sha256").update("forkd cluster test: never pushed").digest("hex")}`;
    const snapshots = forkdObjects(kube, NAMESPACE).snapshots;
    await snapshots.create("unpulled", {
      reference: `${state.registry}/forkd/unpulled:v1`,
      digest,
      prepull: 0,
    });
    try {
      const registry = state.processes.registry;
      assert.ok(registry);
      assert.ok(await signalRecorded(registry, "SIGKILL"));
      await waitGone(registry, 10_000);
      const started = Date.now();
      // Both gateway replicas must have read the new ForkdSnapshot (each reads the cluster every second).
      const refused = await waitFor("the gateway to see the ForkdSnapshot", 30_000, async () => {
        const answer = await api("POST", "/v1/sandboxes", { snapshot_tag: "unpulled", n: 1 });
        return answer.status === 404 ? undefined : answer;
      });
      assert.equal(refused.status, 503, JSON.stringify(refused.json));
      const host = state.registry.replace(/[.]/g, "\\.");
      assert.match(String(refused.json.error), new RegExp(`registry ${host} is unavailable`));
      assert.ok(Date.now() - started < 60_000);
    } finally {
      await snapshots.delete("unpulled");
    }
    const [kid] = await spawn(admin, "pyagent");
    // The registry back (its data was kept): the cases after this one push to it (the durable pause).
    await startRegistry(state);
    assert.ok(kid);
    assert.equal(await sh(admin, kid.id, "echo still-working"), "still-working");
    await admin.killSandbox(kid.id);
  });

  it("a gateway replica killed and restarted loses nothing: its directory is rebuilt", async () => {
    const [kid] = await spawn(admin, "pyagent");
    assert.ok(kid);
    const gateway = state.gateways[0];
    assert.ok(gateway?.process);
    assert.ok(await signalRecorded(gateway.process, "SIGKILL"));
    await waitGone(gateway.process, 10_000);
    // Through the Service's stand-in, the other replica answers meanwhile.
    for (let i = 0; i < 4; i++) assert.equal(await sh(admin, kid.id, "echo via-the-other"), "via-the-other");
    await startGateway(state, gateway);
    const direct = new Controller({ url: gateway.url, token: env.FORKD_TOKEN });
    await waitFor("the restarted replica to answer", 60_000, async () =>
      (await direct.isReachable()) ? true : undefined,
    );
    const found = await waitFor("the restarted replica to know the sandbox", 30_000, async () =>
      direct.execCommand(kid.id, ["echo", "found"]).catch(() => undefined),
    );
    assert.equal(found.stdout.trim(), "found");
    await admin.killSandbox(kid.id);
  });

  it("kill -9 of a node daemon: detected, its sandboxes lost at once, no hang, no failed create; fenced on return", async () => {
    const kids = await spawn(admin, "pyagent", 2);
    const victimName = kids[0]?.node as string;
    const onVictim = kids.filter((k) => k.node === victimName);
    const { victim, killedAt } = await killNodeDaemon(victimName);
    let slowest = 0;
    const detected = await waitFor("the gateway to call the node's sandboxes lost", 60_000, async () => {
      const t = Date.now();
      const err = await admin
        .execCommand(onVictim[0]?.id as string, ["true"], { requestTimeoutMs: 20_000 })
        .then(
          () => undefined,
          (e: Error) => e,
        );
      slowest = Math.max(slowest, Date.now() - t);
      return err && /lost/.test(err.message) ? Date.now() : undefined;
    });
    const detectionMs = detected - killedAt;
    console.log(`# detection of a kill -9'd node: ${detectionMs} ms; slowest call meanwhile ${slowest} ms`);
    assert.ok(detectionMs < 45_000, `detected in ${detectionMs} ms`);
    // After detection: answered at once, and creates land elsewhere (none fails).
    const t = Date.now();
    await assert.rejects(admin.getSandbox(onVictim[0]?.id as string), /lost/);
    assert.ok(Date.now() - t < 2_000, "a lost sandbox is answered at once");
    for (let i = 0; i < 2; i++) {
      const [k] = await spawn(admin, "pyagent");
      assert.ok(k?.node && k.node !== victimName, `placed on a live node: ${k?.node}`);
      await admin.killSandbox(k.id);
    }
    // The node returns: fenced (epoch raised), it kills what it no longer owns; no duplicate appears.
    await startNode(state, victim);
    await waitFor("the returned node to run under its new epoch", 120_000, async () => {
      const n = (await listForkdNodes(kube)).find((x) => x.metadata.name === victimName);
      return n && n.spec.epoch > 0 && n.status?.observedEpoch === n.spec.epoch ? true : undefined;
    });
    const listed = (await admin.listSandboxes()).map((s) => s.id);
    for (const k of onVictim) assert.ok(!listed.includes(k.id), `${k.id} did not come back`);
    for (const k of kids.filter((k) => k.node !== victimName)) await admin.killSandbox(k.id);
  });
  it("a durable pause survives its node: kill -9, fenced, resumed on another node under its id with its file and variable; the node does not bring it back", async () => {
    const [kid] = await spawn(admin, "pyagent");
    const id = kid?.id as string;
    const from = kid?.node as string;
    await sh(admin, id, 'echo durable-file > "$HOME/durable.txt"');
    await admin.evalCode(id, "durable_var = 4242");
    const started = Date.now();
    const paused = await api("POST", `/v1/sandboxes/${id}/pause`, { durable: true });
    assert.equal(paused.status, 200, JSON.stringify(paused.json));
    const made = paused.json.durable as {
      push_ms: number;
      status_ms: number;
      uploaded_bytes: number;
      digest: string;
    };
    console.log(
      `# durable pause: ${Date.now() - started} ms in all; the pause ${paused.json.pause_ms} ms (+ write ${paused.json.write_ms} ms); push ${made.push_ms} ms (${made.uploaded_bytes} bytes uploaded); status write ${made.status_ms} ms`,
    );
    const objects = forkdObjects(kube, NAMESPACE);
    const listedOn = async (name: string) =>
      ((await objects.nodes.get(name)).status?.durablePauses ?? []).map((p) => p.id);
    assert.deepEqual(await listedOn(from), [id]);
    const { victim, killedAt } = await killNodeDaemon(from);
    const seen = new Set<string>();
    const resumed = await waitFor(
      "the resume through the gateway to succeed elsewhere",
      240_000,
      async () => {
        const answer = await fetch(`${state.url}/v1/sandboxes/${id}/resume`, {
          method: "POST",
          headers: { authorization: `Bearer ${env.FORKD_TOKEN}`, "content-type": "application/json" },
          body: "{}",
          signal: AbortSignal.timeout(60_000),
        }).catch((err: Error) => ({ status: 0, json: async () => ({ message: err.message }) }));
        const body = (await answer.json()) as Record<string, unknown>;
        seen.add(`${answer.status} ${JSON.stringify(body).slice(0, 160)}`);
        assert.notEqual(answer.status, 404, `never answered not found: ${JSON.stringify(body)}`);
        return answer.status === 200 ? Date.now() : undefined;
      },
    );
    console.log(
      `# durable pause resumed elsewhere ${resumed - killedAt} ms after the kill -9; answers meanwhile: ${[...seen].join(" | ")}`,
    );
    assert.ok(
      [...seen].some((line) => line.startsWith("503") && line.includes("being moved")),
      [...seen].join("\n"),
    );
    const where = (await admin.listSandboxes()) as unknown as { id: string; node?: string; status: string }[];
    const mine = where.filter((s) => s.id === id);
    assert.equal(mine.length, 1);
    assert.ok(mine[0]?.node && mine[0].node !== from, `on another node: ${mine[0]?.node}`);
    assert.equal(await sh(admin, id, 'cat "$HOME/durable.txt"'), "durable-file");
    const value = await admin.evalCode(id, "durable_var + 1");
    assert.match(JSON.stringify(value), /4243/);
    // Resumed on the adopter: nothing can use the pushed artifact any more, so it is deleted from the registry.
    const manifest = `http://${state.registry}/v2/forkd/paused/${id}/manifests/${made.digest}`;
    const deletedAfter = await waitFor("the artifact to be deleted from the registry", 60_000, async () => {
      const answer = await fetch(manifest, {
        method: "HEAD",
        headers: { accept: "application/vnd.oci.image.manifest.v1+json" },
      });
      return answer.status === 404 ? Date.now() - resumed : undefined;
    });
    console.log(`# the artifact deleted ${deletedAfter} ms after the resume`);
    // The node returns fenced: it drops the handed-over entry and does not bring the sandbox back.
    await startNode(state, victim);
    await waitFor("the returned node to run under its new epoch", 120_000, async () => {
      const n = (await listForkdNodes(kube)).find((x) => x.metadata.name === from);
      return n && n.spec.epoch > 0 && n.status?.observedEpoch === n.spec.epoch ? true : undefined;
    });
    await waitFor("the returned node to drop the entry", 30_000, async () =>
      (await listedOn(from)).includes(id) ? undefined : true,
    );
    // Both hand-over lists are pruned: the adoption (done), then the hand-over (the entry dropped).
    await waitFor("the controller to prune the adoption and the hand-over", 30_000, async () => {
      const nodes = await listForkdNodes(kube);
      const left = nodes.flatMap((n) => [...(n.spec.adoptions ?? []), ...(n.spec.handedOver ?? [])]);
      return left.some((entry) => entry.id === id) ? undefined : true;
    });
    const after = ((await admin.listSandboxes()) as unknown as { id: string; node?: string }[]).filter(
      (s) => s.id === id,
    );
    assert.deepEqual(
      after.map((s) => s.node),
      [mine[0]?.node],
    );
    await admin.killSandbox(id);
  });

  it("E2B's pause under --durable-pause survives its node: the E2B JS SDK's connect resumes it on another node under its id, its file and process there (and the Python SDK connects to it)", async () => {
    const sbx = await E2bSandbox.create({ timeoutMs: 600_000 });
    const id = sbx.sandboxId;
    alive.push(id);
    const home = (
      await sbx.commands.run('echo e2b-durable-file > "$HOME/e2b-durable.txt"; echo "$HOME"')
    ).stdout.trim();
    const sleeper = await sbx.commands.run("sleep 86400", { background: true });
    const nodeOf = async () =>
      ((await admin.listSandboxes()) as unknown as { id: string; node?: string }[]).filter(
        (s) => s.id === id,
      );
    const from = (await nodeOf())[0]?.node as string;
    assert.ok(from);
    const started = Date.now();
    assert.equal(await sbx.betaPause(), true);
    const pauseMs = Date.now() - started;
    const listed = ((await forkdObjects(kube, NAMESPACE).nodes.get(from)).status?.durablePauses ?? []).map(
      (p) => p.id,
    );
    assert.ok(listed.includes(id), `node ${from} lists the durable pause: ${listed.join(",")}`);
    const { victim, killedAt } = await killNodeDaemon(from);
    const seen = new Set<string>();
    const connected = await waitFor(
      "E2B's connect through the gateway to resume it elsewhere",
      240_000,
      async () => {
        try {
          return await E2bSandbox.connect(id, { timeoutMs: 600_000, requestTimeoutMs: 60_000 });
        } catch (err) {
          const e = err as Error;
          seen.add(`${e.name}: ${e.message.slice(0, 200)}`);
          assert.ok(!(err instanceof E2bSandboxNotFound), `never not found: ${e.message}`);
          await new Promise((resolve) => setTimeout(resolve, 250));
          return undefined;
        }
      },
    );
    const resumedMs = Date.now() - killedAt;
    console.log(
      `# E2B durable pause: betaPause ${pauseMs} ms; connect resumed it elsewhere ${resumedMs} ms after the kill -9; errors meanwhile: ${[...seen].join(" | ")}`,
    );
    assert.equal(connected.sandboxId, id);
    assert.ok(
      [...seen].some((line) => line.startsWith("ServiceBusyError") && line.includes("being moved")),
      [...seen].join("\n"),
    );
    const now = await nodeOf();
    assert.equal(now.length, 1);
    assert.ok(now[0]?.node && now[0].node !== from, `on another node: ${now[0]?.node}`);
    assert.equal((await connected.files.read(`${home}/e2b-durable.txt`)).trim(), "e2b-durable-file");
    const processes = await connected.commands.list();
    assert.ok(
      // E2B runs a command as `/bin/bash -l -c <command>`: the sleep is in its arguments.
      processes.some((p) => p.pid === sleeper.pid && [p.cmd, ...p.args].join(" ").includes("sleep 86400")),
      `the background process ${sleeper.pid} is there: ${JSON.stringify(processes.map((p) => [p.pid, p.cmd, p.args]))}`,
    );
    const venv = await e2bPythonVenv();
    const script = [
      "import sys",
      "from e2b import Sandbox",
      "s = Sandbox.connect(sys.argv[1])",
      "print(s.sandbox_id)",
      "print(s.commands.run('cat $HOME/e2b-durable.txt').stdout.strip())",
    ].join("\n");
    const { stdout } = await run(venv.python, ["-c", script, id], {
      encoding: "utf8",
      timeout: 2 * 60_000,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/root",
        E2B_API_URL: env.E2B_API_URL,
        E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
        E2B_API_KEY: env.E2B_API_KEY,
      },
    });
    assert.deepEqual(stdout.trim().split("\n"), [id, "e2b-durable-file"]);
    await connected.kill();
    // The node returns fenced and runs again (the cases after this one have their 3 nodes).
    await startNode(state, victim);
    await waitFor("the returned node to run under its new epoch", 120_000, async () => {
      const n = (await listForkdNodes(kube)).find((x) => x.metadata.name === from);
      return n && n.spec.epoch > 0 && n.status?.observedEpoch === n.spec.epoch ? true : undefined;
    });
  });

  it("a node's link cut: no call hangs, lost at detection and answered at once, placement avoids it; fenced on return", async () => {
    const kids = await spawn(admin, "pyagent", 2);
    const victimName = kids[0]?.node as string;
    const victim = state.nodes.find((n) => n.name === victimName);
    assert.ok(victim);
    const onVictim = kids.find((k) => k.node === victimName) as Spawned;
    const epochBefore =
      (await listForkdNodes(kube)).find((x) => x.metadata.name === victimName)?.spec.epoch ?? 0;
    const cutAt = Date.now();
    await setNodeLink(victim.network, false);
    try {
      let slowest = 0;
      const detected = await waitFor(
        "the gateway to call the cut node's sandboxes lost",
        60_000,
        async () => {
          const t = Date.now();
          const err = await admin.execCommand(onVictim.id, ["true"], { requestTimeoutMs: 30_000 }).then(
            () => undefined,
            (e: Error) => e,
          );
          slowest = Math.max(slowest, Date.now() - t);
          return err && /lost/.test(err.message) ? Date.now() : undefined;
        },
      );
      const detectionMs = detected - cutAt;
      console.log(`# detection of a cut node: ${detectionMs} ms; slowest call meanwhile ${slowest} ms`);
      assert.ok(detectionMs < 45_000, `detected in ${detectionMs} ms`);
      assert.ok(slowest < 30_000, `no call hung: the slowest took ${slowest} ms`);
      const t = Date.now();
      await assert.rejects(admin.getSandbox(onVictim.id), /lost/);
      assert.ok(Date.now() - t < 2_000, "a lost sandbox is answered at once");
      for (let i = 0; i < 2; i++) {
        const [k] = await spawn(admin, "pyagent");
        assert.ok(k?.node && k.node !== victimName, `placed on a reachable node: ${k?.node}`);
        await admin.killSandbox(k.id);
      }
    } finally {
      await setNodeLink(victim.network, true);
    }
    // Back on the network: fenced (a new epoch), it kills what it held; the lost sandbox does not come back.
    await waitFor("the reconnected node to run under its new epoch", 120_000, async () => {
      const n = (await listForkdNodes(kube)).find((x) => x.metadata.name === victimName);
      return n &&
        n.spec.epoch > epochBefore &&
        n.status?.observedEpoch === n.spec.epoch &&
        n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True")
        ? true
        : undefined;
    });
    const listed = (await admin.listSandboxes()).map((s) => s.id);
    assert.ok(!listed.includes(onVictim.id), `${onVictim.id} did not come back`);
    for (const k of kids.filter((k) => k.node !== victimName)) await admin.killSandbox(k.id);
  });
  it("a warm pool is refilled on another node when one of its nodes goes (link cut)", async () => {
    const pools = forkdObjects(kube, NAMESPACE).pools;
    const poolStatus = async () => (await pools.get("warm-pyagent")).status;
    await pools.create("warm-pyagent", { snapshot: "pyagent", replicas: 2, spread: { maxPerNode: 1 } });
    try {
      const filled = await waitFor("the pool to be warm on 2 nodes", 180_000, async () => {
        const status = await poolStatus();
        const nodes = (status?.nodes ?? []).filter((n) => n.ready > 0).map((n) => n.name);
        return status?.replicas === 2 && nodes.length === 2 ? nodes : undefined;
      });
      const victimName = filled[0] as string;
      const victim = state.nodes.find((n) => n.name === victimName);
      assert.ok(victim);
      const cutAt = Date.now();
      await setNodeLink(victim.network, false);
      try {
        const refilled = await waitFor(
          "the pool to be warm again without the cut node",
          180_000,
          async () => {
            const status = await poolStatus();
            const nodes = (status?.nodes ?? []).filter((n) => n.ready > 0).map((n) => n.name);
            return status?.replicas === 2 && nodes.length === 2 && !nodes.includes(victimName)
              ? nodes
              : undefined;
          },
        );
        console.log(
          `# pool refilled on ${refilled.join(", ")} ${Date.now() - cutAt} ms after ${victimName} was cut`,
        );
      } finally {
        await setNodeLink(victim.network, true);
      }
      await waitFor("the reconnected node to be Ready again", 120_000, async () => {
        const n = (await listForkdNodes(kube)).find((x) => x.metadata.name === victimName);
        return n?.status?.observedEpoch === n?.spec.epoch &&
          n?.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True")
          ? true
          : undefined;
      });
    } finally {
      await pools.delete("warm-pyagent");
    }
  });
});
