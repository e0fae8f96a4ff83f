/**
 * Calls for one sandbox go to its node as they came: HTTP requests and upgrades (WebSockets, envd's streams,
 * the port proxy) relayed byte for byte by http-proxy-3 (streaming both ways), with the cluster credential, the
 * node's epoch and the caller's tenant added and the caller's gateway token removed (it never reaches a node or
 * a guest). The request's path and Host go on unchanged: the node routes E2B's `<port>-<id>.<domain>` host
 * names as a single daemon does. Every call in flight is tracked by node: when the gateway sees a node lost,
 * its calls are cut at once instead of waiting on a dead link.
 *
 * Each relayed answer carries a Server-Timing header saying where its time went before the node's answer began:
 * `gateway` (from the request's arrival to its relay: authentication, locating the sandbox) and `node` (from the
 * relay to the node's answer headers). bench/cluster reads it to tell the gateway's share from the node's.
 */
import http from "node:http";
import type net from "node:net";
import { createProxyServer } from "http-proxy-3";
import { CLUSTER_HEADERS } from "../cluster/protocol.js";
import { errorMessage } from "../common/errors.js";
import { stripDaemonTokens, type Token } from "../common/tokens.js";

export interface ProxyTarget {
  node: string;
  url: string;
  epoch: number;
  nodeToken: string;
  /** null: an admin's call (or the data plane, which the node authenticates by the sandbox's own tokens). */
  tenant: string | null;
}

export class NodeProxy {
  private readonly proxy = createProxyServer({ xfwd: false, ws: true });
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  private readonly inFlight = new Map<string, Set<{ destroy(err?: Error): void }>>();
  /** When each request in relay arrived at the gateway and was sent on (performance.now()). */
  private readonly timings = new WeakMap<http.IncomingMessage, { arrived: number; sent: number }>();

  constructor(
    /** The gateway's own tokens: removed from every relayed request. */
    private readonly userTokens: readonly Token[],
    onError: (err: Error) => void = () => {},
  ) {
    // A caller socket's error is re-emitted on the proxy; with no listener it would end the gateway.
    this.proxy.on("error", (err: Error) => onError(err));
    this.proxy.on("proxyRes", (proxyRes: http.IncomingMessage, req: http.IncomingMessage) => {
      const timing = this.timings.get(req);
      if (!timing) return;
      const ours = serverTiming(timing.sent - timing.arrived, performance.now() - timing.sent);
      // A guest's own Server-Timing (a sandbox's web server, through the data plane) stays, after the gateway's.
      const theirs = proxyRes.headers["server-timing"];
      proxyRes.headers["server-timing"] = theirs ? `${ours}, ${theirs}` : ours;
    });
  }

  /**
   * Relays one request. Resolves with null once the response is done, or with why the node could not be reached
   * while nothing was written yet (the caller answers in its API's shape).
   */
  web(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    target: ProxyTarget,
    arrived = performance.now(),
  ): Promise<string | null> {
    this.prepare(req);
    this.timings.set(req, { arrived, sent: performance.now() });
    const untrack = this.track(target.node, res);
    return new Promise((resolve) => {
      res.once("close", () => {
        untrack();
        resolve(null);
      });
      this.proxy.web(req, res, this.options(target), (err) => {
        untrack();
        if (res.headersSent) {
          res.destroy();
          resolve(null);
        } else resolve(`node ${target.node} did not answer: ${errorMessage(err)}`);
      });
    });
  }

  /** Relays an HTTP upgrade (a WebSocket to a sandbox's port or terminal). */
  upgrade(req: http.IncomingMessage, socket: net.Socket, head: Buffer, target: ProxyTarget): void {
    socket.on("error", () => {});
    this.prepare(req);
    const untrack = this.track(target.node, socket);
    socket.once("close", untrack);
    this.proxy.ws(req, socket, head, this.options(target), () => {
      if (socket.writable) {
        socket.end("HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      }
      socket.destroy();
    });
  }

  /** Cuts every call in flight to `node` (it was lost). */
  cut(node: string): number {
    const open = this.inFlight.get(node);
    if (!open) return 0;
    this.inFlight.delete(node);
    for (const call of open) call.destroy(new Error(`node ${node} was lost`));
    return open.size;
  }

  close(): void {
    for (const node of [...this.inFlight.keys()]) this.cut(node);
    this.agent.destroy();
    this.proxy.close();
  }

  private prepare(req: http.IncomingMessage): void {
    for (const name of Object.values(CLUSTER_HEADERS)) delete req.headers[name];
    stripDaemonTokens(req.headers, this.userTokens);
  }

  private options(target: ProxyTarget) {
    const headers: Record<string, string> = {
      [CLUSTER_HEADERS.token]: target.nodeToken,
      [CLUSTER_HEADERS.epoch]: String(target.epoch),
    };
    if (target.tenant !== null) headers[CLUSTER_HEADERS.tenant] = target.tenant;
    return {
      target: target.url,
      // The path goes on as the caller spelled it (no URL normalisation), the Host too.
      toProxy: true,
      changeOrigin: false,
      headers,
      agent: this.agent,
    };
  }

  private track(node: string, call: { destroy(err?: Error): void }): () => void {
    const open = this.inFlight.get(node) ?? new Set();
    this.inFlight.set(node, open);
    open.add(call);
    return () => {
      open.delete(call);
      if (open.size === 0 && this.inFlight.get(node) === open) this.inFlight.delete(node);
    };
  }
}

/** A Server-Timing value: the gateway's own time and the time waiting on the node, in ms. */
export function serverTiming(gatewayMs: number, nodeMs: number): string {
  return `gateway;dur=${gatewayMs.toFixed(2)}, node;dur=${nodeMs.toFixed(2)}`;
}
