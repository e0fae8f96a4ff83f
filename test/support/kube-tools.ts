/** Test support: where the Kubernetes tools are (src/local-cluster/kube-tools.ts, shared with the local cluster). */
export * from "../../src/local-cluster/kube-tools.js";
