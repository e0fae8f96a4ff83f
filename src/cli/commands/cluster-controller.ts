/** `forkd cluster-controller`: a forkd cluster's reconciler (src/cluster-controller, docs/kubernetes.md). */
import type { Command } from "commander";
import pino from "pino";
import { CONTROLLER_LEASE_NAME, TOKENS_SECRET_NAME } from "../../cluster/api-group.js";
import { startController } from "../../cluster-controller/index.js";
import { errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { checkNamespace, checkObjectName } from "../../kube/config.js";
import { EXIT } from "../exit-codes.js";

interface ControllerFlags {
  clusterNamespace: string;
  kubeconfig?: string;
  leaderLease: string;
  tokensSecret: string;
  healthListen?: string;
  registryInsecure?: boolean;
  logLevel: string;
}

export function registerClusterController(program: Command): void {
  program
    .command("cluster-controller")
    .description("run a forkd cluster's controller: fencing, prepulls, warm pools, tokens (leader-elected)")
    .requiredOption("--cluster-namespace <ns>", "the Kubernetes namespace of the cluster's objects")
    .option(
      "--kubeconfig <file>",
      "Kubernetes client configuration (default: KUBECONFIG, then the pod's ServiceAccount)",
    )
    .option("--leader-lease <name>", "the leader-election Lease", CONTROLLER_LEASE_NAME)
    .option("--tokens-secret <name>", "the Secret holding node-token and admin-token", TOKENS_SECRET_NAME)
    .option("--health-listen <host:port>", "serve /healthz here, e.g. 0.0.0.0:8081")
    .option("--registry-insecure", "plain HTTP or unverified TLS to snapshot registries not on loopback")
    .option("--log-level <level>", "pino log level", "info")
    .action(async (flags: ControllerFlags) => {
      try {
        if (!Object.hasOwn(pino.levels.values, flags.logLevel)) {
          throw invalidArgument(`unknown --log-level ${JSON.stringify(flags.logLevel)}`);
        }
        const logger = pino(
          { name: "forkd-controller", level: flags.logLevel },
          pino.destination({ dest: 2, sync: true }),
        );
        const controller = await startController({
          namespace: checkNamespace(flags.clusterNamespace),
          kubeconfig: flags.kubeconfig,
          leaderLease: checkObjectName(flags.leaderLease, "--leader-lease"),
          tokensSecret: checkObjectName(flags.tokensSecret, "--tokens-secret"),
          healthListen: flags.healthListen,
          insecureRegistry: flags.registryInsecure === true,
          logger,
        });
        await new Promise<void>((resolve) => {
          const stop = () => void controller.stop().then(resolve, resolve);
          process.once("SIGTERM", stop);
          process.once("SIGINT", stop);
        });
        process.exit(EXIT.ok);
      } catch (err) {
        process.stderr.write(`forkd cluster-controller: ${errorMessage(err)}\n`);
        process.exit(
          err instanceof ForkdError && err.code === "invalid_argument" ? EXIT.usage : EXIT.failure,
        );
      }
    });
}
