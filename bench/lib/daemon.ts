/** A `forkd daemon` child process for benchmarks that go through the REST API (same build as the benchmark). */
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { packageRoot } from "../../src/image/package-root.js";
import { Controller } from "../../src/sdk/index.js";

export interface BenchDaemon {
  url: string;
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
    controller,
    stop: async () => {
      await controller.killSandboxes({ all: true }).catch(() => {});
      child.kill("SIGTERM");
      await exited;
    },
  };
}
