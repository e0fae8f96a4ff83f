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
import { type ChildProcess, spawn } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { once } from "node:events";
import { createWriteStream } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import https from "node:https";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { CoreV1Api, KubeConfig } from "@kubernetes/client-node";
import { type KubeTools, kubeTools } from "./kube-tools.js";
import { createTestCa } from "./test-ca.js";

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
const READY_POLL_MS = 100;
const DEFAULT_READY_TIMEOUT_MS = 120_000;
/** A range no test traffic ever reaches: Services get addresses from it, but nothing routes there. */
const SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16";

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
    const files = await makeCredentials(dir);
    const [etcdClientPort, etcdPeerPort, apiPort] = await freePorts(3);
    const etcdUrl = `https://127.0.0.1:${etcdClientPort}`;
    const peerUrl = `https://127.0.0.1:${etcdPeerPort}`;
    const server = `https://127.0.0.1:${apiPort}`;
    const tls = { ca: files.ca, cert: files.serving.cert, key: files.serving.key };
    processes.push(
      await startLogged(dir, "etcd", tools.etcd, [
        ...["--name=forkd-test", `--data-dir=${path.join(dir, "etcd")}`, "--log-level=warn"],
        ...[`--listen-client-urls=${etcdUrl}`, `--advertise-client-urls=${etcdUrl}`],
        ...[`--listen-peer-urls=${peerUrl}`, `--initial-advertise-peer-urls=${peerUrl}`],
        ...[`--initial-cluster=forkd-test=${peerUrl}`, "--initial-cluster-state=new"],
        ...[
          "--client-cert-auth",
          `--trusted-ca-file=${tls.ca}`,
          `--cert-file=${tls.cert}`,
          `--key-file=${tls.key}`,
        ],
        ...["--peer-client-cert-auth", `--peer-trusted-ca-file=${tls.ca}`],
        ...[`--peer-cert-file=${tls.cert}`, `--peer-key-file=${tls.key}`],
        // A test's data need not survive a power cut; fsync would make every write wait for the disk.
        "--unsafe-no-fsync",
      ]),
    );
    const serviceAccountIssuer = server;
    processes.push(
      await startLogged(dir, "kube-apiserver", tools["kube-apiserver"], [
        ...[`--etcd-servers=${etcdUrl}`, `--etcd-cafile=${tls.ca}`, `--etcd-certfile=${tls.cert}`],
        `--etcd-keyfile=${tls.key}`,
        ...["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", `--secure-port=${apiPort}`],
        ...[`--tls-cert-file=${tls.cert}`, `--tls-private-key-file=${tls.key}`, `--client-ca-file=${tls.ca}`],
        `--cert-dir=${path.join(dir, "apiserver-certs")}`,
        "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        `--service-account-issuer=${serviceAccountIssuer}`,
        `--service-account-key-file=${files.serviceAccountPublicKey}`,
        `--service-account-signing-key-file=${files.serviceAccountPrivateKey}`,
        `--service-cluster-ip-range=${SERVICE_CLUSTER_IP_RANGE}`,
        // The node DaemonSet is privileged; the API server refuses such pods without this.
        "--allow-privileged=true",
        "--profiling=false",
        // The "kubernetes" Service's endpoints would be this loopback address, which the API server refuses.
        "--endpoint-reconciler-type=none",
        ...(options.apiServerArgs ?? []),
      ]),
    );
    const admin = kubeConfig(server, files.caPem, {
      name: "forkd-test-admin",
      certData: (await readFile(files.admin.cert)).toString("base64"),
      keyData: (await readFile(files.admin.key)).toString("base64"),
    });
    await waitReady(server, files, processes, options.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS);
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
      configForToken: (token) => kubeConfig(server, files.caPem, { name: "forkd-test-token", token }),
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

interface CredentialFiles {
  ca: string;
  caPem: string;
  serving: { cert: string; key: string };
  admin: { cert: string; key: string };
  serviceAccountPublicKey: string;
  serviceAccountPrivateKey: string;
}

async function makeCredentials(dir: string): Promise<CredentialFiles> {
  const pki = path.join(dir, "pki");
  await mkdir(pki, { mode: 0o700 });
  const ca = await createTestCa(pki, "forkd-test-kubernetes-ca");
  // etcd and the API server both serve on loopback with this one; the API server also presents it to etcd.
  const serving = await ca.issue({
    name: "loopback",
    subject: "/CN=forkd-test-loopback",
    usage: "server",
    altNames: ["IP:127.0.0.1", "DNS:localhost"],
  });
  const admin = await ca.issue({
    name: "admin",
    subject: "/O=system:masters/CN=forkd-test-admin",
    usage: "client",
  });
  const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const serviceAccountPublicKey = path.join(pki, "service-account.pub");
  const serviceAccountPrivateKey = path.join(pki, "service-account.key");
  await writeFile(serviceAccountPublicKey, publicKey.export({ type: "spki", format: "pem" }), {
    mode: 0o600,
  });
  await writeFile(serviceAccountPrivateKey, privateKey.export({ type: "pkcs8", format: "pem" }), {
    mode: 0o600,
  });
  return {
    ca: ca.cert,
    caPem: await readFile(ca.cert, "utf8"),
    serving,
    admin,
    serviceAccountPublicKey,
    serviceAccountPrivateKey,
  };
}

function kubeConfig(
  server: string,
  caPem: string,
  user: { name: string; certData?: string; keyData?: string; token?: string },
): KubeConfig {
  const config = new KubeConfig();
  const cluster = "forkd-test";
  config.loadFromOptions({
    clusters: [
      { name: cluster, server, caData: Buffer.from(caPem).toString("base64"), skipTLSVerify: false },
    ],
    users: [user],
    contexts: [{ name: cluster, cluster, user: user.name }],
    currentContext: cluster,
  });
  return config;
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

/** Polls /readyz as the admin until it answers 200; a process that exits first fails the start with its log. */
async function waitReady(
  server: string,
  files: CredentialFiles,
  processes: Started[],
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const [ca, cert, key] = await Promise.all([
    readFile(files.ca),
    readFile(files.admin.cert),
    readFile(files.admin.key),
  ]);
  let last = "no answer yet";
  while (Date.now() < deadline) {
    const dead = processes.find((p) => hasExited(p.child));
    if (dead) {
      const how = dead.child.exitCode ?? dead.child.signalCode;
      throw new Error(`${dead.name} exited during start (${how}); its log ends:\n${await logTail(dead)}`);
    }
    last = await readyz(server, { ca, cert, key }).catch((err: Error) => err.message);
    if (last === "ok") return;
    await new Promise((resolve) => setTimeout(resolve, READY_POLL_MS));
  }
  throw new Error(`kube-apiserver was not ready after ${timeoutMs} ms (last answer: ${last})`);
}

async function logTail(started: Started): Promise<string> {
  const text = await readFile(started.log, "utf8").catch(() => "");
  return text.trim().split("\n").slice(-20).join("\n");
}

function readyz(server: string, tls: { ca: Buffer; cert: Buffer; key: Buffer }): Promise<string> {
  return new Promise((resolve, reject) => {
    const request = https.get(`${server}/readyz`, { ...tls, timeout: 2_000 }, (response) => {
      let body = "";
      response.setEncoding("utf8");
      response.on("data", (chunk: string) => {
        body += chunk;
      });
      response.on("end", () =>
        resolve(response.statusCode === 200 ? "ok" : `${response.statusCode}: ${body.slice(0, 500)}`),
      );
    });
    request.on("timeout", () => request.destroy(new Error("timed out")));
    request.on("error", reject);
  });
}
