/**
 * `forkd gateway`: the front door of a forkd cluster (src/gateway, docs/kubernetes.md). Reads the cluster (its
 * ForkdNodes, Leases and ForkdSnapshots) and serves the forkd REST API, E2B's API (control and data planes) and
 * MCP for every node behind it, until SIGTERM.
 */
import { readFile } from "node:fs/promises";
import { isIP } from "node:net";
import type { Command } from "commander";
import pino from "pino";
import { parseBind } from "../../api/listen.js";
import { errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import { loadTokenFile, type Token } from "../../common/tokens.js";
import { startGateway } from "../../gateway/server.js";
import { checkNamespace } from "../../kube/config.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "../options.js";

interface GatewayFlags {
  listen: string;
  clusterNamespace: string;
  kubeconfig?: string;
  nodeTokenFile: string;
  adminTokenFile: string;
  tokenFile?: string;
  e2bDomain?: string;
  allowedHost: string[];
  allowedOrigin: string[];
  tlsCert?: string;
  tlsKey?: string;
  defaultSnapshot: string;
  tenantMaxSandboxes?: number;
  registryInsecure?: boolean;
  perSandboxMib?: number;
  advertiseAddress?: string;
  durablePause?: boolean;
  logLevel: string;
}

const DOMAIN =
  /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

export function registerGateway(program: Command): void {
  program
    .command("gateway")
    .description("run a forkd cluster's gateway: one front door (forkd API, E2B API, MCP) for every node")
    .requiredOption("--listen <host:port>", "where to serve, e.g. 0.0.0.0:8080")
    .requiredOption("--cluster-namespace <ns>", "the Kubernetes namespace of the cluster's objects")
    .option(
      "--kubeconfig <file>",
      "Kubernetes client configuration (default: KUBECONFIG, then the pod's ServiceAccount)",
    )
    .requiredOption(
      "--node-token-file <file>",
      "the node token: the credential nodes take cluster calls with",
    )
    .requiredOption("--admin-token-file <file>", "the operator's admin token (also an E2B API key)")
    .option("--token-file <file>", "users' tokens, one per line, `<token> tenant=<name>` for a tenant's")
    .option("--e2b-domain <domain>", "base domain of E2B sandbox host names <port>-<sandboxId>.<domain>")
    .option("--allowed-host <host>", "another name this listener answers to (repeatable)", collect, [])
    .option("--allowed-origin <origin>", "a browser origin this listener serves (repeatable)", collect, [])
    .option("--tls-cert <file>", "PEM certificate: serve HTTPS")
    .option("--tls-key <file>", "PEM private key for --tls-cert")
    .option("--default-snapshot <name>", "the snapshot E2B's default template names mean", "pyagent")
    .option(
      "--tenant-max-sandboxes <n>",
      "sandboxes one tenant may hold across the cluster (more get 429)",
      parseIntOption("--tenant-max-sandboxes", 1, 1_000_000),
    )
    .option("--registry-insecure", "plain HTTP or unverified TLS to snapshot registries not on loopback")
    .option(
      "--per-sandbox-mib <mib>",
      "memory one sandbox is assumed to take of a node when placing (default 128)",
      parseIntOption("--per-sandbox-mib", 16, 1 << 20),
    )
    .option(
      "--advertise-address <ip>",
      "where the other gateway replicas reach this one (its pod IP): MCP sessions then work through any replica",
    )
    .option(
      "--durable-pause",
      "make every pause with memory durable (E2B's too; forkd's unless durable: false): it survives its node " +
        "(the nodes need --cluster-registry)",
    )
    .option("--log-level <level>", "pino log level", "info")
    .action(async (flags: GatewayFlags) => {
      try {
        await serveGateway(flags);
        process.exit(EXIT.ok);
      } catch (err) {
        process.stderr.write(`forkd gateway: ${errorMessage(err)}\n`);
        process.exit(
          err instanceof ForkdError && err.code === "invalid_argument" ? EXIT.usage : EXIT.failure,
        );
      }
    });
}

async function serveGateway(flags: GatewayFlags): Promise<void> {
  if (!Object.hasOwn(pino.levels.values, flags.logLevel)) {
    throw invalidArgument(`unknown --log-level ${JSON.stringify(flags.logLevel)}`);
  }
  if (flags.e2bDomain !== undefined && !DOMAIN.test(flags.e2bDomain)) {
    throw invalidArgument(`invalid --e2b-domain ${JSON.stringify(flags.e2bDomain)}: expected a DNS name`);
  }
  if ((flags.tlsCert === undefined) !== (flags.tlsKey === undefined)) {
    throw invalidArgument("--tls-cert and --tls-key go together");
  }
  assertTag(flags.defaultSnapshot, "--default-snapshot");
  if (
    flags.advertiseAddress !== undefined &&
    isIP(flags.advertiseAddress) === 0 &&
    !DOMAIN.test(flags.advertiseAddress)
  ) {
    throw invalidArgument(
      `invalid --advertise-address ${JSON.stringify(flags.advertiseAddress)}: expected an IP address or DNS name`,
    );
  }
  const logger = pino(
    { name: "forkd-gateway", level: flags.logLevel },
    pino.destination({ dest: 2, sync: true }),
  );
  const [nodeTokens, adminTokens, userTokens] = await Promise.all([
    loadTokenFile(flags.nodeTokenFile),
    loadTokenFile(flags.adminTokenFile),
    flags.tokenFile === undefined ? Promise.resolve([] as Token[]) : loadTokenFile(flags.tokenFile),
  ]);
  const nodeToken = (await readFile(flags.nodeTokenFile, "utf8"))
    .split(/\r?\n/)
    .map((l) => l.trim())
    .find((l) => l && !l.startsWith("#"));
  if (nodeTokens.length !== 1 || nodeToken === undefined || nodeToken.includes(" ")) {
    throw invalidArgument(`--node-token-file ${flags.nodeTokenFile} must hold exactly one token`);
  }
  if (adminTokens.some((t) => t.tenant !== null)) {
    throw invalidArgument("--admin-token-file holds admin tokens only (no tenant=)");
  }
  const tls =
    flags.tlsCert && flags.tlsKey
      ? { cert: await readFile(flags.tlsCert), key: await readFile(flags.tlsKey) }
      : undefined;
  process.on("unhandledRejection", (reason) => logger.error({ err: reason }, "unhandled rejection (a bug)"));
  const gateway = await startGateway({
    listen: parseBind(flags.listen),
    tls,
    namespace: checkNamespace(flags.clusterNamespace),
    kubeconfig: flags.kubeconfig,
    nodeToken,
    tokens: [...adminTokens, ...userTokens],
    e2bDomain: flags.e2bDomain,
    allowedHosts: flags.allowedHost,
    allowedOrigins: flags.allowedOrigin,
    defaultSnapshot: flags.defaultSnapshot,
    tenantMaxSandboxes: flags.tenantMaxSandboxes,
    insecureRegistry: flags.registryInsecure === true,
    perSandboxMiB: flags.perSandboxMib,
    advertiseAddress: flags.advertiseAddress,
    durablePause: flags.durablePause === true,
    logger,
  });
  await new Promise<void>((resolve) => {
    const stop = (signal: NodeJS.Signals) => {
      logger.info({ signal }, "stopping");
      gateway.stop().then(resolve, resolve);
    };
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
  });
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}
