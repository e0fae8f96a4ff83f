/**
 * A real `forkd daemon` for the SDK's end-to-end tests: its own FORKD_HOME (with the machine's shared warm
 * pyagent snapshot hard-linked in), a Unix socket, and a TCP listener with a bearer token. Started from the
 * same build the test runs from (src/ through tsx, or dist/), stopped with every sandbox killed and no QEMU left.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { newApiKey } from "../../src/common/tokens.js";
import { Controller } from "../../src/sdk/index.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

export interface TestDaemon {
  home: string;
  /** The snapshot every test spawns from (a warm pyagent). */
  tag: string;
  socketUrl: string;
  tcpUrl: string;
  token: string;
  /** A Controller on the Unix socket. */
  controller: Controller;
  /** The daemon's stderr so far (printed when a test fails). */
  log(): string;
  stop(): Promise<void>;
}

const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 40_000;

/**
 * `extraArgs` go to `forkd daemon` after the listener flags (e.g. --default-snapshot); `extraTokenLines` are
 * appended to its token file after the admin token (e.g. `<token> tenant=<name>`).
 */
export async function startDaemon(
  extraArgs: string[] = [],
  extraTokenLines: string[] = [],
): Promise<TestDaemon> {
  const home = await tempHome("forkd-sdk-e2e-");
  let daemon: ChildProcess | undefined;
  let stderr = "";
  try {
    const tag = await linkSharedSnapshot(home.home, "pyagent");
    const token = newApiKey();
    const tokenFile = path.join(home.home, "tokens");
    await writeFile(tokenFile, [token, ...extraTokenLines, ""].join("\n"), { mode: 0o600 });
    const socketPath = path.join(home.home, "forkd.sock");
    const port = await freePort();
    daemon = spawn(
      process.execPath,
      [
        ...cliEntry(),
        "daemon",
        "--socket",
        socketPath,
        "--bind",
        `127.0.0.1:${port}`,
        "--token-file",
        tokenFile,
        "--no-audit-log",
        "--log-level",
        "warn",
        ...extraArgs,
      ],
      { env: { ...process.env, FORKD_HOME: home.home }, stdio: ["ignore", "ignore", "pipe"] },
    );
    daemon.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const exited = new Promise<number | null>((resolve) => daemon?.once("exit", (code) => resolve(code)));
    const controller = new Controller({ url: `unix:${socketPath}`, env: {} });
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (!(await controller.isReachable())) {
      const code = await Promise.race([exited, new Promise((r) => setTimeout(r, 100, "running"))]);
      if (code !== "running") throw new Error(`forkd daemon exited (${code}) before answering:\n${stderr}`);
      if (Date.now() > deadline)
        throw new Error(`forkd daemon did not answer within ${START_TIMEOUT_MS} ms:\n${stderr}`);
    }
    const running = daemon;
    return {
      home: home.home,
      tag,
      socketUrl: `unix:${socketPath}`,
      tcpUrl: `http://127.0.0.1:${port}`,
      token,
      controller,
      log: () => stderr,
      stop: async () => {
        let killError: unknown;
        await controller.killSandboxes({ all: true }).catch((err: unknown) => {
          killError = err;
        });
        await stopProcess(running, exited);
        const left = await qemusMentioning(home.home);
        await home.cleanup();
        if (left.length > 0) throw new Error(`QEMU processes left running after the daemon stopped: ${left}`);
        if (killError !== undefined) throw killError;
      },
    };
  } catch (err) {
    if (daemon !== undefined && daemon.exitCode === null) daemon.kill("SIGKILL");
    await home.cleanup();
    throw err;
  }
}

/** The CLI entry of the build this test runs from: src/ through tsx in development, dist/ after `npm run build`. */
function cliEntry(): string[] {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith(".ts"))
    return ["--import", "tsx", path.resolve(path.dirname(here), "../../src/cli/main.ts")];
  return [path.resolve(path.dirname(here), "../../src/cli/main.js")];
}

async function stopProcess(child: ChildProcess, exited: Promise<number | null>): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
  try {
    await exited;
  } finally {
    clearTimeout(timer);
  }
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no TCP port");
  return address.port;
}
