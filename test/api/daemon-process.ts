/**
 * A real `forkd daemon` process over a test FORKD_HOME, for the end-to-end tests: started from the build the test
 * runs from (src/ through tsx, or dist/), reachable on a Unix socket, stoppable with SIGTERM or SIGKILL.
 */
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { send, type Target } from "./raw-http.js";

export interface DaemonProcess {
  socket: Target;
  socketPath: string;
  child: ChildProcess;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  log(): string;
  /** SIGTERM and wait (SIGKILL after `graceMs`). */
  stop(graceMs?: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** SIGKILL and wait: a crash. */
  crash(): Promise<void>;
}

const START_TIMEOUT_MS = 90_000;

export function cliEntry(): string[] {
  const here = fileURLToPath(import.meta.url);
  const main = path.resolve(path.dirname(here), "..", "..", "src", "cli", `main${path.extname(here)}`);
  return [...process.execArgv, main];
}

export async function startDaemonProcess(
  home: string,
  extraArgs: string[] = [],
  options: {
    env?: NodeJS.ProcessEnv /** Start it under this umask (as a service manager's UMask= would). */;
    umask?: number;
  } = {},
): Promise<DaemonProcess> {
  const socketPath = path.join(home, "daemon", "forkd.sock");
  const umask =
    options.umask === undefined
      ? []
      : ["/bin/sh", "-c", `umask ${options.umask.toString(8).padStart(4, "0")}; exec "$@"`, "sh"];
  const child = spawn(
    umask.length > 0 ? (umask[0] as string) : process.execPath,
    [
      ...umask.slice(1),
      ...(umask.length > 0 ? [process.execPath] : []),
      ...cliEntry(),
      "daemon",
      "--socket",
      socketPath,
      "--audit-log",
      path.join(home, "daemon", "audit.log"),
      "--log-level",
      "warn",
      ...extraArgs,
    ],
    { env: { ...process.env, FORKD_HOME: home, ...options.env }, stdio: ["ignore", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const socket: Target = { socketPath };
  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`forkd daemon exited before answering:\n${stderr}`);
    }
    const ok = await send(socket, "GET", "/healthz").then(
      (r) => r.status === 200,
      () => false,
    );
    if (ok) break;
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`forkd daemon did not answer within ${START_TIMEOUT_MS} ms:\n${stderr}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    socket,
    socketPath,
    child,
    exited,
    log: () => stderr,
    stop: async (graceMs = 45_000) => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      try {
        return await exited;
      } finally {
        clearTimeout(timer);
      }
    },
    crash: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
    },
  };
}
