/**
 * Where forkd keeps things on the host. Every location can be moved with an environment variable so tests
 * and benchmarks run against their own directories.
 *
 *   FORKD_HOME         state: snapshots, sandboxes' run directories, the database (default /var/lib/forkd)
 *   FORKD_IMAGE_CACHE  built guest images keyed by recipe hash (default /var/cache/forkd/images); shared
 *                      between homes because images are pure functions of their recipe
 */
import path from "node:path";

export interface ForkdPaths {
  home: string;
  snapshots: string;
  /** Per-sandbox working directories (sockets, overlays, console logs). */
  run: string;
  images: string;
  /** Host-level facts cached between runs (accelerator probe result). */
  hostState: string;
  /** Packs being sent or received through the daemon's API; emptied when the daemon starts. */
  transfers: string;
}

export function resolvePaths(env: NodeJS.ProcessEnv = process.env): ForkdPaths {
  const home = path.resolve(env.FORKD_HOME ?? "/var/lib/forkd");
  const images = path.resolve(env.FORKD_IMAGE_CACHE ?? "/var/cache/forkd/images");
  return {
    home,
    snapshots: path.join(home, "snapshots"),
    run: path.join(home, "run"),
    images,
    hostState: path.join(home, "host"),
    transfers: path.join(home, "transfers"),
  };
}
