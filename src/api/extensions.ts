/**
 * Surfaces mounted on the API's listeners by a layer above the API (the web console, src/console): its routes on
 * each listener's Fastify instance, a way to identify callers that bring no bearer token (a session cookie) and
 * to screen requests before anything else runs, and the HTTP upgrades it answers. The API calls these hooks; it
 * imports nothing of the layers that implement them.
 */
import type http from "node:http";
import type net from "node:net";
import type { FastifyInstance, FastifyRequest } from "fastify";
import type { Logger } from "pino";
import type { Token } from "./auth.js";
import type { DaemonServices } from "./context.js";
import type { DaemonMetrics } from "./metrics.js";

/** One listener, as an extension sees it. */
export interface ListenerInfo {
  transport: "unix" | "tcp" | "inject";
  /** Served over TLS (then cookies are Secure). */
  tls: boolean;
  /** The bearer tokens of a TCP listener (empty elsewhere). */
  tokens: readonly Token[];
  /** Where snapshots live on the host (SnapshotInfo.dir). */
  snapshotsDir: string;
  /**
   * The Unix socket's CSRF token (socket-browser.ts): a browser's state-changing request through the socket
   * carries it; the console's page is given it. Empty on other transports.
   */
  socketCsrf: string;
}

/** What an extension's factory gets: the daemon's services and metrics, shared by every listener. */
export interface ExtensionContext {
  /**
   * The daemon's services, for the extension's own background work (the console's history and feed). Its routes
   * reach them as their callers' views (servicesOf, adminServicesOf in src/http/request-scope.ts).
   */
  services: DaemonServices;
  metrics: DaemonMetrics;
  /** Where snapshots live on the host (SnapshotInfo.dir). */
  snapshotsDir: string;
  logger?: Logger;
}

/** How an extension names a caller it identified by a console session (the API gives it an admin's principal). */
export const CONSOLE_SESSION_CALLER = "session:";

export interface ApiExtension {
  /** Registers the extension's routes on one listener's instance (called once per listener). */
  register(app: FastifyInstance, listener: ListenerInfo): Promise<void>;
  /**
   * Runs on every request after the listener's Host/Origin policy and before authentication; throws a
   * ForkdError to refuse the request.
   */
  screen?(request: FastifyRequest, listener: ListenerInfo): void;
  /**
   * The caller of a request on a token-guarded listener that brings no bearer token, or undefined (then the token
   * is required as usual). Throws a ForkdError to refuse the request outright.
   */
  identify?(request: FastifyRequest, listener: ListenerInfo): string | undefined;
  /**
   * Answers an HTTP upgrade on one of the extension's paths (after the listener's Host/Origin policy) and returns
   * true; false leaves it to the API.
   */
  upgrade?(req: http.IncomingMessage, socket: net.Socket, head: Buffer, listener: ListenerInfo): boolean;
  /** The daemon is stopping: end long-lived responses (streams, terminals) so the drain can finish. */
  close?(): Promise<void>;
}

export type ApiExtensionFactory = (context: ExtensionContext) => ApiExtension;
