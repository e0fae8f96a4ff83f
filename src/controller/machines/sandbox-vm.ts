/**
 * One sandbox: a child VM restored from a snapshot. It owns a run directory (sockets, console log, its private
 * disk overlay), a QEMU process whose RAM maps the snapshot's memory file MAP_PRIVATE, and the agent channel.
 */
import { randomBytes } from "node:crypto";
import { closeSync, openSync } from "node:fs";
import { copyFile, lchown, link, mkdir, open, readFile, rm, stat } from "node:fs/promises";
import path from "node:path";
import { AgentClient } from "../../agent/host/client.js";
import { deadlineSignal } from "../../common/deadline.js";
import { errorMessage, ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import { type ConfinementConfig, resolveConfinement } from "../../isolation/confinement.js";
import { readLayerIndex } from "../../store/memory-layer.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import type { ConsoleLog } from "../../vmm/console-log.js";
import { type GuestRamMapping, writePagesFromFile } from "../../vmm/guest-memory.js";
import { startIncoming } from "../../vmm/incoming.js";
import { launchVm, type VmHandle } from "../../vmm/launch.js";
import { type DeferredDeviceState, deferredDeviceState, loadPagesThenState } from "../../vmm/page-restore.js";
import { DEVICE_STATE_FD } from "../../vmm/qemu-args.js";
import type { QmpClient } from "../../vmm/qmp.js";
import type { FileOwner } from "../../vmm/unix-listener.js";
import { type NicAttachment, privateNic } from "../networks/sandbox-networks.js";
import { BOOT_TIMEOUT_MS, raceExit } from "./boot.js";
import { newSandboxId } from "./ids.js";
import { childSpec, RUN_FILES, SNAPSHOT_FILES } from "./machine.js";
import type { RestorePlan } from "./restore-plan.js";
import { startAndWaitReady } from "./start-ready.js";
import { chainDiskFiles, confineSpec, vmOwner, vmStart } from "./vm-launch.js";

/**
 * From spawn to the agent's answer to the post-restore fix-up. Under TCG on a loaded 2-core host with 100
 * children starting together this reaches tens of seconds; a child slower than this is reported as failed.
 */
export const CHILD_READY_TIMEOUT_MS = { tcg: 120_000, kvm: 30_000 } as const;

/** Bytes of fresh host entropy mixed into each child's kernel RNG (it resumes with its parent's RNG state). */
export const CHILD_ENTROPY_BYTES = 64;

/** What the daemon needs of a running sandbox, whether it started it (Sandbox) or re-attached (AdoptedSandbox). */
export interface SandboxHandle {
  readonly id: string;
  readonly pid: number;
  readonly runDir: string;
  readonly agent: AgentClient;
  /** The snapshot whose RAM image it maps (what it was restored from, or for a resumed sandbox what it was spawned on). */
  readonly snapshotTag: string;
  /** The flat RAM image its guest RAM maps MAP_PRIVATE. */
  readonly memoryImage: string;
  /** Who its QEMU runs as, when not as the daemon's own user: files and sockets made for it are handed over. */
  readonly vmOwner: FileOwner | null;
  /** Its serial console's bounded log. */
  readonly console: ConsoleLog;
  /** Its QMP connection (opened on first use). */
  qmp(): Promise<QmpClient>;
  /**
   * Lets go of the agent and QMP connections and leaves the VM running, for the next daemon to re-attach:
   * QEMU's monitor serves one client at a time, so a connection kept open would starve that re-attach.
   */
  release(): void;
  /** Kills the VM and removes its run directory. Idempotent. */
  destroy(): Promise<void>;
}

export interface RestoreOptions {
  id?: string;
  signal?: AbortSignal;
  /** Default CHILD_READY_TIMEOUT_MS for the snapshot's accelerator. */
  readyTimeoutMs?: number;
  /** Keep the VM running if this program exits (the daemon re-attaches after a restart). */
  outliveHost?: boolean;
  /** Called with the QEMU pid as soon as it is spawned, before the guest is ready (to record or limit it). */
  onSpawned?: (pid: number) => Promise<void>;
  /**
   * What the child's NIC (if its snapshot has one) is attached to; default: a tap in a private namespace with
   * no uplink (SandboxNetworks.attach gives a sandbox its own network).
   */
  nic?: NicAttachment;
  /** Default: this process's (resolveConfinement()). */
  confinement?: ConfinementConfig;
  /** Cgroups QEMU joins before it starts (created by the caller). */
  cgroups?: readonly string[];
  /** Cap on the sandbox's writable disk layer, in bytes (RLIMIT_FSIZE of its QEMU). */
  diskLimitBytes?: number;
  /** The console log's budget in bytes (default 4 MiB). */
  consoleLogBytes?: number;
  /**
   * A child of this plan's snapshot already started by a warm pool (`launchChild` with `deferred`): its
   * id and run directory are used, and only its device state is loaded now. `id`, `nic`, its cgroups and the
   * confinement options are the pool's (it started under its sandbox's: see sandboxes/warm-pool.ts).
   */
  prestarted?: PrestartedChild;
}

/** A QEMU started for a child with `-incoming defer`: devices realised, waiting for its device state. */
export interface PrestartedChild {
  id: string;
  runDir: string;
  vm: VmHandle;
  /** The cgroups it was started in (its sandbox's, under its id; empty on a daemon without cgroups). */
  cgroups: readonly string[];
  /**
   * Already restored under its id (the warm pool's: device state loaded, guest running, fix-up done): taking it
   * leaves only a fresh fix-up (clock, entropy) to the spawn.
   */
  restored?: Sandbox;
}

export interface LaunchChildOptions
  extends Pick<RestoreOptions, "nic" | "confinement" | "cgroups" | "diskLimitBytes" | "consoleLogBytes"> {
  runDir: string;
  signal?: AbortSignal;
  outliveHost?: boolean;
  /** `-incoming defer`: start QEMU and its devices, load the device state later (`startIncoming`). */
  deferred?: boolean;
  /** `-S`: the guest stays stopped after the load until QMP `cont` (measurements). */
  startPaused?: boolean;
}

export interface LaunchedChild {
  vm: VmHandle;
  confinement: ConfinementConfig;
  /** Set when the plan has pages to write first: the device state then goes through this FIFO. */
  deferredState?: DeferredDeviceState;
}

/** Makes a child's run directory and disk overlay and starts its QEMU (confined) on `plan`'s snapshot. */
export async function launchChild(plan: RestorePlan, options: LaunchChildOptions): Promise<LaunchedChild> {
  const { manifest, dir } = plan.snapshot;
  const { runDir } = options;
  await mkdir(runDir, { recursive: true, mode: 0o700 });
  const deviceState = path.join(dir, SNAPSHOT_FILES.deviceState);
  // Pages to write first: the device state then goes through a FIFO, fed once RAM is complete.
  const deferredState = plan.pageLayers.length > 0 ? deferredDeviceState(runDir) : undefined;
  const disk = path.join(runDir, RUN_FILES.disk);
  await copyFile(plan.overlayTemplate, disk);
  const snapshotNic = manifest.machine.nic;
  const nic = snapshotNic ? (options.nic ?? (await privateNic(snapshotNic.vnetHdr))) : undefined;
  const confinement = options.confinement ?? (await resolveConfinement());
  const spec = confineSpec(
    confinement,
    childSpec(manifest, {
      runDir,
      memoryFile: plan.memoryImage,
      shared: false,
      disk,
      restoreFrom: deferredState?.path ?? deviceState,
      nicBackend: nic?.backend,
    }),
  );
  if (options.deferred && spec.restore) spec.restore.deferred = true;
  if (options.startPaused) spec.startPaused = true;
  const start = vmStart(confinement, {
    spec,
    runDir,
    readOnly: await chainDiskFiles(plan.chain),
    nic,
    keepFds: [DEVICE_STATE_FD],
    cgroups: options.cgroups,
    fileSizeLimitBytes: options.diskLimitBytes,
    // A daemon's sandbox outlives the daemon (it re-attaches); any other child dies with its program.
    dieWithParent: options.outliveHost !== true,
  });
  const vm = await launchVm(spec, {
    runDir,
    signal: options.signal,
    outliveHost: options.outliveHost,
    consoleLog: { maxBytes: options.consoleLogBytes },
    ...start,
  });
  return { vm, confinement, deferredState };
}

export class Sandbox implements SandboxHandle {
  private destroyed: Promise<void> | undefined;

  private constructor(
    readonly id: string,
    readonly snapshotTag: string,
    readonly memoryImage: string,
    readonly runDir: string,
    readonly vm: VmHandle,
    readonly agent: AgentClient,
    readonly vmOwner: FileOwner | null,
    readonly createdAtUnix: number,
    /** From the start of the restore to the agent's answer to the fix-up. */
    readonly readyMs: number,
  ) {}

  get pid(): number {
    return this.vm.pid;
  }

  get console(): ConsoleLog {
    return this.vm.console;
  }

  qmp(): Promise<QmpClient> {
    return this.vm.qmp();
  }

  release(): void {
    this.agent.close();
    this.vm.closeQmp();
  }

  static async restore(paths: ForkdPaths, plan: RestorePlan, options: RestoreOptions = {}): Promise<Sandbox> {
    if (options.prestarted?.restored) return Sandbox.claim(options.prestarted.restored, options);
    const started = performance.now();
    const id = options.prestarted?.id ?? options.id ?? newSandboxId();
    const { snapshot } = plan;
    const { manifest } = snapshot;
    const runDir = options.prestarted?.runDir ?? path.join(paths.run, id);
    const readyTimeoutMs = options.readyTimeoutMs ?? CHILD_READY_TIMEOUT_MS[manifest.machine.accel];
    const deadline = deadlineSignal(readyTimeoutMs, options.signal);
    const { signal } = deadline;
    // A prestarted VM is this restore's to kill from the start.
    let vm: VmHandle | undefined = options.prestarted?.vm;
    let agent: AgentClient | undefined;
    let deferred: DeferredDeviceState | undefined;
    try {
      const child = await startChild(plan, runDir, options, signal);
      vm = child.vm;
      deferred = child.deferredState;
      const launched = vm;
      const owner = vmOwner(child.confinement, launched.pid);
      await options.onSpawned?.(launched.pid);
      if (deferred) {
        const layers = plan.pageLayers;
        await raceExit(
          launched,
          loadPagesThenState(
            launched,
            deferred,
            await readFile(path.join(snapshot.dir, SNAPSHOT_FILES.deviceState)),
            (mapping) => writeLayerPages(mapping, layers),
            { signal, expectedBytes: manifest.memory.ramBytes },
          ),
          `sandbox ${id}: writing its pages`,
        );
      }
      // Every later call on this sandbox gets the same patience as its restore: a loaded TCG host is slow.
      agent = new AgentClient(await raceExit(launched, launched.agentConnection, `sandbox ${id}`), {
        callTimeoutMs: readyTimeoutMs,
      });
      await fixUp(launched, agent, id, signal);
      signal.throwIfAborted();
      const readyMs = performance.now() - started;
      return new Sandbox(
        id,
        plan.memoryTag,
        plan.memoryImage,
        runDir,
        launched,
        agent,
        owner,
        Math.floor(Date.now() / 1000),
        readyMs,
      );
    } catch (err) {
      agent?.close();
      throw await restoreFailed(err, {
        vm,
        runDir,
        id,
        snapshotTag: snapshot.tag,
        readyTimeoutMs,
        signal,
        options,
      });
    } finally {
      deferred?.dispose();
      deadline.dispose();
    }
  }

  /**
   * A sandbox the warm pool restored ahead becomes the spawn's: it outlives the host if asked, is recorded, and
   * gets a fresh fix-up (the host's clock now, new entropy; the same id and hostname). On failure it is destroyed.
   */
  private static async claim(pooled: Sandbox, options: RestoreOptions): Promise<Sandbox> {
    const started = performance.now();
    const readyTimeoutMs = options.readyTimeoutMs ?? CHILD_READY_TIMEOUT_MS.tcg;
    const deadline = deadlineSignal(readyTimeoutMs, options.signal);
    try {
      if (options.outliveHost) pooled.vm.process.keepAfterHost();
      await options.onSpawned?.(pooled.pid);
      await fixUp(pooled.vm, pooled.agent, pooled.id, deadline.signal);
      deadline.signal.throwIfAborted();
      return new Sandbox(
        pooled.id,
        pooled.snapshotTag,
        pooled.memoryImage,
        pooled.runDir,
        pooled.vm,
        pooled.agent,
        pooled.vmOwner,
        Math.floor(Date.now() / 1000),
        performance.now() - started,
      );
    } catch (err) {
      await pooled.destroy();
      throw err;
    } finally {
      deadline.dispose();
    }
  }

  /** See coldBootVm: a filesystem-only pause's resume. */
  static async coldBoot(paths: ForkdPaths, options: ColdBootOptions): Promise<Sandbox> {
    const booted = await coldBootVm(paths, options);
    return new Sandbox(
      options.id,
      options.snapshot.tag,
      booted.memoryImage,
      booted.runDir,
      booted.vm,
      booted.agent,
      booted.owner,
      Math.floor(Date.now() / 1000),
      booted.readyMs,
    );
  }

  /** Kills the VM and removes everything it had on the host. Idempotent; safe to call concurrently. */
  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      this.agent.close();
      // A sandbox has nothing to flush: its overlay is discarded with it, so skip the graceful quit.
      await this.vm.kill({ graceMs: 0 }).catch(() => {});
      await rm(this.runDir, { recursive: true, force: true });
    })();
    return this.destroyed;
  }
}

/** The child's QEMU: the warm pool's, now loading its device state, or one launched for it now. */
async function startChild(
  plan: RestorePlan,
  runDir: string,
  options: RestoreOptions,
  signal: AbortSignal,
): Promise<LaunchedChild> {
  if (options.prestarted) {
    const { vm } = options.prestarted;
    const confinement = options.confinement ?? (await resolveConfinement());
    if (options.outliveHost) vm.process.keepAfterHost();
    await startIncoming(await vm.qmp({ signal }), { signal });
    return { vm, confinement };
  }
  return launchChild(plan, {
    runDir,
    nic: options.nic,
    signal,
    outliveHost: options.outliveHost,
    confinement: options.confinement,
    cgroups: options.cgroups,
    diskLimitBytes: options.diskLimitBytes,
    consoleLogBytes: options.consoleLogBytes,
  });
}

/** The post-restore fix-up: the host's clock, fresh entropy, the child's own hostname and id. */
async function fixUp(vm: VmHandle, agent: AgentClient, id: string, signal: AbortSignal): Promise<void> {
  await raceExit(
    vm,
    agent.restore(
      {
        timeNs: BigInt(Date.now()) * 1_000_000n,
        entropy: randomBytes(CHILD_ENTROPY_BYTES),
        hostname: id,
        sandboxId: id,
      },
      { signal },
    ),
    `sandbox ${id}: post-restore fix-up`,
  );
}

/**
 * A restore that failed leaves nothing behind (its VM killed, its run directory gone); the error to throw
 * says why, with the guest console's end when it ran out of time.
 */
async function restoreFailed(
  err: unknown,
  what: {
    vm: VmHandle | undefined;
    runDir: string;
    id: string;
    snapshotTag: string;
    readyTimeoutMs: number;
    signal: AbortSignal;
    options: RestoreOptions;
  },
): Promise<ForkdError> {
  const { vm, id } = what;
  const tail = vm ? await vm.consoleTail(1500).catch(() => "") : "";
  await vm?.kill({ graceMs: 0 }).catch(() => {});
  await rm(what.runDir, { recursive: true, force: true });
  if (what.signal.aborted && !what.options.signal?.aborted) {
    return new ForkdError(
      "timeout",
      `sandbox ${id} from ${what.snapshotTag}: not ready within ${what.readyTimeoutMs / 1000} s` +
        (tail ? `\n--- guest console ---\n${tail}` : ""),
      { cause: err },
    );
  }
  return err instanceof ForkdError
    ? err
    : new ForkdError("internal", `sandbox ${id}: ${errorMessage(err)}`, { cause: err });
}

/** Writes every page of `layers` (oldest first, so a newer layer's page wins) into a restoring child's RAM. */
async function writeLayerPages(mapping: GuestRamMapping, layers: readonly string[]): Promise<void> {
  for (const layer of layers) {
    const { pages, dataOffset } = await readLayerIndex(layer);
    const fd = openSync(layer, "r");
    try {
      writePagesFromFile(mapping, pages, fd, dataOffset);
    } finally {
      closeSync(fd);
    }
  }
}

export interface ColdBootOptions extends Omit<RestoreOptions, "prestarted" | "readyTimeoutMs"> {
  id: string;
  /** The snapshot the disk reads through to (its manifest names the image and machine), and its chain. */
  snapshot: StoredSnapshot;
  chain: readonly StoredSnapshot[];
  /** The disk a filesystem-only pause kept: linked into the run directory, written by the VM from now on. */
  disk: string;
}

/**
 * A sandbox booted afresh (no memory restored) from its snapshot's kernel and machine on its own kept disk,
 * under its id: a filesystem-only pause's resume. Its RAM is a new shared file of its own. On failure nothing of
 * the attempt is left but the kept disk (what the failed boot wrote to it is a crashed boot's, as after a crash).
 */
async function coldBootVm(paths: ForkdPaths, options: ColdBootOptions): Promise<ColdBooted> {
  const started = performance.now();
  const { id, snapshot } = options;
  const { manifest } = snapshot;
  const runDir = path.join(paths.run, id);
  const timeoutMs = BOOT_TIMEOUT_MS[manifest.machine.accel];
  const deadline = deadlineSignal(timeoutMs, options.signal);
  const { signal } = deadline;
  let vm: VmHandle | undefined;
  let agent: AgentClient | undefined;
  try {
    await mkdir(runDir, { recursive: true, mode: 0o700 });
    const disk = path.join(runDir, RUN_FILES.disk);
    await reclaim(options.disk);
    await link(options.disk, disk);
    const memoryFile = path.join(runDir, COLD_BOOT_MEMORY_FILE);
    const ram = await open(memoryFile, "wx", 0o600);
    await ram.truncate(manifest.machine.memoryMiB * 2 ** 20).finally(() => ram.close());
    const confinement = options.confinement ?? (await resolveConfinement());
    const snapshotNic = manifest.machine.nic;
    const nic = snapshotNic ? (options.nic ?? (await privateNic(snapshotNic.vnetHdr))) : undefined;
    const spec = confineSpec(
      confinement,
      childSpec(manifest, { runDir, memoryFile, shared: true, disk, nicBackend: nic?.backend }),
    );
    const start = vmStart(confinement, {
      spec,
      runDir,
      readOnly: await chainDiskFiles(options.chain),
      nic,
      cgroups: options.cgroups,
      fileSizeLimitBytes: options.diskLimitBytes,
      dieWithParent: options.outliveHost !== true,
    });
    vm = await launchVm(spec, {
      runDir,
      signal,
      outliveHost: options.outliveHost,
      consoleLog: { maxBytes: options.consoleLogBytes },
      ...start,
    });
    const launched = vm;
    await options.onSpawned?.(launched.pid);
    agent = new AgentClient(await raceExit(launched, launched.agentConnection, `sandbox ${id}`), {
      callTimeoutMs: CHILD_READY_TIMEOUT_MS[manifest.machine.accel],
    });
    await raceExit(launched, agent.waitHello({ signal }), `sandbox ${id}: cold boot`);
    await fixUp(launched, agent, id, signal);
    signal.throwIfAborted();
    // Booted: the template's start and ready have a deadline of their own (ready's), not the boot's.
    deadline.dispose();
    await startAgain(launched, agent, id, manifest, options.signal);
    return {
      memoryImage: memoryFile,
      runDir,
      vm: launched,
      agent,
      owner: vmOwner(confinement, launched.pid),
      readyMs: performance.now() - started,
    };
  } catch (err) {
    agent?.close();
    throw await restoreFailed(err, {
      vm,
      runDir,
      id,
      snapshotTag: snapshot.tag,
      readyTimeoutMs: timeoutMs,
      signal,
      options,
    });
  } finally {
    deadline.dispose();
  }
}

/** Guest `sync` before a cold-booted VM that failed its start or ready is killed: its kept disk stays clean. */
const FAILED_START_SYNC_TIMEOUT_MS = 30_000;

/**
 * The snapshot's `start` command and `ready` check run again in a cold-booted sandbox (a warm restore keeps the
 * started process; a boot has none). When they fail, the guest's writes are synced first, so the kept disk the
 * VM is killed on is whole (the resume fails; the sandbox stays paused on that disk).
 */
async function startAgain(
  vm: VmHandle,
  agent: AgentClient,
  id: string,
  manifest: StoredSnapshot["manifest"],
  signal: AbortSignal | undefined,
): Promise<void> {
  const { start, ready } = manifest.template;
  if (!start && !ready) return;
  const what = `sandbox ${id}: the template's start command after a cold boot`;
  try {
    await raceExit(vm, startAndWaitReady(agent, { start, ready }, { what, signal }), what);
  } catch (err) {
    await agent.exec(["sync"], { timeoutMs: FAILED_START_SYNC_TIMEOUT_MS }).catch(() => {});
    throw err;
  }
}

/**
 * A kept disk a cold boot killed midway handed to its VM's uid (the launcher hands a VM its files): it is the
 * daemon's again before the next VM gets it (the launcher refuses a file not its caller's).
 */
async function reclaim(file: string): Promise<void> {
  const uid = process.getuid?.();
  const gid = process.getgid?.();
  if (uid === undefined || gid === undefined) return;
  const owner = await stat(file);
  if (owner.uid !== uid || owner.gid !== gid) await lchown(file, uid, gid);
}

interface ColdBooted {
  memoryImage: string;
  runDir: string;
  vm: VmHandle;
  agent: AgentClient;
  owner: FileOwner | null;
  readyMs: number;
}

/** The name of a cold-booted sandbox's RAM file in its run directory (shared: the guest writes into it). */
export const COLD_BOOT_MEMORY_FILE = "memory.bin";
