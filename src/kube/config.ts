/**
 * The Kubernetes client configuration of a forkd component: a kubeconfig file when one is named (`--kubeconfig`,
 * then KUBECONFIG), else the pod's own ServiceAccount (its projected token, which the client re-reads as the
 * kubelet rotates it).
 */
import { KubeConfig } from "@kubernetes/client-node";
import { invalidArgument } from "../common/errors.js";

export function loadKubeConfig(file?: string): KubeConfig {
  const config = new KubeConfig();
  try {
    if (file !== undefined) config.loadFromFile(file);
    else config.loadFromDefault();
  } catch (err) {
    throw invalidArgument(
      `cannot load the Kubernetes client configuration${file ? ` from ${file}` : ""}: ${(err as Error).message}`,
    );
  }
  if (!config.getCurrentCluster()) {
    throw invalidArgument(
      "no Kubernetes cluster configured: run in a pod (its ServiceAccount), set KUBECONFIG or pass --kubeconfig",
    );
  }
  return config;
}

/** A component's way into the cluster: who it is to the API server, and the namespace it works in. */
export interface KubeConnection {
  config: KubeConfig;
  namespace: string;
}

const NAMESPACE = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export function checkNamespace(namespace: string, flag = "--cluster-namespace"): string {
  if (!NAMESPACE.test(namespace)) {
    throw invalidArgument(`${flag} ${JSON.stringify(namespace)} is not a Kubernetes namespace name`);
  }
  return namespace;
}

const OBJECT_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** A Kubernetes object name (a DNS subdomain, RFC 1123), as node names are. */
export function checkObjectName(name: string, flag: string): string {
  if (name.length > 253 || !OBJECT_NAME.test(name)) {
    throw invalidArgument(
      `${flag} ${JSON.stringify(name)} is not a Kubernetes object name (RFC 1123 subdomain)`,
    );
  }
  return name;
}
