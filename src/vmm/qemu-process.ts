/**
 * QEMU as a child process: spawned from an argv array (never a shell) in its own process group, its output kept
 * in a bounded ring buffer for error messages, and registered so that the host program never leaves a QEMU
 * behind when it exits or is ended by a signal it does not handle (SIGINT/SIGTERM/SIGHUP).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { ForkdError } from "../common/errors.js";
import { disableThpForChildren } from "./thp.js";

export const DEFAULT_QEMU_BINARY = "qemu-system-x86_64";

/** Kept of QEMU's stdout+stderr: enough for its last error messages, bounded against a chatty process. */
export const OUTPUT_TAIL_BYTES = 64 * 1024;

/** Shown in error messages: QEMU's fatal errors are one or two lines. */
export const ERROR_TAIL_CHARS = 2000;

/**
 * Time a QEMU gets to quit by itself (QMP quit or SIGTERM) before SIGKILL. Quitting takes milliseconds; the
 * grace lets it flush qcow2 metadata and remove its sockets.
 */
export const DEFAULT_KILL_GRACE_MS = 3000;

/** A process not gone this long after SIGKILL is stuck in the kernel (D state): report it, don't hang. */
export const SIGKILL_REAP_TIMEOUT_MS = 10_000;

/** After QEMU exits, how long to wait for the rest of its output to be read before resolving `exited`. */
export const OUTPUT_DRAIN_MS = 200;

export interface QemuExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface SpawnQemuOptions {
  args: readonly string[];
  /** QEMU binary; defaults to $FORKD_QEMU_BINARY, then DEFAULT_QEMU_BINARY looked up in PATH. */
  binary?: string;
  /** Open fds handed to QEMU as fd 3, 4, ... (e.g. the device-state file for `-incoming fd:3`). */
  extraFds?: readonly number[];
  /**
   * A launcher that execs QEMU (binary and its arguments, ending where QEMU's binary goes): QEMU then runs with
   * whatever the launcher set up (a network namespace, a tap at a known fd) and keeps the launcher's pid.
   */
  prefix?: readonly string[];
  /** Variables added to QEMU's environment (it inherits the host program's otherwise). */
  env?: Readonly<Record<string, string>>;
  /**
   * Leave this QEMU running when the host program exits (a daemon restarting without stopping its VMs).
   * Default false: the exit/signal hooks kill it.
   */
  outliveHost?: boolean;
}

export interface KillOptions {
  /** Time for a graceful quit before SIGKILL; 0 kills at once. Default DEFAULT_KILL_GRACE_MS. */
  graceMs?: number;
  /** Graceful quit to try first (e.g. QMP `quit`); without it the process group gets SIGTERM. */
  quit?: () => Promise<unknown>;
}

export function resolveQemuBinary(binary?: string): string {
  return binary ?? process.env.FORKD_QEMU_BINARY ?? DEFAULT_QEMU_BINARY;
}

/** A bounded buffer of the most recent bytes of a stream. */
export class TailBuffer {
  private chunks: Buffer[] = [];
  private bytes = 0;
  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.bytes += chunk.length;
    while (this.bytes > this.limit && this.chunks.length > 0) {
      const first = this.chunks[0] as Buffer;
      const excess = this.bytes - this.limit;
      if (first.length <= excess) {
        this.chunks.shift();
        this.bytes -= first.length;
      } else {
        this.chunks[0] = first.subarray(excess);
        this.bytes -= excess;
      }
    }
  }

  text(maxChars = this.limit): string {
    const text = Buffer.concat(this.chunks).toString("utf8");
    return text.length > maxChars ? `…${text.slice(text.length - maxChars)}` : text;
  }
}

export class QemuProcess {
  readonly pid: number;
  readonly binary: string;
  /** Resolves once QEMU has exited and its remaining output was read. Never rejects. */
  readonly exited: Promise<QemuExit>;
  private exitStatusValue: QemuExit | undefined;
  private readonly output = new TailBuffer(OUTPUT_TAIL_BYTES);

  /** @internal use spawnQemu */
  constructor(child: ChildProcess, binary: string, outliveHost: boolean) {
    if (child.pid === undefined) throw new ForkdError("internal", "QemuProcess needs a spawned child");
    this.pid = child.pid;
    this.binary = binary;
    child.stdout?.on("data", (chunk: Buffer) => this.output.push(chunk));
    child.stderr?.on("data", (chunk: Buffer) => this.output.push(chunk));
    if (!outliveHost) registerLive(this);
    this.exited = new Promise<QemuExit>((resolve) => {
      child.once("exit", (code, signal) => {
        this.exitStatusValue = { code, signal };
        unregisterLive(this);
        let settled = false;
        const settle = () => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          resolve({ code, signal });
        };
        // 'close' follows once stdout/stderr are drained; a grandchild holding them must not delay us long.
        const timer = setTimeout(settle, OUTPUT_DRAIN_MS);
        child.once("close", settle);
      });
    });
  }

  /**
   * From now on this QEMU outlives the host program (as if spawned with `outliveHost`): a warm pool's VM
   * handed to a sandbox the daemon re-attaches after a restart.
   */
  keepAfterHost(): void {
    unregisterLive(this);
  }

  /** Set once QEMU has exited. */
  get exitStatus(): QemuExit | undefined {
    return this.exitStatusValue;
  }

  /** The last `maxChars` characters QEMU wrote to stdout/stderr. */
  outputTail(maxChars = ERROR_TAIL_CHARS): string {
    return this.output.text(maxChars).trim();
  }

  /** One line for error messages: how QEMU ended (or that it runs) and what it said last. */
  describe(): string {
    const status = this.exitStatusValue;
    const state = status
      ? `QEMU (pid ${this.pid}) ${describeExit(status)}`
      : `QEMU (pid ${this.pid}) is running`;
    const tail = this.outputTail();
    return tail ? `${state}; its output ends with: ${tail}` : `${state}; it printed nothing`;
  }

  /**
   * `describe()` once QEMU has exited, or after `waitMs` if it has not: when a socket to QEMU closes, the
   * exit status and last output arrive a moment later and are what the caller needs to see.
   */
  async describeSoon(waitMs = OUTPUT_DRAIN_MS * 2): Promise<string> {
    await this.waitExit(waitMs);
    return this.describe();
  }

  /** Sends `signal` to QEMU's whole process group (QEMU and anything it spawned), while QEMU is alive. */
  signalGroup(signal: NodeJS.Signals): void {
    // Only while the leader lives: after it is reaped its pid (and so the group id) may be reused.
    if (this.exitStatusValue) return;
    signalGroup(this.pid, signal);
  }

  /** Graceful quit, then SIGKILL of the group after `graceMs`. Resolves with the exit status. */
  async kill(options: KillOptions = {}): Promise<QemuExit> {
    const graceMs = options.graceMs ?? DEFAULT_KILL_GRACE_MS;
    if (this.exitStatusValue) return this.exited;
    if (graceMs > 0) {
      const deadline = Date.now() + graceMs;
      let asked = false;
      if (options.quit) {
        asked = await Promise.race([
          options.quit().then(
            () => true,
            () => false,
          ),
          delay(graceMs).then(() => false),
        ]);
      }
      if (!asked) this.signalGroup("SIGTERM");
      const exit = await this.waitExit(Math.max(0, deadline - Date.now()));
      if (exit) return exit;
    }
    this.signalGroup("SIGKILL");
    const exit = await this.waitExit(SIGKILL_REAP_TIMEOUT_MS);
    if (exit) return exit;
    throw new ForkdError(
      "internal",
      `QEMU (pid ${this.pid}) did not exit within ${SIGKILL_REAP_TIMEOUT_MS} ms of SIGKILL`,
    );
  }

  private waitExit(ms: number): Promise<QemuExit | undefined> {
    return Promise.race([this.exited, delay(ms).then(() => undefined)]);
  }
}

/** Spawns QEMU. Rejects with `unavailable` if the binary cannot be started. */
export function spawnQemu(options: SpawnQemuOptions): Promise<QemuProcess> {
  const binary = resolveQemuBinary(options.binary);
  disableThpForChildren();
  const [command, ...commandArgs] = options.prefix?.length
    ? [...options.prefix, binary, ...options.args]
    : [binary, ...options.args];
  return new Promise((resolve, reject) => {
    let child: ChildProcess;
    try {
      child = spawn(command as string, commandArgs, {
        // Own process group (and session): a terminal's Ctrl-C reaches only the host program, which then
        // tears QEMU down in order, and a group kill also reaches anything QEMU spawned.
        detached: true,
        stdio: ["ignore", "pipe", "pipe", ...(options.extraFds ?? [])],
        env: options.env ? { ...process.env, ...options.env } : process.env,
      });
    } catch (err) {
      reject(new ForkdError("unavailable", `cannot start QEMU (${binary}): ${String(err)}`, { cause: err }));
      return;
    }
    child.once("error", (err: NodeJS.ErrnoException) => {
      if (child.pid !== undefined) return;
      const hint =
        err.code !== "ENOENT"
          ? ""
          : options.prefix?.length
            ? ` (${command} is missing: npm run build builds the launcher)`
            : " (is the qemu-system-x86 package installed? set FORKD_QEMU_BINARY)";
      reject(
        new ForkdError("unavailable", `cannot start QEMU (${command}): ${err.code ?? err.message}${hint}`),
      );
    });
    child.once("spawn", () => resolve(new QemuProcess(child, binary, options.outliveHost ?? false)));
  });
}

export function describeExit(exit: QemuExit): string {
  return exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`;
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ESRCH") throw err;
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

// ---- Registry: no QEMU outlives the host program unless asked to ----

const live = new Set<QemuProcess>();
const HOST_SIGNALS: NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];
let hooksInstalled = false;

/** QEMU processes started by this program that are still running (and not `outliveHost`). */
export function liveQemuProcesses(): readonly QemuProcess[] {
  return [...live];
}

function registerLive(qemu: QemuProcess): void {
  live.add(qemu);
  if (!hooksInstalled) installHooks();
}

function unregisterLive(qemu: QemuProcess): void {
  live.delete(qemu);
  // Signal handlers replace Node's default "terminate" action, so they are only installed while needed.
  if (live.size === 0 && hooksInstalled) uninstallHooks();
}

/** Synchronous: runs inside 'exit' and signal handlers, where nothing asynchronous gets to run. */
function killAllLive(): void {
  for (const qemu of live) qemu.signalGroup("SIGKILL");
}

/**
 * Only a signal that will end the program ends its QEMUs. When the program handles the signal itself (the
 * daemon reopens its audit log on SIGHUP and drains on SIGTERM), it decides what happens; QEMUs it still holds
 * when it exits are killed by the 'exit' hook. Otherwise restore the default action and re-raise the signal, so
 * the program terminates the way it would have without our handler (exit status 128+n).
 */
function onHostSignal(signal: NodeJS.Signals): void {
  if (process.listenerCount(signal) > 1) return;
  killAllLive();
  uninstallHooks();
  process.kill(process.pid, signal);
}

function installHooks(): void {
  hooksInstalled = true;
  process.on("exit", killAllLive);
  for (const signal of HOST_SIGNALS) process.on(signal, onHostSignal);
}

function uninstallHooks(): void {
  hooksInstalled = false;
  process.off("exit", killAllLive);
  for (const signal of HOST_SIGNALS) process.off(signal, onHostSignal);
}
