/**
 * Runs the real guest agent (the static Go binary) as a child process speaking the protocol on stdin/stdout
 * (--stdio), with dry-run fix-ups, so host tests exercise the same program a guest runs.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Duplex } from "node:stream";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { AgentClient, type AgentClientOptions } from "../../src/agent/host/client.js";

/** The repository root, found from this file both under test/ (tsx) and dist/test/ (compiled). */
export function repoRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = path.join(dir, "package.json");
    if (existsSync(manifest) && JSON.parse(readFileSync(manifest, "utf8")).name === "forkd") return dir;
    const parent = path.dirname(dir);
    if (parent === dir) throw new Error("cannot find the forkd repository root");
    dir = parent;
  }
}

/** Builds the current sources into a fresh temp dir (as `npm run build` does into dist/guest). */
export async function buildAgent(): Promise<string> {
  const out = await mkdtemp(path.join(os.tmpdir(), "forkd-agent-build-"));
  try {
    await promisify(execFile)(process.execPath, [
      path.join(repoRoot(), "scripts/build-guest.mjs"),
      "--out",
      path.join(out, "guest"),
    ]);
  } catch (err) {
    await rm(out, { recursive: true, force: true });
    throw err;
  }
  return path.join(out, "guest");
}

export interface RunningAgent {
  child: ChildProcess;
  client: AgentClient;
  stderr: () => string;
  stop(): Promise<void>;
}

/** The agent binary inside a directory made by buildAgent (or dist/guest). */
export const agentBinary = (guestDir: string) => path.join(guestDir, "forkd-agent");

export async function startAgent(
  guestDir: string,
  template: { name: string; interpreter: "python" | "none" } = { name: "test", interpreter: "python" },
  clientOptions: AgentClientOptions = {},
  extraArgs: string[] = [],
): Promise<RunningAgent> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-agent-run-"));
  const templatePath = path.join(dir, "template.json");
  await writeFile(templatePath, JSON.stringify(template));
  const child = spawn(agentBinary(guestDir), ["--stdio", "--template", templatePath, ...extraArgs], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr = (stderr + chunk.toString()).slice(-64 * 1024);
  });
  const socket = Duplex.from({ readable: child.stdout, writable: child.stdin });
  const client = new AgentClient(socket, clientOptions);
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    child,
    client,
    stderr: () => stderr,
    async stop() {
      client.close();
      child.stdin?.destroy();
      const timer = setTimeout(() => child.kill("SIGKILL"), 3000);
      await exited;
      clearTimeout(timer);
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Pids of processes whose command line contains `marker`. */
export async function processesMatching(marker: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = (await readFile(`/proc/${entry}/cmdline`)).toString().replaceAll("\0", " ");
      if (cmdline.includes(marker)) found.push(Number(entry));
    } catch {
      // Gone already.
    }
  }
  return found;
}
