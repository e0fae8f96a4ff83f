/**
 * Host-side Unix sockets that QEMU connects to (the agent channel, a migration stream): each takes exactly one
 * connection. Part of the vmm layer; imports only common/ and qemu-args.
 */
import type fs from "node:fs";
import fsp from "node:fs/promises";
import net from "node:net";
import { ForkdError, invalidArgument } from "../common/errors.js";
import { MAX_UNIX_SOCKET_PATH_BYTES } from "./qemu-args.js";

/** Who a host-side socket (or file) is handed to, so an unprivileged QEMU may connect to (or write) it. */
export interface FileOwner {
  uid: number;
  gid: number;
}

export interface OneConnectionListener {
  connection: Promise<net.Socket>;
  /** Stops listening (which unlinks the socket); a connection still awaited then rejects. */
  close(): void;
}

/**
 * Listens on `socketPath` for exactly one connection (QEMU's). Later connections are refused by closing the
 * listener as soon as the first arrives. `what` names the socket in errors ("agent socket"). With `owner` the
 * socket is handed to that uid (connecting needs write permission on it).
 */
export async function listenForOneConnection(
  socketPath: string,
  what: string,
  options: { owner?: FileOwner } = {},
): Promise<OneConnectionListener> {
  if (Buffer.byteLength(socketPath) > MAX_UNIX_SOCKET_PATH_BYTES) {
    throw invalidArgument(`${what} path ${JSON.stringify(socketPath)} is too long for a unix socket`);
  }
  await removeStaleSocket(socketPath);
  const server = net.createServer();
  let accept: (socket: net.Socket) => void = () => {};
  let refuse: (err: Error) => void = () => {};
  const connection = new Promise<net.Socket>((resolve, reject) => {
    accept = resolve;
    refuse = reject;
  });
  connection.catch(() => {});
  let accepted = false;
  server.on("connection", (socket) => {
    if (accepted) {
      socket.destroy();
      return;
    }
    accepted = true;
    server.close();
    accept(socket);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(socketPath, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch((err: NodeJS.ErrnoException) => {
    throw new ForkdError("unavailable", `cannot listen on ${what} ${socketPath}: ${err.code ?? err.message}`);
  });
  server.on("error", () => {});
  if (options.owner) {
    await fsp.lchown(socketPath, options.owner.uid, options.owner.gid).catch((err: NodeJS.ErrnoException) => {
      server.close();
      throw new ForkdError(
        "unavailable",
        `cannot hand ${what} ${socketPath} over: ${err.code ?? err.message}`,
      );
    });
  }
  return {
    connection,
    close: () => {
      // Closing the server also unlinks its socket file (libuv does for paths it bound).
      if (server.listening) server.close();
      if (!accepted)
        refuse(
          new ForkdError("unavailable", `${what} listener on ${socketPath} closed before QEMU connected`),
        );
    },
  };
}

/** Removes a socket left by a crashed run; refuses to delete anything that is not a socket. */
export async function removeStaleSocket(socketPath: string): Promise<void> {
  let stat: fs.Stats;
  try {
    stat = await fsp.lstat(socketPath);
  } catch {
    return;
  }
  if (!stat.isSocket()) {
    throw new ForkdError("conflict", `${socketPath} exists and is not a socket; refusing to replace it`);
  }
  await fsp.rm(socketPath, { force: true });
}
