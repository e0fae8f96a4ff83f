/**
 * The local cluster's stand-in for the gateway's Kubernetes Service: there is no kube-proxy here, so a TCP
 * balancer on loopback spreads connections over the gateway replicas round-robin and moves on to the next
 * replica when one refuses the connection (a replica being restarted). It is named for what it is: a stand-in
 * at a boundary this machine cannot have, never presented as a Service.
 */
import net from "node:net";

export interface Backend {
  host: string;
  port: number;
}

const CONNECT_TIMEOUT_MS = 2_000;

export function serveBalancer(backends: readonly Backend[]): net.Server {
  let next = 0;
  return net.createServer((client) => {
    client.on("error", () => {});
    client.pause();
    const start = next++ % backends.length;
    const attempt = (tried: number) => {
      if (tried >= backends.length) {
        client.destroy();
        return;
      }
      const backend = backends[(start + tried) % backends.length] as Backend;
      const upstream = net.connect({ host: backend.host, port: backend.port, timeout: CONNECT_TIMEOUT_MS });
      const fail = () => {
        upstream.destroy();
        attempt(tried + 1);
      };
      upstream.once("error", fail);
      upstream.once("timeout", fail);
      upstream.once("connect", () => {
        upstream.off("error", fail);
        upstream.off("timeout", fail);
        upstream.setTimeout(0);
        upstream.on("error", () => client.destroy());
        client.on("close", () => upstream.destroy());
        upstream.on("close", () => client.destroy());
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
    };
    attempt(0);
  });
}
