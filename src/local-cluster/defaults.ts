/** Where a local cluster lives unless told (FORKD_LOCAL_CLUSTER_DIR), and its default size. */
export const DEFAULT_NODES = 3;

export function defaultDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.FORKD_LOCAL_CLUSTER_DIR ?? "/var/tmp/forkd-local-cluster";
}
