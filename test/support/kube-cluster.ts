/**
 * Test support, as envtest does for Go: a real Kubernetes control plane on loopback — etcd and kube-apiserver
 * built from their modules (scripts/k8s-tools.sh) — with its own temporary directory, a CA and certificates of
 * its own (etcd takes only clients with a certificate from it), real RBAC (--authorization-mode=RBAC; the
 * admin is a client certificate in system:masters) and ServiceAccount tokens issued by TokenRequest and
 * checked by the API server (its own signing key). There is no kubelet, scheduler or controller manager:
 * objects are stored, validated, authorized, admitted and watched, but no Pod runs and nothing garbage-collects.
 *
 * `stop()` ends both processes (the ones this helper started, by pid) and removes the directory; a test
 * process that exits without calling it still kills them on its way out.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { createWriteStream } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { ApiextensionsV1Api, CoreV1Api, type KubeConfig } from "@kubernetes/client-node";
import { FORKD_API_GROUP, FORKD_KINDS } from "../../src/cluster/api-group.js";
import {
  adminKubeConfig,
  apiServerArgs,
  etcdArgs,
  kubeConfigFor,
  makeControlPlaneFiles,
  waitApiServerReady,
} from "../../src/local-cluster/control-plane.js";
import { CHART_DIR } from "./deploy-files.js";
import { waitFor } from "./host.js";
import { type KubeTools, kubeTools } from "./kube-tools.js";

export interface KubeTestCluster {
  /** https://127.0.0.1:<port> */
  server: string;
  /** The temporary directory holding certificates, data and logs. */
  dir: string;
  tools: KubeTools;
  /** A client configuration for the admin (system:masters). */
  admin: KubeConfig;
  /** The admin's kubeconfig file (mode 0600), for kubectl and helm. */
  kubeconfigPath: string;
  /** The API server's issuer of ServiceAccount tokens. */
  serviceAccountIssuer: string;
  /** A token for `serviceAccount` in `namespace` from the TokenRequest API (bound to a Pod if asked). */
  tokenFor(namespace: string, serviceAccount: string, options?: TokenOptions): Promise<string>;
  /** A client configuration that authenticates with `token` (and nothing else). */
  configForToken(token: string): KubeConfig;
  stop(): Promise<void>;
}

export interface TokenOptions {
  /** Bind the token to this Pod (as a kubelet's projected token is): it then names the Pod's node. */
  pod?: { name: string; uid: string };
  expirationSeconds?: number;
}

export interface StartOptions {
  /** Extra kube-apiserver flags, e.g. ["--feature-gates=..."]. */
  apiServerArgs?: string[];
  /** How long the API server may take to become ready (it is seconds on an idle machine). */
  readyTimeoutMs?: number;
}

const STOP_GRACE_MS = 10_000;
const DEFAULT_READY_TIMEOUT_MS = 120_000;

export async function startKubeCluster(options: StartOptions = {}): Promise<KubeTestCluster> {
  const tools = await kubeTools();
  const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-kube-"));
  const processes: Started[] = [];
  const killOnExit = () => {
    for (const { child } of processes) if (!hasExited(child)) child.kill("SIGKILL");
  };
  process.on("exit", killOnExit);
  let stopped: Promise<void> | undefined;
  const stop = () => {
    stopped ??= (async () => {
      // The API server first: it would otherwise retry etcd and log about it.
      for (const child of [...processes].reverse()) await stopProcess(child);
      process.off("exit", killOnExit);
      await rm(dir, { recursive: true, force: true });
    })();
    return stopped;
  };
  try {
    const files = await makeControlPlaneFiles(dir);
    const [etcdClient, etcdPeer, apiServer] = (await freePorts(3)) as [number, number, number];
    const ports = { etcdClient, etcdPeer, apiServer };
    const server = `https://127.0.0.1:${apiServer}`;
    processes.push(await startLogged(dir, "etcd", tools.etcd, etcdArgs(dir, files, ports)));
    const serviceAccountIssuer = server;
    processes.push(
      await startLogged(
        dir,
        "kube-apiserver",
        tools["kube-apiserver"],
        apiServerArgs(dir, files, ports, "127.0.0.1", options.apiServerArgs ?? []),
      ),
    );
    const admin = await adminKubeConfig(server, files);
    await waitApiServerReady(server, files, options.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS, async () => {
      const dead = processes.find((p) => hasExited(p.child));
      if (!dead) return undefined;
      const how = dead.child.exitCode ?? dead.child.signalCode;
      return `${dead.name} exited during start (${how}); its log ends:\n${await logTail(dead)}`;
    });
    const kubeconfigPath = path.join(dir, "admin.kubeconfig");
    await writeFile(kubeconfigPath, admin.exportConfig(), { mode: 0o600 });
    const core = admin.makeApiClient(CoreV1Api);
    return {
      server,
      dir,
      tools,
      admin,
      kubeconfigPath,
      serviceAccountIssuer,
      configForToken: (token) => kubeConfigFor(server, files.caPem, { name: "forkd-test-token", token }),
      async tokenFor(namespace, serviceAccount, tokenOptions = {}) {
        const answer = await core.createNamespacedServiceAccountToken({
          name: serviceAccount,
          namespace,
          body: {
            spec: {
              audiences: [serviceAccountIssuer],
              expirationSeconds: tokenOptions.expirationSeconds ?? 3600,
              ...(tokenOptions.pod
                ? { boundObjectRef: { apiVersion: "v1", kind: "Pod", ...tokenOptions.pod } }
                : {}),
            },
          },
        });
        const token = answer.status?.token;
        if (!token) throw new Error(`TokenRequest for ${namespace}/${serviceAccount} returned no token`);
        return token;
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Free loopback ports (another process may take one before we bind it: a start then fails and says so). */
async function freePorts(count: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from({ length: count }, async () => {
      const server = net.createServer();
      server.listen(0, "127.0.0.1");
      await once(server, "listening");
      return server;
    }),
  );
  const ports = servers.map((s) => (s.address() as net.AddressInfo).port);
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  return ports;
}

/** A process this helper started, and the file its output goes to. */
interface Started {
  name: string;
  child: ChildProcess;
  log: string;
}

async function startLogged(dir: string, name: string, file: string, args: string[]): Promise<Started> {
  const log = path.join(dir, `${name}.log`);
  const stream = createWriteStream(log, { mode: 0o600 });
  await once(stream, "open");
  const child = spawn(file, args, { cwd: dir, stdio: ["ignore", stream, stream] });
  child.once("exit", () => stream.end());
  await Promise.race([
    once(child, "spawn"),
    once(child, "error").then(([err]) => {
      throw new Error(`cannot start ${file}: ${(err as Error).message}`);
    }),
  ]);
  return { name, child, log };
}

const hasExited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null;

async function stopProcess({ child }: Started): Promise<void> {
  if (hasExited(child)) return;
  const exited = once(child, "exit");
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), STOP_GRACE_MS);
  await exited;
  clearTimeout(timer);
}

async function logTail(started: Started): Promise<string> {
  const text = await readFile(started.log, "utf8").catch(() => "");
  return text.trim().split("\n").slice(-20).join("\n");
}

/**
 * Applies the chart's CRDs (server-side, as an operator would) and waits until each is Established; a fresh
 * CRD's storage can still answer 429 "(re)initializing" for a moment after that (readers retry).
 */
export async function applyForkdCrds(cluster: KubeTestCluster): Promise<void> {
  await promisify(execFile)(cluster.tools.kubectl, [
    "--kubeconfig",
    cluster.kubeconfigPath,
    "apply",
    "--server-side",
    "-f",
    path.join(CHART_DIR, "crds"),
  ]);
  const extensions = cluster.admin.makeApiClient(ApiextensionsV1Api);
  for (const kind of FORKD_KINDS) {
    await waitFor(`${kind.plural} established`, 30_000, async () => {
      const crd = await extensions.readCustomResourceDefinition({
        name: `${kind.plural}.${FORKD_API_GROUP}`,
      });
      return crd.status?.conditions?.some((c) => c.type === "Established" && c.status === "True")
        ? true
        : undefined;
    });
  }
}
