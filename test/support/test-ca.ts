/** Test support: the throwaway certificate authority (src/local-cluster/ca.ts, which the local cluster uses too). */
export * from "../../src/local-cluster/ca.js";
