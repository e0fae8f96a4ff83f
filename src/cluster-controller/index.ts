/**
 * `forkd cluster-controller`: the leader-elected reconciler of a forkd cluster (reconciler.ts), with a health
 * listener for its probes. Replicas that do not lead only renew their claim on the leader Lease.
 */
import http from "node:http";
import os from "node:os";
import { CoreV1Api } from "@kubernetes/client-node";
import type { Logger } from "pino";
import { parseBind } from "../api/listen.js";
import { errorMessage } from "../common/errors.js";
import { FORKD_VERSION } from "../common/version.js";
import { loadKubeConfig } from "../kube/config.js";
import { Leases } from "../kube/leases.js";
import { forkdObjects } from "../kube/objects.js";
import { LeaderElection } from "./leader.js";
import { RECONCILE_MS, Reconciler } from "./reconciler.js";

export interface ControllerOptions {
  namespace: string;
  kubeconfig?: string;
  leaderLease: string;
  tokensSecret: string;
  healthListen?: string;
  insecureRegistry: boolean;
  /** Default: POD_NAME, else host name and pid. */
  identity?: string;
  logger: Logger;
}

export interface RunningController {
  healthUrl: string | null;
  isLeader(): boolean;
  stop(): Promise<void>;
}

export async function startController(options: ControllerOptions): Promise<RunningController> {
  const config = loadKubeConfig(options.kubeconfig);
  const leases = new Leases(config, options.namespace);
  const reconciler = new Reconciler({
    objects: forkdObjects(config, options.namespace),
    leases,
    core: config.makeApiClient(CoreV1Api),
    namespace: options.namespace,
    tokensSecret: options.tokensSecret,
    insecureRegistry: options.insecureRegistry,
    logger: options.logger,
  });
  const identity = options.identity ?? process.env.POD_NAME ?? `${os.hostname()}-${process.pid}`;
  let loop: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  const election = new LeaderElection(leases, options.leaderLease, identity, options.logger, (leading) => {
    clearTimeout(loop);
    if (!leading) return;
    const tick = () => {
      running = reconciler
        .round()
        .catch((err: unknown) => options.logger.error({ err: errorMessage(err) }, "reconcile round failed"))
        .finally(() => {
          if (election.isLeader) loop = setTimeout(tick, RECONCILE_MS);
        });
    };
    tick();
  });
  election.start();
  let server: http.Server | undefined;
  let healthUrl: string | null = null;
  if (options.healthListen) {
    const address = parseBind(options.healthListen);
    server = http.createServer((req, res) => {
      const path = (req.url ?? "/").split("?")[0];
      if (path !== "/healthz" && path !== "/healthz/") {
        res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not found"}');
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ status: "ok", version: FORKD_VERSION, leader: election.isLeader, identity }));
    });
    await new Promise<void>((resolve, reject) => {
      server?.once("error", reject);
      server?.listen(address.port, address.host, () => resolve());
    });
    const bound = server.address();
    healthUrl = `http://${address.host}:${typeof bound === "object" && bound ? bound.port : address.port}`;
  }
  options.logger.info({ identity, health: healthUrl }, "forkd cluster controller started");
  return {
    healthUrl,
    isLeader: () => election.isLeader,
    stop: async () => {
      election.stop();
      clearTimeout(loop);
      await running;
      await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    },
  };
}
