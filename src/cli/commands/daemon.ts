/** `forkd daemon` (alias `serve`): owns all state and serves the REST API (src/api) until SIGTERM. */
import type { Command } from "commander";
import pino from "pino";
import { DEFAULT_AUDIT_LOG } from "../../api/audit.js";
import { DEFAULT_DRAIN_TIMEOUT_MS, describeStartupError, runDaemon } from "../../api/daemon.js";
import { DEFAULT_SOCKET_PATH } from "../../api/defaults.js";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { resolvePaths } from "../../common/paths.js";
import { openServices } from "../../controller/sandbox-manager.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "./fork.js";

interface DaemonOptions {
  socket: string | false;
  socketGroup?: string;
  bind?: string;
  tokenFile?: string;
  tlsCert?: string;
  tlsKey?: string;
  auditLog: string | false;
  drainTimeoutMs: number;
  logLevel: string;
  maxSandboxes?: number;
  maxConcurrentSpawns?: number;
  memoryReserveMib?: number;
  egress: string;
  netBridge?: string;
  netSubnet?: string;
  dnsUpstream?: string[];
  dnsPort?: number;
}

export function registerDaemon(program: Command): void {
  program
    .command("daemon")
    .alias("serve")
    .description("run the forkd daemon: REST API on a Unix socket (and optionally TCP), owning all sandboxes")
    .option("--socket <path>", "Unix socket to listen on", DEFAULT_SOCKET_PATH)
    .option("--no-socket", "do not listen on a Unix socket (needs --bind)")
    .option("--socket-group <group>", "group allowed to use the socket (mode 0660)")
    .option("--bind <host:port>", "also listen on TCP, e.g. 127.0.0.1:8889 (non-loopback needs --token-file)")
    .option("--token-file <file>", "bearer tokens for the TCP listener, one per line (>= 16 bytes each)")
    .option("--tls-cert <file>", "PEM certificate: serve HTTPS on --bind")
    .option("--tls-key <file>", "PEM private key for --tls-cert")
    .option("--audit-log <file>", "append-only audit log (reopened on SIGHUP)", DEFAULT_AUDIT_LOG)
    .option("--no-audit-log", "do not write an audit log")
    .option(
      "--drain-timeout-ms <ms>",
      "on SIGTERM, how long in-flight requests may finish",
      parseIntOption("--drain-timeout-ms", 0, 3_600_000),
      DEFAULT_DRAIN_TIMEOUT_MS,
    )
    .option("--log-level <level>", "pino log level (trace, debug, info, warn, error)", "info")
    .option("--max-sandboxes <n>", "sandboxes alive at once", parseIntOption("--max-sandboxes", 1, 100_000))
    .option(
      "--max-concurrent-spawns <n>",
      "spawn requests served at once (more get 429)",
      parseIntOption("--max-concurrent-spawns", 1, 1000),
    )
    .option(
      "--memory-reserve-mib <mib>",
      "host memory that must stay available after a spawn",
      parseIntOption("--memory-reserve-mib", 0, 1 << 30),
    )
    .option(
      "--egress <allow|deny>",
      "egress of sandboxes whose spawn names no policy (deny: the stricter default for multi-tenant hosts)",
      "allow",
    )
    .option(
      "--net-bridge <name>",
      "host bridge for the sandboxes' networks (default forkd0; env FORKD_NET_BRIDGE)",
    )
    .option("--net-subnet <cidr>", "the bridge's subnet (default 10.43.0.0/16; env FORKD_NET_SUBNET)")
    .option(
      "--dns-upstream <ip[:port]>",
      "resolver the sandboxes' DNS forwarder asks (repeatable; default: /etc/resolv.conf; env FORKD_DNS_UPSTREAM)",
      (value: string, previous: string[] = []) => [...previous, value],
    )
    .option(
      "--dns-port <port>",
      "the DNS forwarder's port on the bridge (default 53)",
      parseIntOption("--dns-port", 1, 65535),
    )
    .addHelpText(
      "after",
      "\nEnvironment: FORKD_HOME (state, default /var/lib/forkd), FORKD_IMAGE_CACHE.\n" +
        "Signals: SIGTERM/SIGINT drain and stop (sandboxes keep running and are re-attached on the next start);\n" +
        "SIGHUP reopens the audit log.\n",
    )
    .action(async (opts: DaemonOptions) => {
      try {
        if (!Object.hasOwn(pino.levels.values, opts.logLevel)) {
          throw invalidArgument(
            `unknown --log-level ${JSON.stringify(opts.logLevel)}: use trace, debug, info, warn or error`,
          );
        }
        const logger = pino(
          { name: "forkd", level: opts.logLevel },
          pino.destination({ dest: 2, sync: true }),
        );
        if (opts.egress !== "allow" && opts.egress !== "deny") {
          throw invalidArgument(`--egress must be allow or deny, got ${JSON.stringify(opts.egress)}`);
        }
        const network = {
          defaultEgress: opts.egress,
          network: {
            bridge: opts.netBridge,
            subnet: opts.netSubnet,
            dnsUpstreams: opts.dnsUpstream,
            dnsPort: opts.dnsPort,
          },
        } as const;
        const paths = resolvePaths();
        await runDaemon(
          {
            socketPath: opts.socket === false ? null : opts.socket,
            socketGroup: opts.socketGroup,
            bind: opts.bind,
            tokenFile: opts.tokenFile,
            tlsCert: opts.tlsCert,
            tlsKey: opts.tlsKey,
            auditLog: opts.auditLog === false ? null : opts.auditLog,
            drainTimeoutMs: opts.drainTimeoutMs,
            snapshotsDir: paths.snapshots,
            logger,
          },
          async () => {
            const limits = {
              ...(opts.maxSandboxes === undefined ? {} : { maxSandboxes: opts.maxSandboxes }),
              ...(opts.maxConcurrentSpawns === undefined
                ? {}
                : { maxConcurrentSpawns: opts.maxConcurrentSpawns }),
              ...(opts.memoryReserveMib === undefined ? {} : { reserveMiB: opts.memoryReserveMib }),
            };
            // close() without killing: sandboxes outlive a daemon restart and are re-attached on the next start.
            const services = await openServices(paths, {
              limits,
              network,
              log: logger.child({ component: "manager" }),
            });
            return { ...services, close: () => services.close() };
          },
        );
        process.exit(EXIT.ok);
      } catch (err) {
        process.stderr.write(`forkd daemon: ${describeStartupError(err)}\n`);
        process.exit(
          err instanceof ForkdError && err.code === "invalid_argument" ? EXIT.usage : EXIT.failure,
        );
      }
    });
}
