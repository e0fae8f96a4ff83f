/** `forkd daemon` (alias `serve`): owns all state and serves the REST API (src/api) until SIGTERM. */
import { statSync } from "node:fs";
import path from "node:path";
import { type Command, InvalidArgumentError } from "commander";
import pino, { type Logger } from "pino";
import { DEFAULT_AUDIT_LOG } from "../../api/audit.js";
import {
  type ClosableServices,
  type DaemonConfig,
  DEFAULT_DRAIN_TIMEOUT_MS,
  describeStartupError,
  runDaemon,
} from "../../api/daemon.js";
import { ClusterNode } from "../../cluster-node/index.js";
import { armCrashPoints, CRASH_AT_ENV } from "../../common/crash-points.js";
import { errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import {
  DEFAULT_DISK_LIMIT_MIB,
  DEFAULT_SOCKET_PATH,
  MAX_DISK_LIMIT_MIB,
  MAX_SANDBOX_TIMEOUT_MS,
  MIN_DISK_LIMIT_MIB,
} from "../../common/limits.js";
import { assertTag } from "../../common/names.js";
import { type ForkdPaths, resolvePaths } from "../../common/paths.js";
import { loadTokenFile } from "../../common/tokens.js";
import { consoleExtension } from "../../console/index.js";
import { cacheDirs } from "../../controller/machines/restore-plan.js";
import { DEFAULT_ADMISSION_LIMITS } from "../../controller/sandboxes/admission.js";
import { openServices, SandboxManager } from "../../controller/sandboxes/manager.js";
import { parseWarmPoolTarget, type WarmPoolTarget } from "../../controller/sandboxes/warm-pool.js";
import { MAX_BRANCH_CONCURRENCY, MAX_CONCURRENT_BRANCHES } from "../../controller/snapshots/branch.js";
import { limitTenants } from "../../controller/tenancy/tenant-view.js";
import { registryTlsVerify, skopeoDelete } from "../../image/index.js";
import { confinementMode } from "../../isolation/confinement.js";
import { checkNamespace, checkObjectName } from "../../kube/config.js";
import {
  DEFAULT_CONSOLE_LOG_BYTES,
  MAX_CONSOLE_LOG_BYTES,
  MIN_CONSOLE_LOG_BYTES,
} from "../../vmm/console-log.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "../options.js";

const DOMAIN =
  /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

interface DaemonOptions {
  socket: string | false;
  socketGroup?: string;
  bind?: string;
  tokenFile?: string;
  allowedHost: string[];
  allowedOrigin: string[];
  maxConnections?: number;
  tenantMaxConnections?: number;
  tlsCert?: string;
  tlsKey?: string;
  auditLog: string | false;
  drainTimeoutMs: number;
  logLevel: string;
  maxSandboxes?: number;
  tenantMaxSandboxes?: number;
  maxConcurrentSpawns?: number;
  maxParentBoots?: number;
  tenantMaxParentBoots?: number;
  memoryReserveMib?: number;
  defaultTimeoutMs?: number;
  metricsIntervalS: number;
  branchConcurrency?: number;
  warmPool: WarmPoolTarget[];
  state?: string;
  snapshotRoot?: string;
  allowImageDir: string[];
  defaultSnapshot?: string;
  e2bDomain?: string;
  e2bMaxUploadMib?: number;
  e2bPrivateTraffic?: boolean;
  egress: string;
  netBridge?: string;
  netSubnet?: string;
  dnsUpstream?: string[];
  dnsPort?: number;
  confinement?: string;
  diskLimitMib?: number;
  consoleLogKib?: number;
  unprivilegedUserfaultfd: boolean;
  console: boolean;
  clusterNamespace?: string;
  clusterNodeName?: string;
  clusterUrl?: string;
  clusterRegistry?: string;
  clusterRegistryInsecure?: boolean;
  clusterPreviousTokenFile?: string;
  kubeconfig?: string;
}

export function registerDaemon(program: Command): void {
  const command = program
    .command("daemon")
    .alias("serve")
    .description(
      "run the forkd daemon: REST API on a Unix socket (and optionally TCP), owning all sandboxes",
    );
  for (const add of [
    listenerOptions,
    loggingOptions,
    admissionOptions,
    snapshotOptions,
    e2bOptions,
    networkOptions,
    confinementOptions,
    clusterOptions,
  ]) {
    add(command);
  }
  command
    .addHelpText(
      "after",
      "\nConsole: a web console at /console on every listener (TCP: log in with a token; the socket: through a local proxy).\n" +
        "E2B: the same listener answers E2B's API (E2B_API_URL=E2B_SANDBOX_URL=<this address>, E2B_API_KEY=<a token>).\n" +
        "Environment: FORKD_HOME (state, default /var/lib/forkd), FORKD_IMAGE_CACHE.\n" +
        "Signals: SIGTERM/SIGINT drain and stop (sandboxes keep running and are re-attached on the next start);\n" +
        "SIGHUP reopens the audit log.\n",
    )
    .action(async (opts: DaemonOptions) => {
      try {
        await serve(opts);
        process.exit(EXIT.ok);
      } catch (err) {
        process.stderr.write(`forkd daemon: ${describeStartupError(err)}\n`);
        process.exit(
          err instanceof ForkdError && err.code === "invalid_argument" ? EXIT.usage : EXIT.failure,
        );
      }
    });
}

/** Where the daemon listens and who may call it. */
function listenerOptions(command: Command): void {
  command
    .option("--socket <path>", "Unix socket to listen on", DEFAULT_SOCKET_PATH)
    .option("--no-socket", "do not listen on a Unix socket (needs --bind)")
    .option("--socket-group <group>", "group allowed to use the socket (mode 0660)")
    .option("--bind <host:port>", "also listen on TCP, e.g. 127.0.0.1:8889 (needs --token-file)")
    .option(
      "--token-file <file>",
      "bearer tokens for the TCP listener, one per line (>= 16 bytes each, mode 0600)",
    )
    .option(
      "--allowed-host <host>",
      "another name the TCP listener answers to (Host header), e.g. forkd.internal or *.sandboxes.example; repeatable",
      collect,
      [],
    )
    .option(
      "--allowed-origin <origin>",
      "a browser origin (scheme://host:port) the TCP listener serves besides its own; repeatable",
      collect,
      [],
    )
    .option(
      "--max-connections <n>",
      "connections each listener holds at once",
      parseIntOption("--max-connections", 1, 1_000_000),
    )
    .option(
      "--tenant-max-connections <n>",
      "connections one tenant's callers and its sandboxes' public traffic hold at once, across listeners (more get 429; default 256)",
      parseIntOption("--tenant-max-connections", 1, 1_000_000),
    )
    .option("--tls-cert <file>", "PEM certificate: serve HTTPS on --bind")
    .option("--tls-key <file>", "PEM private key for --tls-cert")
    .option("--no-console", "do not serve the web console at /console (docs/console.md)");
}

/** The audit log, the daemon's own log, and how it stops. */
function loggingOptions(command: Command): void {
  command
    .option("--audit-log <file>", "append-only audit log (reopened on SIGHUP)", DEFAULT_AUDIT_LOG)
    .option("--no-audit-log", "do not write an audit log")
    .option(
      "--drain-timeout-ms <ms>",
      "on SIGTERM, how long in-flight requests may finish",
      parseIntOption("--drain-timeout-ms", 0, 3_600_000),
      DEFAULT_DRAIN_TIMEOUT_MS,
    )
    .option("--log-level <level>", "pino log level (trace, debug, info, warn, error)", "info");
}

/** How much the daemon takes on: sandboxes, spawns, memory, lifetimes, BRANCHes, prestarted VMs. */
function admissionOptions(command: Command): void {
  command
    .option("--max-sandboxes <n>", "sandboxes alive at once", parseIntOption("--max-sandboxes", 1, 100_000))
    .option(
      "--tenant-max-sandboxes <n>",
      "sandboxes one tenant's tokens may hold at once (more get 429; admins: no limit)",
      parseIntOption("--tenant-max-sandboxes", 1, 100_000),
    )
    .option(
      "--max-concurrent-spawns <n>",
      "spawn requests served at once (more get 429)",
      parseIntOption("--max-concurrent-spawns", 1, 1000),
    )
    .option(
      "--max-parent-boots <n>",
      "snapshots built at once (POST /v1/snapshots: image build and parent boot; more get 429; default 2)",
      parseIntOption("--max-parent-boots", 1, 100),
    )
    .option(
      "--tenant-max-parent-boots <n>",
      "snapshots one tenant's tokens may build at once (more get 429; default 1; admins: --max-parent-boots)",
      parseIntOption("--tenant-max-parent-boots", 1, 100),
    )
    .option(
      "--memory-reserve-mib <mib>",
      "host memory that must stay available after a spawn",
      parseIntOption("--memory-reserve-mib", 0, 1 << 30),
    )
    .option(
      "--default-timeout-ms <ms>",
      "lifetime of sandboxes spawned without timeout_ms (default: none, they live until killed; 0 = none)",
      parseIntOption("--default-timeout-ms", 0, MAX_SANDBOX_TIMEOUT_MS),
    )
    .option(
      "--metrics-interval-s <s>",
      "sample every running sandbox's metrics this often into the series E2B's metrics route answers " +
        "(bounded per sandbox; 0 = keep none, sample when asked)",
      parseIntOption("--metrics-interval-s", 0, 3600),
      5,
    )
    .option(
      "--branch-concurrency <n>",
      `BRANCHes in flight at once, host-wide; more are answered 503 (default ${MAX_CONCURRENT_BRANCHES})`,
      parseIntOption("--branch-concurrency", 1, MAX_BRANCH_CONCURRENCY),
    )
    .option(
      "--warm-pool <tag:n>",
      "keep n sandboxes of snapshot tag restored ahead, with networks made ahead in netns mode (repeatable)",
      (text: string, pools: WarmPoolTarget[]) => [...pools, parseWarmPoolOption(text)],
      [] as WarmPoolTarget[],
    );
}

/** Where snapshots and images come from, forkd v0.5's state flags among them. */
function snapshotOptions(command: Command): void {
  command
    .option(
      "--allow-image-dir <dir>",
      "another image cache whose images forkd v0.5 clients may name by kernel/rootfs path (repeatable)",
      (dir: string, dirs: string[]) => [...dirs, dir],
      [] as string[],
    )
    .option(
      "--state <file>",
      "forkd v0.5 flag: its state file; here FORKD_HOME becomes the file's directory (state in state.db there)",
    )
    .option(
      "--snapshot-root <dir>",
      "forkd v0.5 flag: where snapshots live; must be <FORKD_HOME>/snapshots (FORKD_HOME = its parent)",
    )
    .option(
      "--default-snapshot <tag>",
      "snapshot E2B's default template names (base, code-interpreter-v1) mean (default: pyagent when present)",
    );
}

/** The E2B API's settings. */
function e2bOptions(command: Command): void {
  command
    .option(
      "--e2b-domain <domain>",
      "base domain of E2B sandbox host names <port>-<sandboxId>.<domain> (returned to E2B clients)",
    )
    .option(
      "--e2b-max-upload-mib <mib>",
      "largest upload one E2B POST /files may carry (default 1024)",
      parseIntOption("--e2b-max-upload-mib", 1, 1 << 20),
    )
    .option(
      "--e2b-private-traffic",
      "every E2B sandbox's ports need its traffic access token (E2B's default is public: anyone who reaches the listener)",
    );
}

/** The sandboxes' networks. */
function networkOptions(command: Command): void {
  command
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
    );
}

/** How each QEMU is confined and bounded. */
function confinementOptions(command: Command): void {
  command
    .option(
      "--confinement <on|off>",
      "confine every QEMU (own uid, no capabilities, mount namespace, seccomp, cgroups); off only to measure it (env FORKD_CONFINEMENT)",
    )
    .option(
      "--disk-limit-mib <n>",
      `largest writable disk layer of a sandbox whose spawn names none (default ${DEFAULT_DISK_LIMIT_MIB})`,
      parseIntOption("--disk-limit-mib", MIN_DISK_LIMIT_MIB, MAX_DISK_LIMIT_MIB),
    )
    .option(
      "--console-log-kib <n>",
      `serial console log kept per sandbox, a ring (default ${DEFAULT_CONSOLE_LOG_BYTES / 1024})`,
      parseIntOption("--console-log-kib", MIN_CONSOLE_LOG_BYTES / 1024, MAX_CONSOLE_LOG_BYTES / 1024),
    )
    .option(
      "--no-unprivileged-userfaultfd",
      "never set vm.unprivileged_userfaultfd=1 (live BRANCH of confined sandboxes is then refused)",
    );
}

/** Membership of a cluster (docs/kubernetes.md): all three flags, or none. */
function clusterOptions(command: Command): void {
  command
    .option(
      "--cluster-namespace <ns>",
      "join the forkd cluster in this Kubernetes namespace (with --cluster-node-name and --cluster-url)",
    )
    .option("--cluster-node-name <name>", "this node's name (its ForkdNode and Lease are named so)")
    .option(
      "--cluster-url <url>",
      "where the gateway reaches this daemon's --bind listener, e.g. http://10.0.0.5:8889",
    )
    .option(
      "--cluster-registry <host[:port]>",
      "the cluster's OCI registry, where durable pauses are pushed (none: durable pauses are refused)",
    )
    .option(
      "--cluster-registry-insecure",
      "plain HTTP or unverified TLS to the cluster registry when it is not on loopback",
    )
    .option(
      "--cluster-previous-token-file <file>",
      "the node token(s) before a rotation: tried after the node token to unseal durable pauses sealed under them (read at each adoption; absent: none)",
    )
    .option(
      "--kubeconfig <file>",
      "Kubernetes client configuration (default: KUBECONFIG, then the pod's ServiceAccount)",
    );
}

/** Checks the flags, then runs the daemon until SIGTERM/SIGINT. */
async function serve(opts: DaemonOptions): Promise<void> {
  if (!Object.hasOwn(pino.levels.values, opts.logLevel)) {
    throw invalidArgument(
      `unknown --log-level ${JSON.stringify(opts.logLevel)}: use trace, debug, info, warn or error`,
    );
  }
  const logger = pino({ name: "forkd", level: opts.logLevel }, pino.destination({ dest: 2, sync: true }));
  // A misspelt crash point must fail here, not silently never fire in a crash-safety test.
  try {
    const armed = armCrashPoints();
    if (armed.length > 0)
      logger.warn({ crashPoints: armed }, `${CRASH_AT_ENV} is set: this daemon will SIGKILL itself`);
  } catch (err) {
    throw invalidArgument(errorMessage(err));
  }
  if (opts.egress !== "allow" && opts.egress !== "deny") {
    throw invalidArgument(`--egress must be allow or deny, got ${JSON.stringify(opts.egress)}`);
  }
  const paths = resolvePaths({ ...process.env, ...homeFromV05Flags(opts) });
  if (opts.defaultSnapshot !== undefined) assertTag(opts.defaultSnapshot, "--default-snapshot");
  if (opts.e2bDomain !== undefined && !DOMAIN.test(opts.e2bDomain)) {
    throw invalidArgument(`invalid --e2b-domain ${JSON.stringify(opts.e2bDomain)}: expected a DNS name`);
  }
  const config = daemonConfig(opts, paths, logger);
  const cluster = await clusterNodeOf(opts, paths, logger, config);
  await runDaemon(config, async () => {
    const services = await openDaemonServices(opts, paths, logger);
    const manager = services.sandboxes;
    if (cluster && manager instanceof SandboxManager) {
      cluster.usePools({
        set: (tag, size) => manager.setWarmPool(tag, size),
        stats: () => manager.warmPoolStats().map((p) => ({ tag: p.tag, ready: p.ready, target: p.size })),
      });
    }
    return services;
  });
}

/**
 * In cluster mode (docs/kubernetes.md): the TCP listener takes calls only through the gateway (the token file
 * holds the cluster credential, the node token), and the daemon joins the cluster once its services are open.
 * A kubelet mounts the node token only once the controller has filled the Secret: the start waits for it.
 */
async function clusterNodeOf(
  opts: DaemonOptions,
  paths: ForkdPaths,
  logger: Logger,
  config: DaemonConfig,
): Promise<ClusterNode | undefined> {
  const flags = [opts.clusterNamespace, opts.clusterNodeName, opts.clusterUrl];
  if (flags.every((f) => f === undefined)) {
    if (opts.kubeconfig !== undefined)
      throw invalidArgument("--kubeconfig is for cluster mode (--cluster-*)");
    return undefined;
  }
  if (flags.some((f) => f === undefined)) {
    throw invalidArgument("--cluster-namespace, --cluster-node-name and --cluster-url go together");
  }
  if (opts.bind === undefined || opts.tokenFile === undefined) {
    throw invalidArgument(
      "a cluster node needs --bind (the listener the gateway calls) and --token-file (the node token)",
    );
  }
  const namespace = checkNamespace(opts.clusterNamespace as string);
  const nodeName = checkObjectName(opts.clusterNodeName as string, "--cluster-node-name");
  const url = checkClusterUrl(opts.clusterUrl as string);
  await waitForFile(opts.tokenFile, logger);
  const cluster = await ClusterNode.open({
    namespace,
    nodeName,
    url,
    kubeconfig: opts.kubeconfig,
    home: paths.home,
    tokens: await loadTokenFile(opts.tokenFile),
    registry: checkRegistryHost(opts.clusterRegistry),
    registryInsecure: opts.clusterRegistryInsecure === true,
    previousTokenFile: opts.clusterPreviousTokenFile,
    deleteArtifact: (reference) =>
      skopeoDelete(`docker://${reference}`, {
        tlsVerify: registryTlsVerify(reference, opts.clusterRegistryInsecure === true),
      }),
    limits: {
      maxSandboxes: opts.maxSandboxes ?? DEFAULT_ADMISSION_LIMITS.maxSandboxes,
      reserveMiB: opts.memoryReserveMib ?? DEFAULT_ADMISSION_LIMITS.reserveMiB,
    },
    logger,
  });
  config.front = cluster.front;
  config.extensions = [...(config.extensions ?? []), cluster.extension()];
  return cluster;
}

/** host[:port] of a registry (it becomes the start of every durable pause's reference). */
function checkRegistryHost(text: string | undefined): string | undefined {
  if (text === undefined) return undefined;
  if (!/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$/.test(text)) {
    throw invalidArgument(`--cluster-registry ${JSON.stringify(text)} is not host[:port]`);
  }
  return text;
}

function checkClusterUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw invalidArgument(`--cluster-url ${JSON.stringify(text)} is not a URL`);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.search || url.hash || url.username) {
    throw invalidArgument(`--cluster-url must be http(s)://host:port, got ${JSON.stringify(text)}`);
  }
  return text.replace(/\/+$/, "");
}

/** Waits for `file` to appear (a Secret key a kubelet mounts once it is filled), saying so every 10 s. */
async function waitForFile(file: string, logger: Logger): Promise<void> {
  for (let waited = 0; ; waited += 1000) {
    if (statSync(file, { throwIfNoEntry: false })) return;
    if (waited % 10_000 === 0) logger.info({ file }, "waiting for the node token to be mounted");
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

/** The listeners, logs and API settings the flags describe. */
function daemonConfig(opts: DaemonOptions, paths: ForkdPaths, logger: Logger): DaemonConfig {
  return {
    socketPath: opts.socket === false ? null : opts.socket,
    socketGroup: opts.socketGroup,
    bind: opts.bind,
    tokenFile: opts.tokenFile,
    // E2B clients reach sandboxes as <port>-<id>.<domain>: names of this listener too.
    allowedHosts: [...opts.allowedHost, ...(opts.e2bDomain ? [`*.${opts.e2bDomain}`] : [])],
    allowedOrigins: opts.allowedOrigin,
    maxConnections: opts.maxConnections,
    tenantMaxConnections: opts.tenantMaxConnections,
    tlsCert: opts.tlsCert,
    tlsKey: opts.tlsKey,
    auditLog: opts.auditLog === false ? null : opts.auditLog,
    drainTimeoutMs: opts.drainTimeoutMs,
    snapshotsDir: paths.snapshots,
    hostPaths: [
      { dir: paths.home, name: "$FORKD_HOME" },
      { dir: paths.images, name: "$FORKD_IMAGE_CACHE" },
      { dir: cacheDirs(paths).tmpfsDir, name: "$FORKD_TMPFS" },
    ],
    e2b: {
      domain: opts.e2bDomain,
      privateTraffic: opts.e2bPrivateTraffic === true,
      ...(opts.e2bMaxUploadMib === undefined ? {} : { maxUploadBytes: opts.e2bMaxUploadMib * 1024 * 1024 }),
    },
    extensions: opts.console ? [consoleExtension()] : [],
    logger,
  };
}

/** The daemon's services as the flags configure them; close() leaves sandboxes running (re-attached next start). */
async function openDaemonServices(
  opts: DaemonOptions,
  paths: ForkdPaths,
  logger: Logger,
): Promise<ClosableServices> {
  const limits = {
    ...(opts.maxSandboxes === undefined ? {} : { maxSandboxes: opts.maxSandboxes }),
    ...(opts.maxConcurrentSpawns === undefined ? {} : { maxConcurrentSpawns: opts.maxConcurrentSpawns }),
    ...(opts.memoryReserveMib === undefined ? {} : { reserveMiB: opts.memoryReserveMib }),
    ...(opts.maxParentBoots === undefined ? {} : { maxConcurrentParentBoots: opts.maxParentBoots }),
    ...(opts.tenantMaxParentBoots === undefined ? {} : { tenantMaxParentBoots: opts.tenantMaxParentBoots }),
  };
  const services = await openServices(paths, {
    limits,
    confinement:
      opts.confinement === undefined ? undefined : confinementMode({ FORKD_CONFINEMENT: opts.confinement }),
    diskLimitMiB: opts.diskLimitMib,
    consoleLogBytes: opts.consoleLogKib === undefined ? undefined : opts.consoleLogKib * 1024,
    allowUnprivilegedUserfaultfd: opts.unprivilegedUserfaultfd,
    defaultTimeoutMs: opts.defaultTimeoutMs,
    metricsIntervalMs: opts.metricsIntervalS * 1000,
    branchConcurrency: opts.branchConcurrency,
    warmPools: opts.warmPool,
    extraImageDirs: opts.allowImageDir.map((dir) => path.resolve(dir)),
    network: {
      defaultEgress: opts.egress as "allow" | "deny",
      network: {
        bridge: opts.netBridge,
        subnet: opts.netSubnet,
        dnsUpstreams: opts.dnsUpstream,
        dnsPort: opts.dnsPort,
      },
    },
    log: logger.child({ component: "manager" }),
    defaultSnapshot: opts.defaultSnapshot,
  });
  if (opts.tenantMaxSandboxes !== undefined) {
    limitTenants(services.sandboxes, { maxSandboxes: opts.tenantMaxSandboxes });
  }
  return { ...services, close: () => services.close() };
}

/**
 * forkd v0.5's daemon took `--state /var/lib/forkd/state.json` (a JSON state file) and `--snapshot-root DIR`; its
 * systemd and Kubernetes files pass them. Here all state lives in one home (FORKD_HOME: state.db, snapshots/,
 * run/), and snapshot layers name each other relative to it, so both flags name the home: the state file's
 * directory, the snapshot root's parent. They win over FORKD_HOME and must agree with each other. The v0.5 JSON
 * file itself is not read (its state format is not ours).
 */
export function homeFromV05Flags(opts: { state?: string; snapshotRoot?: string }): { FORKD_HOME?: string } {
  const homes: [string, string][] = [];
  if (opts.state !== undefined) {
    const state = path.resolve(opts.state);
    const isDir = statSync(state, { throwIfNoEntry: false })?.isDirectory() === true;
    homes.push([isDir ? state : path.dirname(state), `--state ${opts.state}`]);
  }
  if (opts.snapshotRoot !== undefined) {
    const root = path.resolve(opts.snapshotRoot);
    if (path.basename(root) !== "snapshots") {
      throw invalidArgument(
        `--snapshot-root ${opts.snapshotRoot}: forkd keeps snapshots in <FORKD_HOME>/snapshots (layers name each ` +
          "other relative to FORKD_HOME), so the directory must be named snapshots; or set FORKD_HOME instead",
      );
    }
    homes.push([path.dirname(root), `--snapshot-root ${opts.snapshotRoot}`]);
  }
  const [first, second] = homes;
  if (first && second && first[0] !== second[0]) {
    throw invalidArgument(
      `${first[1]} puts forkd's home at ${first[0]} but ${second[1]} at ${second[0]}: they must name one home`,
    );
  }
  return first ? { FORKD_HOME: first[0] } : {};
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

function parseWarmPoolOption(text: string): WarmPoolTarget {
  try {
    return parseWarmPoolTarget(text);
  } catch (err) {
    throw new InvalidArgumentError(`--warm-pool: ${(err as Error).message}`);
  }
}
