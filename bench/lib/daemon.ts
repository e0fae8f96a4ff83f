/** A `forkd daemon` child process for benchmarks that go through the REST API (same build as the benchmark). */
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import os from "node:os";
import path from "node:path";
import { packageRoot } from "../../src/image/package-root.js";
import { Controller } from "../../src/sdk/index.js";

export interface BenchDaemon {
  url: string;
  /** The daemon's process id (for sampling its fds and memory). */
  pid: number;
  controller: Controller;
  stop(): Promise<void>;
}

/** `extraArgs` go to `forkd daemon` as well (e.g. a TCP listener: --bind, --token-file). */
export async function startBenchDaemon(
  home: string,
  socketPath: string,
  extraArgs: string[] = [],
): Promise<BenchDaemon> {
  const child: ChildProcess = spawn(
    process.execPath,
    [
      path.join(packageRoot(), "bin", "forkd.js"),
      "daemon",
      "--socket",
      socketPath,
      "--no-audit-log",
      "--log-level",
      "warn",
      "--max-concurrent-spawns",
      "8",
      ...extraArgs,
    ],
    { env: { ...process.env, FORKD_HOME: home }, stdio: ["ignore", "ignore", "inherit"] },
  );
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const url = `unix:${socketPath}`;
  const controller = new Controller({ url, env: {}, requestTimeoutMs: 600_000 });
  const deadline = Date.now() + 60_000;
  while (!(await controller.isReachable())) {
    if (child.exitCode !== null) throw new Error(`forkd daemon exited with ${child.exitCode}`);
    if (Date.now() > deadline) throw new Error("forkd daemon did not answer within 60 s");
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    pid: child.pid as number,
    controller,
    stop: async () => {
      await controller.killSandboxes({ all: true }).catch(() => {});
      child.kill("SIGTERM");
      await exited;
    },
  };
}

export interface TcpBenchDaemon {
  daemon: BenchDaemon;
  url: string;
  token: string;
  stop(): Promise<void>;
}

/**
 * A daemon on a TCP listener with a bearer token, spawning `defaultSnapshot` for E2B callers; E2B's SDKs in
 * this process are pointed at it (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY).
 */
export async function startTcpBenchDaemon(home: string, defaultSnapshot: string): Promise<TcpBenchDaemon> {
  const label = `forkd-bench-${process.pid}-${randomBytes(4).toString("hex")}`;
  const socketPath = path.join(os.tmpdir(), `${label}.sock`);
  const tokenFile = path.join(os.tmpdir(), `${label}.tokens`);
  const token = randomBytes(24).toString("hex");
  await writeFile(tokenFile, `${token}\n`, { mode: 0o600 });
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  process.env.E2B_API_URL = url;
  process.env.E2B_SANDBOX_URL = url;
  process.env.E2B_API_KEY = token;
  const daemon = await startBenchDaemon(home, socketPath, [
    "--bind",
    `127.0.0.1:${port}`,
    "--token-file",
    tokenFile,
    "--default-snapshot",
    defaultSnapshot,
  ]).catch(async (err: unknown) => {
    await rm(tokenFile, { force: true });
    throw err;
  });
  return {
    daemon,
    url,
    token,
    stop: async () => {
      await daemon.stop();
      await rm(tokenFile, { force: true });
    },
  };
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no TCP port");
  return address.port;
}
