/**
 * Where the daemon listens: its Unix socket (created 0660 in a 0755 directory, a stale socket from a crashed
 * daemon replaced, a live one never stolen) and an optional TCP address (loopback unless a token is configured).
 */
import { chmod, chown, lstat, mkdir, readFile, unlink } from "node:fs/promises";
import { createConnection, isIP } from "node:net";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import { ForkdError, invalidArgument } from "../common/errors.js";

export interface TcpAddress {
  host: string;
  port: number;
}

/** "127.0.0.1:8889", "[::1]:8889", "localhost:8889". */
export function parseBind(bind: string): TcpAddress {
  const match = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(bind.trim());
  const host = match?.[1] ?? match?.[2];
  const port = Number(match?.[3]);
  if (!match || !host || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw invalidArgument(`invalid --bind ${JSON.stringify(bind)}: expected host:port, e.g. 127.0.0.1:8889`);
  }
  if (match[1] !== undefined && isIP(host) !== 6)
    throw invalidArgument(`invalid IPv6 address in --bind ${bind}`);
  return { host, port };
}

export function isLoopbackHost(host: string): boolean {
  if (host === "localhost") return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  if (isIP(host) === 6) return host === "::1" || /^::ffff:127\./i.test(host);
  return false;
}

/**
 * Refuses a TCP listener without a credential, loopback included: every local user (and, by DNS rebinding, every
 * web page the host's browser opens) can reach a loopback port, and whoever reaches it runs code as root. The
 * Unix socket is the credential-free way in: its file permissions decide who may use it.
 */
export function checkBindPolicy(address: TcpAddress, hasToken: boolean): void {
  if (!hasToken) {
    const where = isLoopbackHost(address.host)
      ? "every local user and any web page in a local browser (by DNS rebinding)"
      : "anyone who can reach it";
    throw invalidArgument(
      `refusing to listen on ${address.host}:${address.port} without a token: ${where} could run code as root. ` +
        "Pass --token-file (or use the Unix socket, whose permissions guard it)",
    );
  }
}

/**
 * Makes `socketPath` free to bind: creates its directory (0755) and removes a socket left by a daemon that died.
 * Throws if another daemon is still answering there, or if the path is something other than a socket.
 */
export async function prepareSocketPath(socketPath: string): Promise<void> {
  // 0755 whatever the umask, so a group given access to the socket can reach it; an existing directory is left alone.
  if ((await mkdir(path.dirname(socketPath), { recursive: true })) !== undefined) {
    await chmod(path.dirname(socketPath), 0o755);
  }
  const existing = await lstat(socketPath).catch((err: NodeJS.ErrnoException) => {
    if (err.code === "ENOENT") return null;
    throw err;
  });
  if (!existing) return;
  if (!existing.isSocket()) {
    throw new ForkdError("conflict", `${socketPath} exists and is not a socket: refusing to replace it`);
  }
  if (await socketAnswers(socketPath)) {
    throw new ForkdError("conflict", `another forkd daemon is already listening on ${socketPath}`);
  }
  await unlink(socketPath);
}

function socketAnswers(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createConnection(socketPath);
    const done = (answers: boolean) => {
      probe.destroy();
      resolve(answers);
    };
    probe.once("connect", () => done(true));
    probe.once("error", () => done(false));
    probe.setTimeout(1000, () => done(false));
  });
}

/**
 * Listens on the Unix socket. The umask is tightened around bind() so the socket is never reachable with looser
 * permissions than 0660, not even between bind() and chmod().
 */
export async function listenUnix(app: FastifyInstance, socketPath: string, group?: string): Promise<void> {
  await prepareSocketPath(socketPath);
  const gid = group === undefined ? undefined : await resolveGroup(group);
  const previous = process.umask(0o117);
  try {
    await app.listen({ path: socketPath });
  } finally {
    process.umask(previous);
  }
  await chmod(socketPath, 0o660);
  if (gid !== undefined) await chown(socketPath, process.getuid?.() ?? 0, gid);
}

export async function listenTcp(app: FastifyInstance, address: TcpAddress): Promise<void> {
  await app.listen({ host: address.host, port: address.port });
}

/** A group name (from /etc/group) or a numeric gid. */
export async function resolveGroup(group: string): Promise<number> {
  if (/^\d+$/.test(group)) return Number(group);
  const text = await readFile("/etc/group", "utf8").catch(() => "");
  for (const line of text.split("\n")) {
    const [name, , gid] = line.split(":");
    if (name === group && gid !== undefined && /^\d+$/.test(gid)) return Number(gid);
  }
  throw invalidArgument(`unknown group ${JSON.stringify(group)} for --socket-group (not in /etc/group)`);
}
