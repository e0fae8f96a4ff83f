/**
 * One daemon per FORKD_HOME. Two daemons on one home would both adopt the same VMs, sweep each other's staging
 * directories and race on the database. The lock is a listening socket in Linux's abstract namespace, named after
 * the home: binding it is atomic, and the kernel releases it the moment its holder dies, even by SIGKILL, so a
 * crashed daemon never leaves a stale lock behind. (Abstract sockets belong to a network namespace: daemons in
 * different network namespaces sharing one home are not kept apart by it.)
 */
import { createHash } from "node:crypto";
import { createServer, type Server } from "node:net";
import path from "node:path";
import { ForkdError } from "./errors.js";

export interface HomeLock {
  release(): Promise<void>;
}

export async function lockHome(home: string): Promise<HomeLock> {
  const digest = createHash("sha256").update(path.resolve(home)).digest("hex").slice(0, 32);
  const server: Server = createServer((socket) => socket.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once("error", (err: NodeJS.ErrnoException) => {
      reject(
        err.code === "EADDRINUSE"
          ? new ForkdError("conflict", `another forkd daemon is already running on FORKD_HOME=${home}`)
          : err,
      );
    });
    server.listen({ path: `\0forkd-home-${digest}` }, () => resolve());
  });
  // The lock must not keep the process alive by itself.
  server.unref();
  let released: Promise<void> | undefined;
  return {
    release: () => {
      released ??= new Promise<void>((resolve) => server.close(() => resolve()));
      return released;
    },
  };
}
