/**
 * `forkd port <id> <port>`: exposes TCP port <port> of a sandbox on a local address: every HTTP request and
 * WebSocket upgrade to it goes through the daemon's port proxy (/v1/sandboxes/<id>/ports/<port>/...). Runs until
 * Ctrl-C. Anyone who can connect to the local address reaches the sandbox's port (and only it): the default is
 * loopback. The listener sends the operator's credential with every request, so a request path that could climb
 * out of the port route (dot segments, encoded or not; encoded slashes; backslashes) is refused here, and paths
 * are passed on exactly as received (src/common/proxied-path.ts); the daemon itself serves nothing but the port
 * route to what this listener sends.
 */
import http from "node:http";
import type net from "node:net";
import type { Command } from "commander";
import { createProxyServer } from "http-proxy-3";
import { errorMessage, invalidArgument } from "../../common/errors.js";
import { PORT_PROXY_HEADER, unsafeProxiedPath } from "../../common/proxied-path.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";

export function registerPort(program: Command): void {
  addDaemonOptions(
    program
      .command("port")
      .description(
        "expose a TCP port of a sandbox on a local address, through the daemon's port proxy (HTTP, WebSocket)",
      )
      .argument("<id>", "sandbox id")
      .argument("<port>", "port inside the sandbox", parseIntOption("<port>", 1, 65535))
      .option("--listen <host:port>", "local address to listen on (port 0 = any free one)", "127.0.0.1:0"),
  ).action((id: string, port: number, opts: { listen: string }, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      // Fails early (unknown sandbox, no network) instead of on the first proxied request.
      await controller.getSandbox(id, { signal });
      const { host, port: localPort } = parseListen(opts.listen);
      const endpoint = controller.portEndpoint(id, port);
      const { address } = endpoint;
      const target =
        address.kind === "unix"
          ? { host: "localhost", port: 80, socketPath: address.socketPath }
          : { host: address.hostname, port: address.port, protocol: address.protocol };
      // The mark lets a browser's requests through the socket (src/console/access.ts): this listener is the
      // sandbox's own origin. It also tells the daemon to serve nothing but the port route to them.
      const headers: Record<string, string> = { [PORT_PROXY_HEADER]: "1", ...endpoint.headers };
      // Over TCP the daemon answers only its own names (src/api/origin-policy.ts): the request names the daemon,
      // and the browser's Host goes on as X-Forwarded-Host.
      if (address.kind === "tcp") headers.host = address.host;
      // toProxy: http-proxy-3 passes req.url on as it is instead of normalising it through a URL parser.
      const proxy = createProxyServer({ target, headers, ws: true, toProxy: true });
      // One failed connection (a browser gone mid-response) must not end the listener.
      proxy.on("error", (err) => process.stderr.write(`forkd port: ${errorMessage(err)}\n`));
      const prefix = endpoint.pathPrefix;
      const prepare = (req: http.IncomingMessage): string | null => {
        const refused = unsafeProxiedPath(req.url ?? "");
        if (refused !== null) return refused;
        req.url = `${prefix}${req.url}`;
        if (address.kind === "tcp") forwardedForTcp(req);
        return null;
      };
      const server = http.createServer((req, res) => {
        const refused = prepare(req);
        if (refused !== null) {
          res.writeHead(400, { "content-type": "text/plain" });
          res.end(`forkd port: refused: ${refused}\n`);
          return;
        }
        proxy.web(req, res, {}, () => {
          if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
          res.end("forkd port: the daemon did not answer\n");
        });
      });
      server.on("upgrade", (req, socket: net.Socket, head) => {
        socket.on("error", () => {});
        const refused = prepare(req);
        if (refused !== null) {
          socket.end(
            `HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nforkd port: refused: ${refused}\n`,
          );
          return;
        }
        proxy.ws(req, socket, head, {}, () => socket.destroy());
      });
      await new Promise<void>((resolve, reject) => {
        server.once("error", reject);
        server.listen(localPort, host, () => resolve());
      });
      const bound = server.address() as net.AddressInfo;
      process.stdout.write(
        `http://${host.includes(":") ? `[${host}]` : host}:${bound.port} -> sandbox ${id} port ${port} (Ctrl-C to stop)\n`,
      );
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
      server.close();
      proxy.close();
      return undefined;
    }),
  );
}

/**
 * Over TCP the request's Host becomes the daemon's (set with the proxy's headers); the browser's goes on as
 * X-Forwarded-Host, and its Origin, which is this listener's own and which the daemon would refuse as
 * cross-origin, is dropped: the request comes from this proxy, with the operator's credential.
 */
function forwardedForTcp(req: http.IncomingMessage): void {
  const host = req.headers.host;
  if (host !== undefined) {
    req.headers["x-forwarded-host"] = host;
    if (req.headers.origin === `http://${host}`) delete req.headers.origin;
  } else delete req.headers["x-forwarded-host"];
  req.headers["x-forwarded-proto"] = "http";
}

function parseListen(text: string): { host: string; port: number } {
  const match = /^(\[[0-9a-fA-F:]+\]|[^:]+):(\d{1,5})$/.exec(text);
  const port = Number(match?.[2]);
  if (!match || port > 65535)
    throw invalidArgument(`--listen must be host:port, got ${JSON.stringify(text)}`);
  return { host: (match[1] as string).replace(/^\[|\]$/g, ""), port };
}
