/**
 * Runs the Debian tools the image build is made of. Every tool gets its own process group so that
 * cancelling a build also stops the grandchildren (apt, dpkg, gpg under mmdebstrap), and nothing is
 * left writing into a directory we are about to remove.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { abortError } from "../common/deadline.js";
import { ForkdError } from "../common/errors.js";

/** Debian package that provides each tool, for the "not installed" message. */
const TOOL_PACKAGES: Record<string, string> = {
  "apt-cache": "apt",
  "apt-get": "apt",
  "dpkg-deb": "dpkg",
  mmdebstrap: "mmdebstrap",
  unshare: "util-linux",
  nsenter: "util-linux",
  ip: "iproute2",
  nft: "nftables",
  cpio: "cpio",
  depmod: "kmod",
  modprobe: "kmod",
  modinfo: "kmod",
  "mkfs.ext4": "e2fsprogs",
  e2fsck: "e2fsprogs",
  debugfs: "e2fsprogs",
  mknod: "coreutils",
  du: "coreutils",
  skopeo: "skopeo",
  umoci: "umoci",
  buildah: "buildah",
  bwrap: "bubblewrap",
};

const KILL_GRACE_MS = 5_000;
const DEFAULT_TAIL_BYTES = 4_096;
/** A line longer than this is handed out cut to its end. */
const MAX_LINE_BYTES = 16_384;

export interface RunOptions {
  cwd?: string;
  signal?: AbortSignal;
  env?: NodeJS.ProcessEnv;
  /** Bytes written to the tool's stdin (stdin is /dev/null otherwise). */
  input?: string | Buffer;
  /**
   * Where stdout goes: collected (bounded by maxStdoutBytes), discarded, or handed out line by line like stderr
   * ("lines": both streams then go to `onStderrLine` and into the tail a failure reports, in arrival order).
   */
  stdout?: "collect" | "ignore" | "lines";
  maxStdoutBytes?: number;
  /** Called with every complete stderr line, e.g. to forward a tool's own progress messages. */
  onStderrLine?: (line: string) => void;
  /** How errors name the command (default: the command and its first arguments). */
  label?: string;
  /** Bytes of output a failure's message ends with (default 4 KiB; 0: none). */
  tailBytes?: number;
  /** Run as this uid and gid, with no supplementary groups (and so no capabilities). */
  credentials?: { uid: number; gid: number };
  /** The tool's fds from 3 on: an open fd of ours to hand it, or "pipe" (child.stdio[3 + i]). */
  extraFds?: readonly (number | "pipe")[];
  /** Called once the tool is spawned, before any of its output (e.g. to talk over its extra pipes). */
  onSpawn?: (child: ChildProcess) => void;
}

export interface RunResult {
  stdout: Buffer;
  stderr: string;
}

/** Runs `command` with an argv array (never a shell) and resolves when it exits 0. */
export function run(command: string, args: string[], options: RunOptions = {}): Promise<RunResult> {
  const what = options.label ?? `${command} ${args.slice(0, 3).join(" ")}`.trim();
  if (options.signal?.aborted) return Promise.reject(abortError(options.signal, what));
  const maxStdout = options.maxStdoutBytes ?? 16 * 1024 * 1024;

  return new Promise((resolve, reject) => {
    const child = spawn(command, args, {
      cwd: options.cwd,
      env: options.env ?? process.env,
      detached: true,
      stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe", ...(options.extraFds ?? [])],
      ...(options.credentials ? { uid: options.credentials.uid, gid: options.credentials.gid } : {}),
    });
    options.onSpawn?.(child);
    let killTimer: NodeJS.Timeout | undefined;
    let aborted = false;
    const onAbort = () => {
      aborted = true;
      killGroup(child, "SIGTERM");
      killTimer = setTimeout(() => killGroup(child, "SIGKILL"), KILL_GRACE_MS);
    };
    options.signal?.addEventListener("abort", onAbort, { once: true });
    const output = collectOutput(child, options, maxStdout);
    if (options.input !== undefined && child.stdin) {
      child.stdin.on("error", () => {
        // the tool exited before reading all input; its exit status tells the story
      });
      child.stdin.end(options.input);
    }

    child.on("error", (err: NodeJS.ErrnoException) => {
      options.signal?.removeEventListener("abort", onAbort);
      reject(spawnFailure(command, err));
    });
    child.on("close", (code, sig) => {
      options.signal?.removeEventListener("abort", onAbort);
      if (killTimer) clearTimeout(killTimer);
      // Sweep anything the tool left behind in its group (it is dead, so nobody needs them).
      killGroup(child, "SIGKILL");
      if (aborted && options.signal) return reject(abortError(options.signal, what));
      if (output.stdoutOverflow) {
        return reject(new ForkdError("internal", `${what}: output larger than ${maxStdout} bytes`));
      }
      if (code !== 0) {
        const status = code === null ? `killed by ${sig}` : `exit status ${code}`;
        const tail = output.tail.trim();
        return reject(
          new ForkdError("internal", `${what} failed (${status})${tail ? `:\n${tail}` : ""}`, {
            detail: { command, args, code, signal: sig },
          }),
        );
      }
      resolve({ stdout: Buffer.concat(output.stdoutChunks), stderr: output.tail });
    });
  });
}

/** Signals the tool's whole process group (it was spawned detached: its pid is the group's). */
function killGroup(child: ChildProcess, sig: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, sig);
  } catch {
    // the group is already gone
  }
}

/** What a tool wrote: stdout collected (bounded), and the tail of its output a failure reports. */
interface ToolOutput {
  stdoutChunks: Buffer[];
  stdoutOverflow: boolean;
  tail: string;
}

/** Collects the tool's output as `options` asks, handing out lines; kills the tool when stdout overflows. */
function collectOutput(child: ChildProcess, options: RunOptions, maxStdout: number): ToolOutput {
  const output: ToolOutput = { stdoutChunks: [], stdoutOverflow: false, tail: "" };
  let stdoutBytes = 0;
  const tailBytes = options.tailBytes ?? DEFAULT_TAIL_BYTES;
  const partial = { stdout: "", stderr: "" };
  const onText = (stream: "stdout" | "stderr", chunk: string) => {
    output.tail = tailBytes > 0 ? (output.tail + chunk).slice(-tailBytes) : "";
    if (!options.onStderrLine) return;
    const lines = (partial[stream] + chunk).split("\n");
    partial[stream] = (lines.pop() ?? "").slice(-MAX_LINE_BYTES);
    for (const line of lines) if (line.trim() !== "") options.onStderrLine(line);
  };
  child.stdout?.on("data", (chunk: Buffer) => {
    if (options.stdout === "ignore") return;
    if (options.stdout === "lines") return onText("stdout", chunk.toString("utf8"));
    stdoutBytes += chunk.length;
    if (stdoutBytes > maxStdout) {
      output.stdoutOverflow = true;
      killGroup(child, "SIGKILL");
      return;
    }
    output.stdoutChunks.push(chunk);
  });
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => onText("stderr", chunk));
  return output;
}

/** A tool that could not be started: not installed (naming its Debian package), or another reason. */
function spawnFailure(command: string, err: NodeJS.ErrnoException): ForkdError {
  if (err.code === "ENOENT") {
    const pkg = TOOL_PACKAGES[command];
    const hint = pkg ? ` (install the Debian package ${pkg})` : "";
    return new ForkdError("unavailable", `${command} is not installed${hint}`, { cause: err });
  }
  return new ForkdError("internal", `cannot run ${command}: ${err.message}`, { cause: err });
}

/** `run` for tools whose stdout is short text. */
export async function runText(command: string, args: string[], options: RunOptions = {}): Promise<string> {
  const { stdout } = await run(command, args, { ...options, stdout: "collect" });
  return stdout.toString("utf8");
}
