/**
 * Inbound traffic: HTTP requests and WebSocket upgrades proxied to a port inside a sandbox, through the
 * sandbox namespace's address (the namespace DNATs TCP from the bridge address to the guest). One function per
 * kind of request, so every front (the forkd route, `forkd port`, the E2B host/header routing) proxies the same
 * way. Uses http-proxy-3 (a maintained rewrite of http-proxy: streaming bodies both ways, WebSocket upgrades,
 * one shared keep-alive agent).
 */
import http from "node:http";
import https from "node:https";
import type net from "node:net";
import { createProxyServer } from "http-proxy-3";
import { errorMessage } from "../common/errors.js";

export interface PortTarget {
  host: string;
  port: number;
  /** The server on the port speaks HTTPS (its certificate is not checked: it is the guest's own). */
  tls?: boolean;
  /** Send this Host header instead of the request's own. */
  hostHeader?: string | null;
  /** Whose port it is (a sandbox id): `closeTunnels(owner)` ends its WebSocket tunnels. */
  owner?: string;
}

/** A proxied request waits this long for the guest's response headers (long polls need minutes). */
export const PROXY_RESPONSE_TIMEOUT_MS = 10 * 60_000;

const AGENT_OPTIONS = { keepAlive: true, maxSockets: 256, maxFreeSockets: 32 };

/**
 * After the caller's side of a tunnel closes, the guest's side gets this long to finish its close before it is
 * destroyed: http-proxy-3 only ends it, and a guest that never answers (its sandbox gone with its namespace)
 * would keep it half-open, retransmitting, for many minutes.
 */
export const TUNNEL_CLOSE_GRACE_MS = 5_000;

/** Told about each proxied connection that failed (it is ended; the proxy goes on serving every other one). */
export type ProxyErrorListener = (err: Error, target: PortTarget | undefined) => void;

/** A WebSocket tunnel: the caller's socket and the socket to the guest, once the guest accepted. */
interface Tunnel {
  client: net.Socket;
  guest?: net.Socket;
}

export class PortProxy {
  private readonly agent = new http.Agent(AGENT_OPTIONS);
  private readonly tlsAgent = new https.Agent({ ...AGENT_OPTIONS, rejectUnauthorized: false });
  private readonly proxy = createProxyServer({
    ws: true,
    xfwd: false,
    proxyTimeout: PROXY_RESPONSE_TIMEOUT_MS,
  });
  /** Open tunnels by owner ("" for a target without one). */
  private readonly tunnels = new Map<string, Set<Tunnel>>();
  private readonly tunnelOf = new WeakMap<net.Socket, Tunnel>();
  private readonly targetOf = new WeakMap<object, PortTarget>();

  /**
   * `onError` hears of every proxied connection that failed. http-proxy-3 re-emits a caller socket's errors
   * (a write to a caller that has gone, while a guest streams a non-101 answer to an upgrade) on the proxy, and
   * throws them when nothing listens: that would end the daemon.
   */
  constructor(onError: ProxyErrorListener = () => {}) {
    this.proxy.on("error", (err: Error, req: object) => onError(err, this.targetOf.get(req)));
    this.proxy.on("proxyReqWs", (proxyReq: http.ClientRequest, _req: unknown, client: net.Socket) => {
      // A guest that answers the upgrade with a plain response streams it to the caller: once the caller is
      // gone, stop reading it (the guest could stream for ever).
      client.once("close", () => {
        if (!this.tunnelOf.get(client)?.guest) proxyReq.destroy();
      });
      proxyReq.once("upgrade", (_res: unknown, guest: net.Socket) => {
        const tunnel = this.tunnelOf.get(client);
        if (!tunnel || client.destroyed) {
          guest.destroy();
          return;
        }
        tunnel.guest = guest;
      });
    });
  }

  /**
   * Proxies one HTTP request (its `url` is the path to request in the guest) to `target`. Resolves with null
   * once the response is done, or with why the target could not be reached when nothing has been written yet
   * (the caller answers, in its own API's error shape); a failure after the response started ends it.
   */
  web(req: http.IncomingMessage, res: http.ServerResponse, target: PortTarget): Promise<string | null> {
    this.targetOf.set(req, target);
    return new Promise((resolve) => {
      res.once("close", () => resolve(null));
      this.proxy.web(
        req,
        res,
        { ...this.options(target), agent: target.tls ? this.tlsAgent : this.agent },
        (err) => {
          if (res.headersSent) {
            res.destroy();
            resolve(null);
          } else resolve(`cannot reach port ${target.port} in the sandbox: ${errorMessage(err)}`);
        },
      );
    });
  }

  /** Proxies a WebSocket (or any HTTP/1.1 upgrade) on `socket` to `target`. */
  upgrade(req: http.IncomingMessage, socket: net.Socket, head: Buffer, target: PortTarget): void {
    // Errors of the caller's socket reach onError through the proxy (see the constructor).
    socket.on("error", () => {});
    this.targetOf.set(req, target);
    this.track(target.owner ?? "", socket);
    this.proxy.ws(req, socket, head, this.options(target), () => {
      if (socket.writable)
        socket.end("HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      socket.destroy();
    });
  }

  /** Ends every WebSocket tunnel to `owner`'s ports at once (its sandbox is gone). */
  closeTunnels(owner: string): void {
    for (const tunnel of this.tunnels.get(owner) ?? []) {
      tunnel.guest?.destroy();
      tunnel.client.destroy();
    }
    this.tunnels.delete(owner);
  }

  close(): void {
    for (const owner of [...this.tunnels.keys()]) this.closeTunnels(owner);
    this.agent.destroy();
    this.tlsAgent.destroy();
    this.proxy.close();
  }

  private track(owner: string, client: net.Socket): void {
    const tunnel: Tunnel = { client };
    this.tunnelOf.set(client, tunnel);
    const open = this.tunnels.get(owner) ?? new Set<Tunnel>();
    this.tunnels.set(owner, open);
    open.add(tunnel);
    client.once("close", () => {
      open.delete(tunnel);
      if (open.size === 0 && this.tunnels.get(owner) === open) this.tunnels.delete(owner);
      const guest = tunnel.guest;
      if (guest && !guest.destroyed) setTimeout(() => guest.destroy(), TUNNEL_CLOSE_GRACE_MS).unref();
    });
  }

  private options(target: PortTarget) {
    return {
      target: `${target.tls ? "https" : "http"}://${target.host}:${target.port}`,
      // The path goes to the guest as the request spelled it: http-proxy-3 would otherwise put it through a URL
      // parser, which resolves dot segments (encoded ones too) and turns backslashes into slashes.
      toProxy: true,
      secure: false,
      ...(target.hostHeader ? { headers: { host: target.hostHeader } } : {}),
    };
  }
}
