/**
 * `forkd port <id> <port>`: exposes TCP port <port> of a sandbox on a local address: every HTTP request and
 * WebSocket upgrade to it goes through the daemon's port proxy (/v1/sandboxes/<id>/ports/<port>/...). Runs until
 * Ctrl-C. Anyone who can connect to the local address reaches the sandbox's port: the default is loopback.
 */
import http from "node:http";
import type net from "node:net";
import type { Command } from "commander";
import { createProxyServer } from "http-proxy-3";
import { invalidArgument } from "../../common/errors.js";
import { PORT_PROXY_HEADER } from "../../console/protocol.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "./fork.js";

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
      // sandbox's own origin.
      const headers: Record<string, string> = { [PORT_PROXY_HEADER]: "1", ...endpoint.headers };
      const proxy = createProxyServer({ target, headers, ws: true });
      const prefix = endpoint.pathPrefix;
      const server = http.createServer((req, res) => {
        req.url = `${prefix}${req.url ?? "/"}`;
        proxy.web(req, res, {}, () => {
          if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
          res.end("forkd port: the daemon did not answer\n");
        });
      });
      server.on("upgrade", (req, socket: net.Socket, head) => {
        req.url = `${prefix}${req.url ?? "/"}`;
        socket.on("error", () => {});
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

function parseListen(text: string): { host: string; port: number } {
  const match = /^(\[[0-9a-fA-F:]+\]|[^:]+):(\d{1,5})$/.exec(text);
  const port = Number(match?.[2]);
  if (!match || port > 65535)
    throw invalidArgument(`--listen must be host:port, got ${JSON.stringify(text)}`);
  return { host: (match[1] as string).replace(/^\[|\]$/g, ""), port };
}
