/**
 * The daemon's lifecycle around the API: check the listening configuration (before any VM state is touched), open
 * the services, listen on the Unix socket and optionally TCP, and on SIGTERM stop accepting, drain in-flight
 * requests for a bounded time, then close the services. SIGHUP reopens the audit log (log rotation).
 */

import { readFile } from "node:fs/promises";
import type { FastifyInstance } from "fastify";
import pino, { type Logger } from "pino";
import { errorMessage, ForkdError, invalidArgument } from "../common/errors.js";
import { FORKD_VERSION } from "../common/version.js";
import { defaultSandboxDomain, type E2bSettings } from "../e2b/index.js";
import { ConnectionBudget } from "../http/connection-budget.js";
import {
  type ApiOptions,
  buildApi,
  type DaemonServices,
  type RegisteredRoute,
  registeredRoutes,
} from "./app.js";
import { AuditLog } from "./audit.js";
import { loadTokenFile, type Token } from "./auth.js";
import type { HostPathRedaction } from "./errors.js";
import type { ApiExtension, ApiExtensionFactory } from "./extensions.js";
import type { TrustedFront } from "./front.js";
import {
  checkBindPolicy,
  isLoopbackHost,
  listenTcp,
  listenUnix,
  parseBind,
  type TcpAddress,
} from "./listen.js";
import { createMetrics } from "./metrics.js";
import { originPolicyFor } from "./origin-policy.js";

/** How long SIGTERM waits for in-flight requests (a spawn of many children, a long exec) before cutting them. */
export const DEFAULT_DRAIN_TIMEOUT_MS = 30_000;
/** After cutting connections, how long the cancelled requests get to unwind before the services close anyway. */
const CANCEL_GRACE_MS = 5_000;

export interface ClosableServices extends DaemonServices {
  close(): Promise<void>;
}

export interface DaemonConfig {
  /** Unix socket path; null = no Unix socket (then `bind` is required). */
  socketPath: string | null;
  /** Group that may use the socket (name or gid); default: root's group only. */
  socketGroup?: string;
  /** "host:port" for TCP; absent = no TCP listener. */
  bind?: string;
  tokenFile?: string;
  /** Extra names the TCP listener answers to (`Host`), e.g. a DNS name or `*.sandboxes.example`. */
  allowedHosts?: string[];
  /** Extra origins (scheme://host:port) whose browser requests the TCP listener serves. */
  allowedOrigins?: string[];
  /** Connections each listener holds at once. */
  maxConnections?: number;
  /** Connections one tenant holds at once, across the listeners (default DEFAULT_TENANT_MAX_CONNECTIONS). */
  tenantMaxConnections?: number;
  /** Time a client gets to send its request headers (tests shorten it). */
  headersTimeoutMs?: number;
  tlsCert?: string;
  tlsKey?: string;
  /** Audit log path; null = no audit log (tests). */
  auditLog: string | null;
  drainTimeoutMs?: number;
  snapshotsDir: string;
  /** Host directories redacted from error messages (FORKD_HOME, the image cache, the tmpfs image directory). */
  hostPaths?: readonly HostPathRedaction[];
  /** The E2B API's settings (see src/e2b). */
  e2b?: E2bSettings;
  /** Surfaces mounted on every listener (the web console), made once over the opened services. */
  extensions?: readonly ApiExtensionFactory[];
  /** The TCP listener takes calls only through this front (front.ts; a cluster node's gateway). */
  front?: TrustedFront;
  logger?: Logger;
}

export interface RunningDaemon {
  /** Where it listens: "unix:/run/forkd/forkd.sock", "http://127.0.0.1:8889", ... */
  urls: string[];
  /** The routes each listener serves (by its url), as registered: what the route-walking tenancy test walks. */
  routes(url: string): RegisteredRoute[];
  /** Drains and closes everything; idempotent. */
  stop(reason: string): Promise<void>;
  reopenAuditLog(): void;
  readonly logger: Logger;
}

interface CheckedConfig {
  tcp: TcpAddress | undefined;
  tokens: Token[];
  https: { key: Buffer; cert: Buffer } | undefined;
}

/** Everything that can be wrong with the listening configuration, found before the services are opened. */
export async function checkConfig(config: DaemonConfig): Promise<CheckedConfig> {
  if (config.socketPath === null && config.bind === undefined) {
    throw invalidArgument("nothing to listen on: give a socket path or --bind");
  }
  if ((config.tlsCert === undefined) !== (config.tlsKey === undefined)) {
    throw invalidArgument("--tls-cert and --tls-key go together");
  }
  if (config.tlsCert !== undefined && config.bind === undefined) {
    throw invalidArgument("--tls-cert/--tls-key need --bind (TLS is for the TCP listener)");
  }
  if (config.tokenFile !== undefined && config.bind === undefined) {
    throw invalidArgument("--token-file needs --bind: the Unix socket is guarded by its file permissions");
  }
  const tokens = config.tokenFile === undefined ? [] : await loadTokenFile(config.tokenFile);
  const tcp = config.bind === undefined ? undefined : parseBind(config.bind);
  if (tcp) checkBindPolicy(tcp, tokens.length > 0);
  if ((config.allowedHosts?.length || config.allowedOrigins?.length) && tcp === undefined) {
    throw invalidArgument("--allowed-host/--allowed-origin need --bind (they guard the TCP listener)");
  }
  // Validated now, so a typo fails the start instead of the first request.
  if (tcp) {
    originPolicyFor(tcp.host, tcp.port, { hosts: config.allowedHosts, origins: config.allowedOrigins });
  }
  let https: CheckedConfig["https"];
  if (config.tlsCert !== undefined && config.tlsKey !== undefined) {
    const read = (file: string, what: string) =>
      readFile(file).catch((err: NodeJS.ErrnoException) => {
        throw invalidArgument(`cannot read ${what} ${file}: ${err.code ?? err.message}`);
      });
    https = { cert: await read(config.tlsCert, "--tls-cert"), key: await read(config.tlsKey, "--tls-key") };
  }
  return { tcp, tokens, https };
}

/**
 * Starts listening over already-open services. On failure everything started so far is closed again, the
 * services included: the caller hands ownership of them over.
 */
export async function startDaemon(config: DaemonConfig, services: ClosableServices): Promise<RunningDaemon> {
  const logger = config.logger ?? pino({ name: "forkd", level: "info" });
  const apps: FastifyInstance[] = [];
  let audit: AuditLog | undefined;
  let extensions: ApiExtension[] = [];
  const closeExtensions = () =>
    Promise.allSettled(extensions.map((extension) => extension.close?.())).then(() => {});
  const closeServices = async () => {
    await services.close().catch((err: unknown) => logger.error({ err }, "closing the services failed"));
    await audit?.close();
  };
  try {
    const checked = await checkConfig(config);
    if (config.auditLog !== null) {
      audit = await AuditLog.open(config.auditLog, (err) => logger.error({ err }, "audit log write failed"));
    }
    // Sandbox host names (getHost) are the daemon's own, never E2B's production domain.
    const e2bDomain = config.e2b?.domain ?? defaultSandboxDomain(checked.tcp);
    const metrics = createMetrics(services, { version: FORKD_VERSION });
    extensions = (config.extensions ?? []).map((make) =>
      make({ services, metrics, snapshotsDir: config.snapshotsDir, logger }),
    );
    const common: ListenerOptions = {
      extensions,
      services,
      snapshotsDir: config.snapshotsDir,
      hostPaths: config.hostPaths,
      metrics,
      audit,
      logger,
      maxConnections: config.maxConnections,
      connections: new ConnectionBudget(config.tenantMaxConnections),
      headersTimeoutMs: config.headersTimeoutMs,
      e2b: { ...config.e2b, domain: e2bDomain },
      daemonTokens: checked.tokens,
    };
    const urls = await startListeners(config, checked, common, apps);
    let stopping: Promise<void> | undefined;
    const stop = (reason: string) => {
      const drainMs = config.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS;
      stopping ??= drainAndClose(apps, closeExtensions, drainMs, logger, reason).then(async () => {
        await closeServices();
        logger.info("forkd daemon stopped");
      });
      return stopping;
    };
    logger.info({ urls, version: FORKD_VERSION, audit: audit?.file ?? null }, "forkd daemon listening");
    return {
      urls,
      routes: (url) => {
        const app = apps[urls.indexOf(url)];
        if (app === undefined) throw new Error(`no listener at ${url} (listening at ${urls.join(", ")})`);
        return registeredRoutes(app);
      },
      stop,
      reopenAuditLog: () => {
        audit?.reopen();
        logger.info({ audit: audit?.file ?? null }, "audit log reopened");
      },
      logger,
    };
  } catch (err) {
    await closeExtensions();
    await Promise.allSettled(apps.map((app) => app.close()));
    await closeServices();
    throw err;
  }
}

/** What every listener's API shares (ApiOptions less what differs per listener). */
type ListenerOptions = Omit<ApiOptions, "transport" | "tokens" | "https" | "origin">;

/** The Unix socket and the TCP listener the config asks for; each app is pushed to `apps` once it exists. */
async function startListeners(
  config: DaemonConfig,
  checked: CheckedConfig,
  common: ListenerOptions,
  apps: FastifyInstance[],
): Promise<string[]> {
  const urls: string[] = [];
  if (config.socketPath !== null) {
    const app = await buildApi({ ...common, transport: "unix" });
    apps.push(app);
    await listenUnix(app, config.socketPath, config.socketGroup);
    urls.push(`unix:${config.socketPath}`);
  }
  if (checked.tcp) {
    const app = await buildApi({
      ...common,
      transport: "tcp",
      tokens: checked.tokens,
      https: checked.https,
      front: config.front,
      origin: {
        bindHost: checked.tcp.host,
        // Without --e2b-domain the sandboxes' host names are under the daemon's own name (getHost).
        allowedHosts: [
          ...(config.allowedHosts ?? []),
          ...(config.e2b?.domain === undefined && common.e2b?.domain !== undefined
            ? [`*.${common.e2b.domain.split(":")[0]}`]
            : []),
        ],
        allowedOrigins: config.allowedOrigins,
      },
    });
    apps.push(app);
    await listenTcp(app, checked.tcp);
    const bound = app.server.address();
    const port = typeof bound === "object" && bound ? bound.port : checked.tcp.port;
    const host = checked.tcp.host.includes(":") ? `[${checked.tcp.host}]` : checked.tcp.host;
    urls.push(`${checked.https ? "https" : "http"}://${host}:${port}`);
    if (!checked.https && !isLoopbackHost(checked.tcp.host)) {
      common.logger?.warn("TCP listener without TLS: bearer tokens cross the network in clear text");
    }
  }
  return urls;
}

async function drainAndClose(
  apps: FastifyInstance[],
  closeExtensions: () => Promise<void>,
  drainMs: number,
  logger: Logger,
  reason: string,
) {
  logger.info(
    { reason, drain_timeout_ms: drainMs },
    "stopping: no new connections, draining in-flight requests",
  );
  // Long-lived responses (event streams, terminals) would otherwise hold the drain for its whole timeout.
  await closeExtensions();
  const closed = Promise.allSettled(apps.map((app) => app.close()));
  const drained = await Promise.race([closed.then(() => true), delay(drainMs).then(() => false)]);
  if (drained) return;
  logger.warn("drain timeout: closing the remaining connections (their requests are cancelled)");
  for (const app of apps) app.server.closeAllConnections();
  await Promise.race([closed, delay(CANCEL_GRACE_MS)]);
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/**
 * Runs until SIGTERM/SIGINT: checks the config, opens the services, listens, then drains and closes. A second
 * SIGTERM/SIGINT while draining exits at once (the reconcile on the next start cleans up).
 */
export async function runDaemon(
  config: DaemonConfig,
  openServices: () => Promise<ClosableServices>,
): Promise<void> {
  const logger = config.logger ?? pino({ name: "forkd", level: "info" });
  installCrashHandlers(logger);
  await checkConfig(config);
  const services = await openServices();
  const daemon = await startDaemon({ ...config, logger }, services);
  await new Promise<void>((resolve) => {
    let signals = 0;
    const onStop = (sig: NodeJS.Signals) => {
      signals++;
      if (signals > 1) {
        logger.error(`${sig} again while draining: exiting now`);
        process.exit(1);
      }
      daemon.stop(sig).then(resolve, (err: unknown) => {
        logger.error({ err }, "stopping failed");
        resolve();
      });
    };
    const onHangup = () => daemon.reopenAuditLog();
    process.on("SIGTERM", onStop);
    process.on("SIGINT", onStop);
    process.on("SIGHUP", onHangup);
  });
}

/**
 * A rejected promise nobody awaited is a bug, not a reason to drop every connection and leave sandboxes
 * re-attaching: log it with its stack and keep serving. So is an error of one network connection (a write to a
 * client that has gone) that reached the top because a handler was missing: that connection is lost, the
 * others are not, so it is logged with its stack and the daemon keeps serving. Any other exception thrown to
 * the top may have left state half-changed: log it and exit, and the next start reconciles.
 */
function installCrashHandlers(logger: Logger): void {
  process.on("unhandledRejection", (reason) => {
    logger.error({ err: reason }, "unhandled promise rejection (a bug); the daemon keeps running");
  });
  process.on("uncaughtException", (err) => {
    if (isConnectionError(err)) {
      logger.error(
        { err },
        "an error of one connection reached the top (a bug: its handler is missing); the daemon keeps running",
      );
      return;
    }
    logger.fatal({ err }, "uncaught exception: exiting (the next start re-attaches and reconciles)");
    process.exit(1);
  });
}

/** Error codes that belong to one connection's socket, not to the daemon's state. */
const CONNECTION_ERROR_CODES = new Set([
  "ECONNRESET",
  "EPIPE",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ERR_STREAM_DESTROYED",
  "ERR_STREAM_WRITE_AFTER_END",
  "ERR_STREAM_PREMATURE_CLOSE",
  "ERR_SOCKET_CLOSED",
]);

/** Whether `err` is the failure of one network connection (a socket read or write, a stream already gone). */
export function isConnectionError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const { code, syscall } = err as NodeJS.ErrnoException;
  if (code === undefined || !CONNECTION_ERROR_CODES.has(code)) return false;
  // System errors must come from a socket operation (a file write failing with EPIPE is not a connection's).
  return syscall === undefined || ["read", "write", "writev", "shutdown"].includes(syscall);
}

export function describeStartupError(err: unknown): string {
  if (err instanceof ForkdError) return err.message;
  const code = (err as NodeJS.ErrnoException).code;
  if (code === "EADDRINUSE") return `address already in use: ${errorMessage(err)}`;
  if (code === "EACCES") return `permission denied: ${errorMessage(err)} (the daemon runs as root)`;
  return errorMessage(err);
}
