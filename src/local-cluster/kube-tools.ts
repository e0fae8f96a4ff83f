/**
 * Where this machine's Kubernetes tools are — kube-apiserver, kubectl, etcd and helm, built from
 * their Go modules once per machine by scripts/k8s-tools.sh (which install-deps.sh runs). Asks the script, so
 * the cache layout is written down once; a missing tool is an error naming the command that builds it. Asks with
 * `wait`: a build under way (CI builds the tools in the background while the first tests run) is waited for.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import { packageRoot } from "../common/package-root.js";

export interface KubeTools {
  "kube-apiserver": string;
  kubectl: string;
  etcd: string;
  helm: string;
}

let found: Promise<KubeTools> | undefined;

export function kubeTools(): Promise<KubeTools> {
  found ??= locate();
  return found;
}

async function locate(): Promise<KubeTools> {
  const script = path.join(packageRoot(), "scripts", "k8s-tools.sh");
  try {
    const { stdout } = await promisify(execFile)(script, ["wait"], { encoding: "utf8" });
    return JSON.parse(stdout) as KubeTools;
  } catch (err) {
    const e = err as Error & { stderr?: string };
    throw new Error(
      `the Kubernetes test tools are not built on this machine: run scripts/k8s-tools.sh (as root; ${e.stderr?.trim() || e.message})`,
    );
  }
}
