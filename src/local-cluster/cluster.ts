/**
 * A forkd cluster on one machine (scripts/local-cluster.sh, docs/kubernetes.md): the real control plane (etcd and
 * kube-apiserver), the deployment files applied to it (CRDs, RBAC, admission policies, Secret), a loopback OCI
 * registry (Debian's docker-registry), the cluster controller, N node daemons each in a network namespace and
 * home of its own with a pod-bound ServiceAccount token as the DaemonSet's pods would have, G gateway replicas
 * and the balancer standing in for their Service. The default snapshot is built once (a seed home) and reaches
 * the nodes the way a cluster brings it: pushed to the registry, a ForkdSnapshot with `prepull`, each node pulls.
 *
 * Every process is detached (it outlives `up`) and recorded in `<dir>/state.json` as soon as it starts, so
 * `down` finds and stops exactly what `up` started (by pid and start time), even after an `up` that failed
 * halfway, and then removes the namespaces, links and files.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { access, mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { promisify } from "node:util";
import { CoreV1Api, CustomObjectsApi, type KubeConfig } from "@kubernetes/client-node";
import {
  DEFAULT_NAMESPACE,
  FORKD_API,
  FORKD_API_GROUP,
  FORKD_API_VERSION,
  FORKD_NODE,
  FORKD_SNAPSHOT,
  NODE_SELECTOR_LABEL,
  serviceAccountName,
  TOKEN_KEYS,
  TOKENS_SECRET_NAME,
} from "../cluster/api-group.js";
import type { ForkdNode } from "../cluster/schemas.js";
import { packageRoot } from "../common/package-root.js";
import {
  adminKubeConfig,
  apiServerArgs,
  type ControlPlaneFiles,
  etcdArgs,
  kubeConfigFor,
  makeControlPlaneFiles,
  waitApiServerReady,
} from "./control-plane.js";
import { kubeTools } from "./kube-tools.js";
import {
  type ClusterNetwork,
  createBridge,
  createNodeNetwork,
  deleteBridge,
  deleteNodeNetwork,
  leftovers,
  type NodeNetwork,
  nodeNetwork,
  planNetwork,
} from "./network.js";
import {
  isRunning,
  logTail,
  type ProcessRecord,
  processesUnder,
  startDetached,
  stopRecorded,
} from "./processes.js";

const run = promisify(execFile);

export const NAMESPACE = DEFAULT_NAMESPACE;
export const DEFAULT_SNAPSHOT = "pyagent";
/** The port every node daemon listens on, at its own address. */
const NODE_PORT = 8889;
/** The tenants whose tokens `up` makes (besides the admin's), for trying tenancy across nodes. */
export const TENANTS = ["alpha", "beta"] as const;
const READY_TIMEOUT_MS = 10 * 60_000;

export interface NodeState {
  name: string;
  index: number;
  network: NodeNetwork;
  home: string;
  url: string;
  kubeconfig: string;
  process?: ProcessRecord;
}

export interface GatewayState {
  index: number;
  url: string;
  process?: ProcessRecord;
}

export interface ClusterState {
  dir: string;
  network: ClusterNetwork;
  nodeCount: number;
  nodeMaxSandboxes?: number;
  /** The gateways run with --durable-pause (every pause with memory durable, E2B's too). */
  durablePause?: boolean;
  ports: { etcdClient: number; etcdPeer: number; apiServer: number; registry: number; balancer: number };
  apiServer: string;
  adminKubeconfig: string;
  registry: string;
  /** The default snapshot's reference and digest in the registry. */
  snapshot?: { name: string; reference: string; digest: string };
  processes: Record<string, ProcessRecord>;
  nodes: NodeState[];
  gateways: GatewayState[];
  /** The balancer (the gateway Service's stand-in): what FORKD_URL names. */
  url: string;
  tokens: { admin?: string; node?: string; tenants: Record<string, string> };
  files: { nodeToken: string; adminToken: string; userTokens: string };
}

export interface UpOptions {
  dir: string;
  nodes: number;
  gateways: number;
  /** A forkd home holding the default snapshot already (else one is built in `<dir>/seed`). */
  seedHome?: string;
  /** Each node daemon's --max-sandboxes (small ones make a fork of N span nodes with few VMs). */
  nodeMaxSandboxes?: number;
  /** The gateways' --durable-pause. */
  durablePause?: boolean;
  log?: (line: string) => void;
}

const stateFile = (dir: string) => path.join(dir, "state.json");
const forkdBin = () => path.join(packageRoot(), "bin", "forkd.js");

async function saveState(state: ClusterState): Promise<void> {
  const tmp = `${stateFile(state.dir)}.tmp`;
  await writeFile(tmp, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
  await rename(tmp, stateFile(state.dir));
}

export async function loadState(dir: string): Promise<ClusterState | undefined> {
  const text = await readFile(stateFile(dir), "utf8").catch(() => undefined);
  return text === undefined ? undefined : (JSON.parse(text) as ClusterState);
}

async function freePort(host: string): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, resolve);
  });
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function waitFor<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** Starts a recorded process and saves the state at once (a later failure must not lose it). */
async function startRecorded(
  state: ClusterState,
  name: string,
  command: string[],
  env?: NodeJS.ProcessEnv,
): Promise<ProcessRecord> {
  const log = path.join(state.dir, "logs", `${name}.log`);
  const record = await startDetached(name, command, { log, env, cwd: state.dir });
  state.processes[name] = record;
  await saveState(state);
  return record;
}

/** Fails with the process's log when it has died (for the waits below). */
async function alive(record: ProcessRecord): Promise<void> {
  if (!(await isRunning(record))) {
    throw new Error(`${record.name} exited; its log (${record.log}) ends:\n${await logTail(record)}`);
  }
}

export async function up(options: UpOptions): Promise<ClusterState> {
  const log = options.log ?? (() => {});
  const dir = path.resolve(options.dir);
  const existing = await loadState(dir);
  if (existing) throw new Error(`a local cluster is already up in ${dir} (run: local-cluster.sh down)`);
  await mkdir(path.join(dir, "logs"), { recursive: true, mode: 0o700 });
  const network = await planNetwork(dir);
  const host = network.hostAddress;
  const state: ClusterState = {
    dir,
    network,
    nodeCount: options.nodes,
    nodeMaxSandboxes: options.nodeMaxSandboxes,
    durablePause: options.durablePause === true,
    ports: {
      etcdClient: await freePort("127.0.0.1"),
      etcdPeer: await freePort("127.0.0.1"),
      apiServer: await freePort("127.0.0.1"),
      registry: await freePort("127.0.0.1"),
      balancer: await freePort("127.0.0.1"),
    },
    apiServer: "",
    adminKubeconfig: path.join(dir, "admin.kubeconfig"),
    registry: "",
    processes: {},
    nodes: [],
    gateways: [],
    url: "",
    tokens: { tenants: {} },
    files: {
      nodeToken: path.join(dir, "secrets", "node-token"),
      adminToken: path.join(dir, "secrets", "admin-token"),
      userTokens: path.join(dir, "secrets", "user-tokens"),
    },
  };
  state.apiServer = `https://${host}:${state.ports.apiServer}`;
  state.registry = `${host}:${state.ports.registry}`;
  state.url = `http://127.0.0.1:${state.ports.balancer}`;
  await saveState(state);
  try {
    log(`network: bridge ${network.bridge} ${host}/24`);
    await createBridge(network);
    const files = await startControlPlane(state);
    log(`kube-apiserver ${state.apiServer} ready`);
    const admin = await adminKubeConfig(state.apiServer, files);
    await writeFile(state.adminKubeconfig, admin.exportConfig(), { mode: 0o600 });
    await applyDeployFiles(state);
    log("deployment files applied (server-side)");
    await startRegistry(state);
    log(`registry ${state.registry} answering`);
    await startController(state, admin, files);
    log("cluster controller filled the tokens Secret");
    await startNodes(state, admin, files, options.nodes);
    log(`${options.nodes} node daemons registered`);
    await bringSnapshot(state, admin, options.seedHome, log);
    await startGateways(state, admin, files, options.gateways);
    log(`${options.gateways} gateway replicas behind ${state.url}`);
    return state;
  } catch (err) {
    log(`up failed: ${(err as Error).message}; run local-cluster.sh down to remove what was started`);
    throw err;
  }
}

async function startControlPlane(state: ClusterState): Promise<ControlPlaneFiles> {
  const tools = await kubeTools();
  const files = await makeControlPlaneFiles(state.dir, [state.network.hostAddress]);
  const ports = state.ports;
  const etcd = await startRecorded(state, "etcd", [tools.etcd, ...etcdArgs(state.dir, files, ports)]);
  const apiServer = await startRecorded(state, "kube-apiserver", [
    tools["kube-apiserver"],
    ...apiServerArgs(state.dir, files, ports, state.network.hostAddress),
  ]);
  await waitApiServerReady(state.apiServer, files, READY_TIMEOUT_MS, async () => {
    for (const record of [etcd, apiServer]) {
      if (!(await isRunning(record))) return `${record.name} exited; its log ends:\n${await logTail(record)}`;
    }
    return undefined;
  });
  return files;
}

/** The kustomize base, as an operator would apply it: CRDs, RBAC, admission policies, the Secret, workloads. */
async function applyDeployFiles(state: ClusterState): Promise<void> {
  const tools = await kubeTools();
  const base = path.join(packageRoot(), "deploy", "kustomize", "base");
  const kubectl = [tools.kubectl, "--kubeconfig", state.adminKubeconfig] as const;
  await run(kubectl[0], [...kubectl.slice(1), "apply", "--server-side", "-k", base], { encoding: "utf8" });
  await run(
    kubectl[0],
    [
      ...kubectl.slice(1),
      "wait",
      "--for=condition=Established",
      "--timeout=60s",
      "crd",
      "-l",
      "app.kubernetes.io/name=forkd",
    ],
    { encoding: "utf8" },
  );
}

/** Starts (or restarts, on its data kept on disk) the cluster's loopback registry. */
export async function startRegistry(state: ClusterState): Promise<void> {
  const registryDir = path.join(state.dir, "registry");
  await mkdir(registryDir, { recursive: true, mode: 0o700 });
  const config = path.join(registryDir, "config.yml");
  await writeFile(
    config,
    [
      "version: 0.1",
      "log:",
      "  level: warn",
      "  accesslog:",
      "    disabled: true",
      "storage:",
      "  filesystem:",
      `    rootdirectory: ${path.join(registryDir, "data")}`,
      "  delete:",
      "    enabled: true",
      "http:",
      `  addr: ${state.registry}`,
      "",
    ].join("\n"),
  );
  const record = await startRecorded(state, "registry", ["docker-registry", "serve", config]);
  await waitFor("the registry to answer", 30_000, async () => {
    await alive(record);
    const answer = await fetch(`http://${state.registry}/v2/`);
    return answer.ok ? true : undefined;
  });
  await saveState(state);
}

/** A token of `component`'s ServiceAccount from the TokenRequest API (bound to a pod when one is named). */
async function serviceAccountToken(
  admin: KubeConfig,
  state: ClusterState,
  component: "node" | "gateway" | "controller",
  pod?: { name: string; uid: string },
): Promise<string> {
  const answer = await admin.makeApiClient(CoreV1Api).createNamespacedServiceAccountToken({
    name: serviceAccountName(component),
    namespace: NAMESPACE,
    body: {
      spec: {
        audiences: [state.apiServer],
        // No kubelet rotates these: a day, the longest a local cluster is expected to stay up.
        expirationSeconds: 24 * 3600,
        ...(pod ? { boundObjectRef: { apiVersion: "v1", kind: "Pod", ...pod } } : {}),
      },
    },
  });
  const token = answer.status?.token;
  if (!token) throw new Error(`TokenRequest for ${serviceAccountName(component)} returned no token`);
  return token;
}

async function writeKubeconfig(
  state: ClusterState,
  files: ControlPlaneFiles,
  name: string,
  token: string,
): Promise<string> {
  const file = path.join(state.dir, "kubeconfigs", `${name}.kubeconfig`);
  await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
  const config = kubeConfigFor(state.apiServer, files.caPem, { name, token });
  await writeFile(file, config.exportConfig(), { mode: 0o600 });
  return file;
}

async function startController(
  state: ClusterState,
  admin: KubeConfig,
  files: ControlPlaneFiles,
): Promise<void> {
  const token = await serviceAccountToken(admin, state, "controller");
  const kubeconfig = await writeKubeconfig(state, files, "controller", token);
  const record = await startRecorded(state, "cluster-controller", [
    process.execPath,
    forkdBin(),
    "cluster-controller",
    `--cluster-namespace=${NAMESPACE}`,
    `--kubeconfig=${kubeconfig}`,
    // The registry is on the node network's address, not loopback: plain HTTP there is allowed explicitly.
    "--registry-insecure",
  ]);
  // What the kubelet would mount from the Secret once the controller filled it.
  const core = admin.makeApiClient(CoreV1Api);
  const data = await waitFor("the controller to fill the tokens Secret", 120_000, async () => {
    await alive(record);
    const secret = await core.readNamespacedSecret({ name: TOKENS_SECRET_NAME, namespace: NAMESPACE });
    const node = secret.data?.[TOKEN_KEYS.node];
    const adminToken = secret.data?.[TOKEN_KEYS.admin];
    return node && adminToken ? { node, admin: adminToken } : undefined;
  });
  state.tokens.node = Buffer.from(data.node, "base64").toString("utf8").trim();
  state.tokens.admin = Buffer.from(data.admin, "base64").toString("utf8").trim();
  for (const tenant of TENANTS) state.tokens.tenants[tenant] = randomBytes(24).toString("base64url");
  await mkdir(path.dirname(state.files.nodeToken), { recursive: true, mode: 0o700 });
  await writeFile(state.files.nodeToken, `${state.tokens.node}\n`, { mode: 0o600 });
  await writeFile(state.files.adminToken, `${state.tokens.admin}\n`, { mode: 0o600 });
  await writeFile(
    state.files.userTokens,
    TENANTS.map((t) => `${state.tokens.tenants[t]} tenant=${t}\n`).join(""),
    { mode: 0o600 },
  );
  await saveState(state);
}

/** What a kubelet's registration and the DaemonSet would make for node `name`: its Node, its pod, its token. */
async function nodeIdentity(admin: KubeConfig, state: ClusterState, name: string): Promise<string> {
  const core = admin.makeApiClient(CoreV1Api);
  await core.createNode({ body: { metadata: { name, labels: { [NODE_SELECTOR_LABEL]: "true" } } } });
  const pod = await core.createNamespacedPod({
    namespace: NAMESPACE,
    body: {
      metadata: { name: `forkd-node-${name}` },
      spec: {
        nodeName: name,
        serviceAccountName: serviceAccountName("node"),
        containers: [{ name: "daemon", image: "forkd:local-cluster" }],
      },
    },
  });
  const uid = pod.metadata?.uid;
  if (!uid) throw new Error(`pod forkd-node-${name} has no uid`);
  return serviceAccountToken(admin, state, "node", { name: `forkd-node-${name}`, uid });
}

export const nodeName = (index: number) => `node-${index}`;

async function startNodes(
  state: ClusterState,
  admin: KubeConfig,
  files: ControlPlaneFiles,
  count: number,
): Promise<void> {
  for (let index = 0; index < count; index++) {
    const name = nodeName(index);
    const network = nodeNetwork(state.network, index);
    const home = path.join(state.dir, "nodes", name);
    await mkdir(home, { recursive: true, mode: 0o700 });
    const node: NodeState = {
      name,
      index,
      network,
      home,
      url: `http://${network.address}:${NODE_PORT}`,
      kubeconfig: await writeKubeconfig(state, files, name, await nodeIdentity(admin, state, name)),
    };
    state.nodes.push(node);
    await saveState(state);
    await createNodeNetwork(state.network, network);
    await startNode(state, node);
  }
  await waitFor("every node's ForkdNode to be Ready", READY_TIMEOUT_MS, async () => {
    for (const node of state.nodes) if (node.process) await alive(node.process);
    const nodes = await listForkdNodes(admin);
    const ready = nodes.filter((n) =>
      n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True"),
    );
    return ready.length >= count ? true : undefined;
  });
}

/** Starts (or restarts) node `node`'s daemon in its namespace; the record is saved in the state. */
export async function startNode(state: ClusterState, node: NodeState): Promise<ProcessRecord> {
  const record = await startRecorded(
    state,
    node.name,
    [
      "ip",
      "netns",
      "exec",
      node.network.netns,
      process.execPath,
      forkdBin(),
      "daemon",
      `--socket=${path.join(node.home, "forkd.sock")}`,
      `--bind=${node.network.address}:${NODE_PORT}`,
      `--token-file=${state.files.nodeToken}`,
      `--audit-log=${path.join(node.home, "audit.log")}`,
      `--cluster-namespace=${NAMESPACE}`,
      `--cluster-node-name=${node.name}`,
      `--cluster-url=${node.url}`,
      `--cluster-registry=${state.registry}`,
      // On the node network's address, not loopback: plain HTTP there is allowed explicitly.
      "--cluster-registry-insecure",
      `--kubeconfig=${node.kubeconfig}`,
      ...(state.nodeMaxSandboxes ? [`--max-sandboxes=${state.nodeMaxSandboxes}`] : []),
    ],
    { ...process.env, FORKD_HOME: node.home },
  );
  node.process = record;
  await saveState(state);
  return record;
}

export async function listForkdNodes(admin: KubeConfig): Promise<ForkdNode[]> {
  const list = (await admin.makeApiClient(CustomObjectsApi).listNamespacedCustomObject({
    group: FORKD_API_GROUP,
    version: FORKD_API_VERSION,
    namespace: NAMESPACE,
    plural: FORKD_NODE.plural,
  })) as { items: ForkdNode[] };
  return list.items;
}

/**
 * The default snapshot, built once in a seed home (or taken from `seedHome`), pushed to the registry and
 * declared as a ForkdSnapshot with prepull to every node: each node pulls it, as on a cluster.
 */
async function bringSnapshot(
  state: ClusterState,
  admin: KubeConfig,
  seedHome: string | undefined,
  log: (line: string) => void,
): Promise<void> {
  const home = seedHome ?? path.join(state.dir, "seed");
  const env = { ...process.env, FORKD_HOME: home };
  const tag = DEFAULT_SNAPSHOT;
  const exists = await access(path.join(home, "snapshots", tag, "manifest.json")).then(
    () => true,
    () => false,
  );
  if (!exists) {
    log(`building the ${tag} snapshot in ${home} (once)`);
    await mkdir(home, { recursive: true, mode: 0o700 });
    await run(process.execPath, [forkdBin(), "snapshot", "--tag", tag], { env, maxBuffer: 1 << 26 });
  }
  const reference = `${state.registry}/forkd/${tag}:latest`;
  log(`pushing ${tag} to ${reference}`);
  const { stdout } = await run(
    process.execPath,
    [forkdBin(), "push", tag, reference, "--insecure", "--json"],
    {
      env,
      maxBuffer: 1 << 26,
    },
  );
  const pushed = JSON.parse(stdout.slice(stdout.indexOf("{"))) as { digest: string };
  state.snapshot = { name: tag, reference, digest: pushed.digest };
  await saveState(state);
  await admin.makeApiClient(CustomObjectsApi).createNamespacedCustomObject({
    group: FORKD_API_GROUP,
    version: FORKD_API_VERSION,
    namespace: NAMESPACE,
    plural: FORKD_SNAPSHOT.plural,
    body: {
      apiVersion: FORKD_API,
      kind: FORKD_SNAPSHOT.kind,
      metadata: { name: tag },
      spec: { reference, digest: pushed.digest, prepull: state.nodeCount },
    },
  });
  log(`ForkdSnapshot ${tag} (prepull ${state.nodeCount}): waiting for every node to pull it`);
  await waitFor(`every node to hold ${tag}`, READY_TIMEOUT_MS, async () => {
    for (const node of state.nodes) if (node.process) await alive(node.process);
    const nodes = await listForkdNodes(admin);
    const holders = nodes.filter((n) => n.status?.snapshots?.some((s) => s.digest === pushed.digest));
    return holders.length >= state.nodeCount ? true : undefined;
  });
}

async function startGateways(
  state: ClusterState,
  admin: KubeConfig,
  files: ControlPlaneFiles,
  count: number,
): Promise<void> {
  const kubeconfig = await writeKubeconfig(
    state,
    files,
    "gateway",
    await serviceAccountToken(admin, state, "gateway"),
  );
  for (let index = 0; index < count; index++) {
    // Each replica on a loopback address of its own and the balancer's port, as a Service's port equals its
    // pods' here: the Host clients send (127.0.0.1:<port>) is then one each replica's listener answers to.
    const gateway: GatewayState = { index, url: `http://127.0.0.${2 + index}:${state.ports.balancer}` };
    state.gateways.push(gateway);
    await startGateway(state, gateway, kubeconfig);
  }
  const backends = state.gateways.map((g) => new URL(g.url)).map((u) => `${u.hostname}:${u.port}`);
  const balancer = await startRecorded(state, "balancer", [
    process.execPath,
    path.join(packageRoot(), "dist", "src", "local-cluster", "main.js"),
    "balance",
    `127.0.0.1:${state.ports.balancer}`,
    ...backends,
  ]);
  await waitFor("the gateways to answer through the balancer", 120_000, async () => {
    await alive(balancer);
    for (const g of state.gateways) if (g.process) await alive(g.process);
    const answers = await Promise.all(state.gateways.map((g) => fetch(`${g.url}/healthz`)));
    const front = await fetch(`${state.url}/healthz`);
    return answers.every((a) => a.ok) && front.ok ? true : undefined;
  });
}

export const gatewayKubeconfig = (state: ClusterState) =>
  path.join(state.dir, "kubeconfigs", "gateway.kubeconfig");

/** Starts (or restarts) gateway replica `gateway`. */
export async function startGateway(
  state: ClusterState,
  gateway: GatewayState,
  kubeconfig = gatewayKubeconfig(state),
): Promise<ProcessRecord> {
  const record = await startRecorded(state, `gateway-${gateway.index}`, [
    process.execPath,
    forkdBin(),
    "gateway",
    `--listen=${new URL(gateway.url).host}`,
    `--cluster-namespace=${NAMESPACE}`,
    `--kubeconfig=${kubeconfig}`,
    `--node-token-file=${state.files.nodeToken}`,
    `--admin-token-file=${state.files.adminToken}`,
    `--token-file=${state.files.userTokens}`,
    `--default-snapshot=${DEFAULT_SNAPSHOT}`,
    "--registry-insecure",
    // As the Deployment passes its pod IP: MCP sessions work through the balancer, whichever replica it picks.
    `--advertise-address=${new URL(gateway.url).hostname}`,
    ...(state.durablePause ? ["--durable-pause"] : []),
  ]);
  gateway.process = record;
  await saveState(state);
  return record;
}

/** The shell assignments `up` prints: where clients reach the cluster. */
export function shellAssignments(state: ClusterState): Record<string, string> {
  return {
    FORKD_URL: state.url,
    FORKD_TOKEN: state.tokens.admin ?? "",
    E2B_API_URL: state.url,
    E2B_SANDBOX_URL: state.url,
    E2B_API_KEY: state.tokens.admin ?? "",
    KUBECONFIG: state.adminKubeconfig,
  };
}

export async function status(dir: string): Promise<unknown> {
  const state = await loadState(path.resolve(dir));
  if (!state) return { up: false, dir: path.resolve(dir) };
  const running = async (record?: ProcessRecord) => (record ? isRunning(record) : false);
  return {
    up: true,
    dir: state.dir,
    url: state.url,
    apiServer: state.apiServer,
    registry: state.registry,
    snapshot: state.snapshot,
    kubeconfig: state.adminKubeconfig,
    tenants: state.tokens.tenants,
    nodes: await Promise.all(
      state.nodes.map(async (n) => ({
        name: n.name,
        pid: n.process?.pid,
        running: await running(n.process),
        url: n.url,
        netns: n.network.netns,
        home: n.home,
      })),
    ),
    gateway: {
      url: state.url,
      replicas: await Promise.all(
        state.gateways.map(async (g) => ({
          url: g.url,
          pid: g.process?.pid,
          running: await running(g.process),
        })),
      ),
    },
    processes: Object.fromEntries(
      await Promise.all(
        Object.values(state.processes).map(async (p) => [
          p.name,
          { pid: p.pid, running: await isRunning(p) },
        ]),
      ),
    ),
  };
}

/**
 * A node daemon that had to be killed (a stop that outlasted its grace, as under load) leaves its VMs, their
 * namespaces and rules behind: VMs survive their daemon by design, so it can re-attach them. `forkd teardown`
 * in the node's namespace kills them the daemon's own way (re-attached, killed with networks and cgroups).
 */
async function retireNodeHome(node: NodeState): Promise<string[]> {
  const exists = await access(node.home).then(
    () => true,
    () => false,
  );
  if (!exists) return [];
  try {
    await run(
      "ip",
      ["netns", "exec", node.network.netns, process.execPath, forkdBin(), "teardown", "--json"],
      { env: { ...process.env, FORKD_HOME: node.home }, maxBuffer: 1 << 20 },
    );
    return [];
  } catch (err) {
    return [`node ${node.name}'s home not torn down: ${(err as Error).message.split("\n")[0]}`];
  }
}

/**
 * Stops everything `up` started (gateways and balancer first, then the nodes, which kill their VMs, then the
 * controller, the registry and the control plane), removes the network and the directory, and checks that
 * nothing of it is left. Returns what was left (empty when all is gone).
 */
export async function down(dir: string): Promise<string[]> {
  const state = await loadState(path.resolve(dir));
  if (!state) return [];
  const order = [
    "balancer",
    ...state.gateways.map((g) => `gateway-${g.index}`),
    ...state.nodes.map((n) => n.name),
  ];
  const rest = ["cluster-controller", "registry", "kube-apiserver", "etcd"];
  const records = state.processes;
  for (const name of order) if (records[name]) await stopRecorded(records[name], 30_000);
  for (const name of Object.keys(records)) {
    if (!order.includes(name) && !rest.includes(name)) await stopRecorded(records[name] as ProcessRecord);
  }
  for (const name of rest) if (records[name]) await stopRecorded(records[name]);
  const left: string[] = [];
  for (const node of state.nodes) left.push(...(await retireNodeHome(node)));
  for (const node of state.nodes) await deleteNodeNetwork(node.network);
  await deleteBridge(state.network);
  for (const record of Object.values(records))
    if (await isRunning(record)) left.push(`process ${record.name} ${record.pid}`);
  left.push(...(await leftovers(state.network)));
  left.push(...(await processesUnder(state.dir)).map((pid) => `process ${pid} running from ${state.dir}`));
  if (left.length === 0) await rm(state.dir, { recursive: true, force: true });
  return left;
}
