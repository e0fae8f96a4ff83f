/**
 * Inbound traffic: HTTP requests and WebSocket upgrades proxied to a port inside a sandbox, through the
 * sandbox namespace's address (the namespace DNATs TCP from the bridge address to the guest). One function per
 * kind of request, so every front (the forkd route, `forkd port`, the E2B host/header routing) proxies the same
 * way. Uses http-proxy-3 (a maintained rewrite of http-proxy: streaming bodies both ways, WebSocket upgrades,
 * one shared keep-alive agent).
 */
import http from "node:http";
import type net from "node:net";
import { createProxyServer } from "http-proxy-3";
import { errorMessage } from "../common/errors.js";

export interface PortTarget {
  host: string;
  port: number;
}

/** A proxied request waits this long for the guest's response headers (long polls need minutes). */
export const PROXY_RESPONSE_TIMEOUT_MS = 10 * 60_000;

export class PortProxy {
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 256, maxFreeSockets: 32 });
  private readonly proxy = createProxyServer({
    ws: true,
    xfwd: false,
    proxyTimeout: PROXY_RESPONSE_TIMEOUT_MS,
  });

  /**
   * Proxies one HTTP request (its `url` is the path to request in the guest) to `target`. A target that refuses
   * or drops the connection answers 502 with forkd's error body.
   */
  web(req: http.IncomingMessage, res: http.ServerResponse, target: PortTarget): Promise<void> {
    return new Promise((resolve) => {
      res.once("close", () => resolve());
      this.proxy.web(req, res, { target: toUrl(target), agent: this.agent }, (err) => {
        if (!res.headersSent) {
          res.writeHead(502, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              error: `cannot reach port ${target.port} in the sandbox: ${errorMessage(err)}`,
              code: "unavailable",
            }),
          );
        } else res.destroy();
        resolve();
      });
    });
  }

  /** Proxies a WebSocket (or any HTTP/1.1 upgrade) on `socket` to `target`. */
  upgrade(req: http.IncomingMessage, socket: net.Socket, head: Buffer, target: PortTarget): void {
    socket.on("error", () => {});
    this.proxy.ws(req, socket, head, { target: toUrl(target) }, () => {
      if (socket.writable)
        socket.end("HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      socket.destroy();
    });
  }

  close(): void {
    this.agent.destroy();
    this.proxy.close();
  }
}

function toUrl(target: PortTarget): string {
  return `http://${target.host}:${target.port}`;
}
