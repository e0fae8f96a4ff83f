/**
 * A Kubernetes control plane as envtest starts one: etcd and kube-apiserver (built by scripts/k8s-tools.sh),
 * each with a certificate from a CA of their own (etcd takes only clients with one), RBAC, ServiceAccount tokens
 * signed by a key of their own. No kubelet, scheduler or controller manager: objects are stored, validated,
 * authorized, admitted and watched, but no Pod runs. Shared by the tests' harness (test/support/kube-cluster.ts,
 * processes tied to the test) and the local cluster (cluster.ts, processes that outlive `up`).
 */
import { generateKeyPairSync } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import https from "node:https";
import path from "node:path";
import { KubeConfig } from "@kubernetes/client-node";
import { createTestCa } from "./ca.js";

/** A range no traffic reaches: Services get addresses from it, but nothing routes there. */
export const SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16";

export interface ControlPlaneFiles {
  ca: string;
  caPem: string;
  serving: { cert: string; key: string };
  admin: { cert: string; key: string };
  serviceAccountPublicKey: string;
  serviceAccountPrivateKey: string;
}

/** The CA, etcd's and the API server's serving certificate (for `addresses`), an admin client, SA keys. */
export async function makeControlPlaneFiles(
  dir: string,
  addresses: string[] = ["127.0.0.1"],
): Promise<ControlPlaneFiles> {
  const pki = path.join(dir, "pki");
  await mkdir(pki, { recursive: true, mode: 0o700 });
  const ca = await createTestCa(pki, "forkd-test-kubernetes-ca");
  const serving = await ca.issue({
    name: "loopback",
    subject: "/CN=forkd-test-loopback",
    usage: "server",
    altNames: [...new Set(["127.0.0.1", ...addresses])].map((a) => `IP:${a}`).concat("DNS:localhost"),
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

export interface Ports {
  etcdClient: number;
  etcdPeer: number;
  apiServer: number;
}

export function etcdArgs(dir: string, files: ControlPlaneFiles, ports: Ports): string[] {
  const etcdUrl = `https://127.0.0.1:${ports.etcdClient}`;
  const peerUrl = `https://127.0.0.1:${ports.etcdPeer}`;
  return [
    ...["--name=forkd-test", `--data-dir=${path.join(dir, "etcd")}`, "--log-level=warn"],
    ...[`--listen-client-urls=${etcdUrl}`, `--advertise-client-urls=${etcdUrl}`],
    ...[`--listen-peer-urls=${peerUrl}`, `--initial-advertise-peer-urls=${peerUrl}`],
    ...[`--initial-cluster=forkd-test=${peerUrl}`, "--initial-cluster-state=new"],
    ...["--client-cert-auth", `--trusted-ca-file=${files.ca}`],
    ...[`--cert-file=${files.serving.cert}`, `--key-file=${files.serving.key}`],
    ...["--peer-client-cert-auth", `--peer-trusted-ca-file=${files.ca}`],
    ...[`--peer-cert-file=${files.serving.cert}`, `--peer-key-file=${files.serving.key}`],
    // Test and development data need not survive a power cut; fsync would make every write wait for the disk.
    "--unsafe-no-fsync",
  ];
}

/** kube-apiserver on `bindAddress` (its serving certificate must name it). */
export function apiServerArgs(
  dir: string,
  files: ControlPlaneFiles,
  ports: Ports,
  bindAddress = "127.0.0.1",
  extra: string[] = [],
): string[] {
  const tls = { ca: files.ca, cert: files.serving.cert, key: files.serving.key };
  const server = `https://${bindAddress}:${ports.apiServer}`;
  return [
    ...[`--etcd-servers=https://127.0.0.1:${ports.etcdClient}`, `--etcd-cafile=${tls.ca}`],
    ...[`--etcd-certfile=${tls.cert}`, `--etcd-keyfile=${tls.key}`],
    ...[
      `--bind-address=${bindAddress}`,
      `--advertise-address=${bindAddress}`,
      `--secure-port=${ports.apiServer}`,
    ],
    ...[`--tls-cert-file=${tls.cert}`, `--tls-private-key-file=${tls.key}`, `--client-ca-file=${tls.ca}`],
    `--cert-dir=${path.join(dir, "apiserver-certs")}`,
    "--authorization-mode=RBAC",
    "--anonymous-auth=false",
    `--service-account-issuer=${server}`,
    `--service-account-key-file=${files.serviceAccountPublicKey}`,
    `--service-account-signing-key-file=${files.serviceAccountPrivateKey}`,
    `--service-cluster-ip-range=${SERVICE_CLUSTER_IP_RANGE}`,
    // The node DaemonSet is privileged; the API server refuses such pods without this.
    "--allow-privileged=true",
    "--profiling=false",
    // The "kubernetes" Service's endpoints would be this loopback address, which the API server refuses.
    "--endpoint-reconciler-type=none",
    ...extra,
  ];
}

/** A client configuration for `server` authenticating as `user` (a client certificate or a token). */
export function kubeConfigFor(
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

export async function adminKubeConfig(server: string, files: ControlPlaneFiles): Promise<KubeConfig> {
  return kubeConfigFor(server, files.caPem, {
    name: "forkd-test-admin",
    certData: (await readFile(files.admin.cert)).toString("base64"),
    keyData: (await readFile(files.admin.key)).toString("base64"),
  });
}

/**
 * Polls /readyz as the admin until it answers 200. `died` is asked between polls: a process that exited fails
 * the wait with what it says.
 */
export async function waitApiServerReady(
  server: string,
  files: ControlPlaneFiles,
  timeoutMs: number,
  died: () => Promise<string | undefined>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const [ca, cert, key] = await Promise.all([
    readFile(files.ca),
    readFile(files.admin.cert),
    readFile(files.admin.key),
  ]);
  let last = "no answer yet";
  while (Date.now() < deadline) {
    const dead = await died();
    if (dead !== undefined) throw new Error(dead);
    last = await readyz(server, { ca, cert, key }).catch((err: Error) => err.message);
    if (last === "ok") return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`kube-apiserver was not ready after ${timeoutMs} ms (last answer: ${last})`);
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
