/**
 * Starting one VM: the agent listener first, then QEMU, then a handle that owns both. Everything the VM
 * creates on the host (sockets, listener, QMP connection) is released when QEMU exits.
 *
 * Ordering that matters: QEMU's agent chardev is a socket CLIENT (`server=off`), and QEMU connects it
 * synchronously while starting, before it loads an incoming device state. So the host listener must exist
 * before QEMU is spawned, and a restored child's virtio-serial port is already connected when the guest
 * resumes: the guest never sees its host side go away (verified: the counter guest's open count stays 1
 * across a restore; see test/vmm/snapshot.test.ts).
 */
import fs from "node:fs";
import fsp from "node:fs/promises";
import type net from "node:net";
import { abortError, raceAbort, sleep, timeoutSignal } from "../common/deadline.js";
import { ForkdError, invalidArgument } from "../common/errors.js";
import { buildQemuArgs, DEVICE_IDS, type MachineSpec } from "./qemu-args.js";
import { type QemuExit, type QemuProcess, spawnQemu } from "./qemu-process.js";
import { QmpClient } from "./qmp.js";
import { listenForOneConnection, type OneConnectionListener, removeStaleSocket } from "./unix-listener.js";

/**
 * QEMU connects the agent chardev within milliseconds of starting (measured ~30 ms under TCG); this bound
 * only catches a QEMU that is wedged before it gets there.
 */
export const AGENT_CONNECT_TIMEOUT_MS = 30_000;

/** QEMU creates its QMP socket during startup; a QEMU without one this long after spawn is wedged. */
export const QMP_READY_TIMEOUT_MS = 30_000;

/** After a failed QMP connect, how long to look for QEMU's exit before blaming the socket. */
export const EXIT_NOTICE_MS = 100;

/** Poll interval while QEMU has not yet created its QMP socket. */
export const QMP_CONNECT_RETRY_MS = 10;

/** Default size of `consoleTail()`: the last screen or so of the guest's serial console. */
export const CONSOLE_TAIL_BYTES = 8192;

export interface LaunchOptions {
  /** Aborts the launch: QEMU is killed and `agentConnection` rejects. No effect once the agent connected. */
  signal?: AbortSignal;
  /** This VM's directory for its sockets and logs; created with mode 0700 when missing. */
  runDir?: string;
  qemuBinary?: string;
  /** Keep QEMU running when the host program exits (see SpawnQemuOptions.outliveHost). */
  outliveHost?: boolean;
  /** A launcher QEMU is started through (see SpawnQemuOptions.prefix); needed for a NIC on a tap. */
  prefix?: readonly string[];
}

export interface VmHandle {
  readonly spec: MachineSpec;
  readonly pid: number;
  readonly process: QemuProcess;
  /** The agent channel's host end: resolves when QEMU connects; rejects if QEMU exits first or on abort. */
  readonly agentConnection: Promise<net.Socket>;
  /** Resolves when QEMU has exited (never rejects). */
  readonly exited: Promise<QemuExit>;
  /** The VM's QMP client, connected on first use (retrying until QEMU has created the socket). */
  qmp(options?: { signal?: AbortSignal }): Promise<QmpClient>;
  /** Closes this process's QMP connection, if any, leaving QEMU running (its monitor takes one client at a time). */
  closeQmp(): void;
  /** QMP quit (if connected) or SIGTERM, then SIGKILL of the process group after `graceMs`. */
  kill(options?: { graceMs?: number }): Promise<QemuExit>;
  /** The end of the guest's serial console log, with control characters removed (guest output is untrusted). */
  consoleTail(maxBytes?: number): Promise<string>;
  /** Points the agent chardev at a fresh host listener (default: the spec's path) and resolves with its socket. */
  reattachAgent(options?: { socketPath?: string; signal?: AbortSignal }): Promise<net.Socket>;
}

/** Spawns QEMU for `spec`. Resolves once QEMU runs; the agent connection and QMP follow asynchronously. */
export async function launchVm(spec: MachineSpec, options: LaunchOptions = {}): Promise<VmHandle> {
  const args = buildQemuArgs(spec);
  if (spec.nic?.backend === "tap" && !options.prefix?.length) {
    throw invalidArgument(
      "a NIC on a tap needs a launcher that opens the tap at TAP_FD (LaunchOptions.prefix)",
    );
  }
  if (options.signal?.aborted) throw abortError(options.signal, "launching VM");
  if (options.runDir) await fsp.mkdir(options.runDir, { recursive: true, mode: 0o700 });
  await removeStaleSocket(spec.qmpSocketPath);

  const listener = spec.agent
    ? await listenForOneConnection(spec.agent.socketPath, "agent socket")
    : undefined;
  let stateFd: number | undefined;
  let qemu: QemuProcess;
  try {
    if (spec.restore) stateFd = openDeviceState(spec.restore.deviceStatePath);
    qemu = await spawnQemu({
      args,
      binary: options.qemuBinary,
      extraFds: stateFd === undefined ? [] : [stateFd],
      outliveHost: options.outliveHost,
      prefix: options.prefix,
    });
  } catch (err) {
    listener?.close();
    throw err;
  } finally {
    // QEMU has its own copy of the fd now (or never got one).
    if (stateFd !== undefined) fs.closeSync(stateFd);
  }
  return new Vm(spec, qemu, listener, options.signal);
}

/**
 * Replaces the backend of the VM's agent chardev with a fresh connection to a new host listener at
 * `socketPath` (QMP `chardev-change`), e.g. after a daemon restart lost the old connection. Resolves with the
 * new socket. The guest sees the port's host side reconnect.
 */
export async function reattachAgent(
  qmp: QmpClient,
  socketPath: string,
  options: { signal?: AbortSignal } = {},
): Promise<net.Socket> {
  const listener = await listenForOneConnection(socketPath, "agent socket");
  const deadline = timeoutSignal(AGENT_CONNECT_TIMEOUT_MS, options.signal);
  const { signal } = deadline;
  try {
    // QEMU connects the new client chardev synchronously inside chardev-change.
    await qmp.execute(
      "chardev-change",
      {
        id: DEVICE_IDS.agentChardev,
        backend: {
          type: "socket",
          data: { addr: { type: "unix", data: { path: socketPath } }, server: false },
        },
      },
      { signal },
    );
    return await raceAbort(listener.connection, signal, `waiting for QEMU to connect to ${socketPath}`);
  } finally {
    deadline.dispose();
    listener.close();
  }
}

class Vm implements VmHandle {
  readonly spec: MachineSpec;
  readonly process: QemuProcess;
  readonly exited: Promise<QemuExit>;
  private agent: Promise<net.Socket>;
  private agentSocket: net.Socket | undefined;
  private qmpClient: Promise<QmpClient> | undefined;
  private connectedQmp: QmpClient | undefined;

  constructor(
    spec: MachineSpec,
    qemu: QemuProcess,
    listener: OneConnectionListener | undefined,
    signal?: AbortSignal,
  ) {
    this.spec = spec;
    this.process = qemu;
    this.exited = qemu.exited.then(async (exit) => {
      listener?.close();
      this.connectedQmp?.close();
      this.agentSocket?.destroy();
      await removeStaleSocket(spec.qmpSocketPath).catch(() => {});
      if (spec.agent) await removeStaleSocket(spec.agent.socketPath).catch(() => {});
      return exit;
    });

    if (signal?.aborted) void qemu.kill({ graceMs: 0 });
    const onAbort = () => void qemu.kill({ graceMs: 0 });
    signal?.addEventListener("abort", onAbort, { once: true });
    if (!listener) {
      signal?.removeEventListener("abort", onAbort);
      this.agent = Promise.reject(
        new ForkdError("invalid_argument", "this VM has no agent channel (spec.agent)"),
      );
    } else {
      const deadline = timeoutSignal(AGENT_CONNECT_TIMEOUT_MS, signal);
      const settle = () => {
        deadline.dispose();
        signal?.removeEventListener("abort", onAbort);
        listener.close();
      };
      this.agent = this.untilExit(
        raceAbort(listener.connection, deadline.signal, "waiting for QEMU to connect the agent channel"),
        "before connecting the agent channel",
      ).then(
        (socket) => {
          settle();
          this.agentSocket = socket;
          return socket;
        },
        (err: unknown) => {
          settle();
          throw err;
        },
      );
    }
    // A caller that never looks at agentConnection must not get an unhandled rejection.
    this.agent.catch(() => {});
  }

  get pid(): number {
    return this.process.pid;
  }

  get agentConnection(): Promise<net.Socket> {
    return this.agent;
  }

  qmp(options: { signal?: AbortSignal } = {}): Promise<QmpClient> {
    if (this.qmpClient) return this.qmpClient;
    const attempt = this.connectQmp(options.signal);
    this.qmpClient = attempt;
    attempt.then(
      (client) => {
        this.connectedQmp = client;
        client.once("close", () => {
          if (this.qmpClient === attempt) this.qmpClient = undefined;
          if (this.connectedQmp === client) this.connectedQmp = undefined;
        });
      },
      () => {
        if (this.qmpClient === attempt) this.qmpClient = undefined;
      },
    );
    return attempt;
  }

  closeQmp(): void {
    this.connectedQmp?.close();
  }

  kill(options: { graceMs?: number } = {}): Promise<QemuExit> {
    const qmp = this.connectedQmp;
    return this.process
      .kill({
        graceMs: options.graceMs,
        quit: qmp && !qmp.closed ? () => qmp.execute("quit") : undefined,
      })
      .then(() => this.exited);
  }

  async consoleTail(maxBytes = CONSOLE_TAIL_BYTES): Promise<string> {
    let handle: fsp.FileHandle;
    try {
      handle = await fsp.open(this.spec.consoleLogPath, "r");
    } catch {
      return "";
    }
    try {
      const { size } = await handle.stat();
      const length = Math.min(size, maxBytes);
      const buffer = Buffer.alloc(length);
      await handle.read(buffer, 0, length, size - length);
      // biome-ignore lint/suspicious/noControlCharactersInRegex: stripping control characters is the point
      return buffer.toString("utf8").replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "");
    } finally {
      await handle.close();
    }
  }

  async reattachAgent(options: { socketPath?: string; signal?: AbortSignal } = {}): Promise<net.Socket> {
    const socketPath = options.socketPath ?? this.spec.agent?.socketPath;
    if (!socketPath) throw invalidArgument("this VM has no agent channel to reattach (spec.agent)");
    const qmp = await this.qmp({ signal: options.signal });
    const previous = this.agentSocket;
    const attempt = this.untilExit(reattachAgent(qmp, socketPath, options), "while reattaching the agent");
    const socket = await attempt;
    previous?.destroy();
    this.agentSocket = socket;
    this.agent = attempt;
    return socket;
  }

  private async connectQmp(signal: AbortSignal | undefined): Promise<QmpClient> {
    const timeout = timeoutSignal(QMP_READY_TIMEOUT_MS, signal);
    try {
      return await this.connectQmpUntil(timeout.signal);
    } finally {
      timeout.dispose();
    }
  }

  private async connectQmpUntil(deadline: AbortSignal): Promise<QmpClient> {
    for (;;) {
      if (this.process.exitStatus) throw this.exitedError("before QMP was ready");
      try {
        return await QmpClient.connect(this.spec.qmpSocketPath, {
          signal: deadline,
          describeClose: () => this.process.describeSoon(),
        });
      } catch (err) {
        // A QEMU that is exiting resets or closes the connection: report the exit, not the socket error.
        await Promise.race([this.process.exited, sleep(EXIT_NOTICE_MS).catch(() => {})]);
        if (this.process.exitStatus) throw this.exitedError("before QMP was ready");
        const code = ((err as ForkdError).cause as NodeJS.ErrnoException | undefined)?.code;
        // The socket appears a few milliseconds after spawn; anything else is a real failure.
        if (code !== "ENOENT" && code !== "ECONNREFUSED") throw err;
      }
      await sleep(QMP_CONNECT_RETRY_MS, deadline).catch(() => {
        throw abortError(deadline, `waiting for QEMU (pid ${this.pid}) to open its QMP socket`);
      });
    }
  }

  /** Rejects with QEMU's exit status and output tail if QEMU exits before `promise` settles. */
  private untilExit<T>(promise: Promise<T>, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      promise.then(
        (value) => {
          settled = true;
          resolve(value);
        },
        (err: unknown) => {
          settled = true;
          reject(err);
        },
      );
      void this.process.exited.then(() => {
        if (!settled) reject(this.exitedError(what));
      });
    });
  }

  private exitedError(what: string): ForkdError {
    return new ForkdError("unavailable", `QEMU stopped ${what}: ${this.process.describe()}`);
  }
}

function openDeviceState(deviceStatePath: string): number {
  try {
    return fs.openSync(deviceStatePath, "r");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new ForkdError(
      code === "ENOENT" ? "not_found" : "unavailable",
      `cannot open device state ${deviceStatePath}: ${code ?? String(err)}`,
    );
  }
}
