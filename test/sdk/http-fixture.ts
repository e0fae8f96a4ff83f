/**
 * A tiny real HTTP server for the SDK's unit tests (before/besides a real daemon): listens on a Unix socket
 * or on loopback TCP, records what it received and answers with whatever the test's handler writes.
 */
import { mkdtemp, rm } from "node:fs/promises";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import os from "node:os";
import path from "node:path";

export interface Received {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

export type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer) => unknown;

export interface TestServer {
  url: string;
  received: Received[];
  /** Sockets currently open to the server. */
  sockets: Set<Socket>;
  /** Connections accepted so far. */
  connections(): number;
  close(): Promise<void>;
}

/**
 * Starts a server; `where` = "unix" (socket in a temp dir) or "tcp" (127.0.0.1, random port). Request bodies
 * are read before the handler runs, except where `streamBody(req)` is true (the handler reads `req` itself).
 */
export async function startServer(
  where: "unix" | "tcp",
  handler: Handler,
  options: { streamBody?: (req: IncomingMessage) => boolean } = {},
): Promise<TestServer> {
  const received: Received[] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    if (!options.streamBody?.(req)) for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    received.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
    try {
      await handler(req, res, body);
    } catch (err) {
      if (!res.headersSent) res.writeHead(599);
      res.end(String(err));
    }
  });
  let connections = 0;
  server.on("connection", (socket) => {
    connections++;
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  let dir: string | undefined;
  let url: string;
  if (where === "unix") {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-sdk-test-"));
    const socketPath = path.join(dir, "forkd.sock");
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    url = `unix:${socketPath}`;
  } else {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }
  return {
    url,
    received,
    sockets,
    connections: () => connections,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      if (dir !== undefined) await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Answers JSON with a status. */
export function sendJson(
  res: ServerResponse,
  status: number,
  value: unknown,
  headers: Record<string, string> = {},
): void {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    ...headers,
  });
  res.end(body);
}
