/**
 * The daemon's sandboxes: spawning them from snapshots, serving calls to their agents, their lifetimes and
 * limits, and their state in SQLite so a daemon restart re-attaches to running VMs (their QEMU outlives the
 * daemon) and cleans up after dead ones.
 */

import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { readdir, rm, rmdir } from "node:fs/promises";
import type http from "node:http";
import type net from "node:net";
import path from "node:path";
import type { AgentClient } from "../../agent/host/client.js";
import type { EvalOptions, ExecOptions } from "../../agent/host/types.js";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, errorMessage, ForkdError, invalidArgument, notFound } from "../../common/errors.js";
import { lockHome } from "../../common/home-lock.js";
import {
  CONSOLE_READ_BYTES,
  DEFAULT_DISK_LIMIT_MIB,
  MAX_CONSOLE_READ_BYTES,
  MAX_SANDBOX_TIMEOUT_MS,
} from "../../common/limits.js";
import { assertSandboxRef, assertTag, isValidSandboxId } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import {
  currentBootId,
  isAlive,
  OWNER_TOKEN_PATTERN,
  ownerTokenAlive,
  type ProcessIdentity,
} from "../../common/processes.js";
import {
  type CgroupLayout,
  createSandboxCgroups,
  detectCgroupLayout,
  prepareCgroupParents,
  readOomKills,
  removeCgroups,
  sandboxCgroupDirs,
  sweepCgroups,
} from "../../isolation/cgroup.js";
import {
  type ConfinementConfig,
  type ConfinementMode,
  resolveConfinement,
} from "../../isolation/confinement.js";
import { allowUnprivilegedUserfaultfd } from "../../isolation/userfaultfd.js";
import type { EgressPolicy, EgressPolicyInput } from "../../net/policy.js";
import { PortProxy, type PortTarget } from "../../net/port-proxy.js";
import { type SandboxRow, StateDb } from "../../store/db.js";
import { DEFAULT_CONSOLE_LOG_BYTES, printableConsole, readTail } from "../../vmm/console-log.js";
import { describeExit } from "../../vmm/qemu-process.js";
import { isOurProcess, killAndWait, processesMentioning, recordedIdentity } from "../host/processes.js";
import { type HostStatus, type SandboxUsage, UsageSampler } from "../host/usage.js";
import { RUN_FILES, SNAPSHOT_FILES } from "../machines/machine.js";
import { homeKey, prepareRestore, type RestorePlan } from "../machines/restore-plan.js";
import { CHILD_READY_TIMEOUT_MS, Sandbox, type SandboxHandle } from "../machines/sandbox-vm.js";
import {
  type NetworkRequest,
  SandboxNetworks,
  type SandboxNetworksOptions,
  templateEgressOf,
} from "../networks/sandbox-networks.js";
import type {
  AccessTokens,
  BranchOutcome,
  ConfinementStatus,
  ForkChild,
  ForkOutcome,
  NetworkStatus,
  PauseOutcome,
  PauseRequest,
  ResumeRequest,
  SandboxInfo,
  SandboxMetrics,
  SandboxService,
  SandboxStatus,
  SpawnRequest,
} from "../sandbox-service.js";
import { Brancher, type BranchRequest, interruptedBranchTag } from "../snapshots/branch.js";
import { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import { assertAlias } from "../snapshots/template-aliases.js";
import { Admission, type AdmissionLimits, DEFAULT_ADMISSION_LIMITS } from "./admission.js";
import { AdoptedSandbox } from "./adopted-sandbox.js";
import { validateChildCount } from "./fork-children.js";
import { KeyedLock } from "./keyed-lock.js";
import { cgroupDirsOf, cgroupLimits, parseLimits, validateLimitsRequest } from "./limits.js";
import { MetricsSampler } from "./metrics-sampler.js";
import { pauseLayerTag, writePauseLayer } from "./pause-layer.js";
import { branchPausedState } from "./paused-branch.js";
import { pausedRowUpdate, residentBytes, settlePaused } from "./paused-state.js";
import {
  hostHeaderFor,
  layerEnv,
  newAccessToken,
  parseInbound,
  parseStringMap,
  tokenMatches,
} from "./settings.js";
import { recordSpawned, type SpawnContext, type SpawnPolicy, startChildren } from "./spawn-children.js";
import { isIntIn, resolveSpawn, type SpawnRequestContext, spawnRows } from "./spawn-request.js";
import { WarmPool, type WarmPoolStats, type WarmPoolTarget } from "./warm-pool.js";
import { Workspaces } from "./workspaces.js";

/**
 * Lifetime of a sandbox spawned without one: none (it lives until killed), as in forkd v0.5. A daemon may set one
 * (`forkd daemon --default-timeout-ms`); callers that want E2B's five minutes ask for them (the SDKs do).
 */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 0;
export { NETWORK_SETUP_CONCURRENCY, SPAWN_CONCURRENCY } from "./spawn-children.js";
/** Default limit for the command of a snapshot-diff (package installs under TCG take minutes). */
export const SNAPSHOT_DIFF_EXEC_TIMEOUT_MS = 30 * 60_000;

/** How often lifetimes are enforced and dead VMs noticed. */
export const SWEEP_INTERVAL_MS = 1000;
/** How often (at most, unless a kill or fork asked sooner) unused fork points are looked for and deleted. */
export const EPHEMERAL_COLLECTION_INTERVAL_MS = 60_000;
/** Sandboxes re-attached at once after a restart (QMP and one agent round trip each; mostly waiting). */
export const REATTACH_CONCURRENCY = 8;
/** meta key: the boot the recorded pids and start times belong to. */
const BOOT_ID_KEY = "boot_id";
/** A lifetime that ended in a pause that failed is tried again this much later (the sandbox keeps running). */
export const TIMEOUT_PAUSE_RETRY_MS = 60_000;
/** Console output kept in the record of a sandbox whose VM ended on its own. */
export const EXIT_CONSOLE_TAIL_BYTES = 2048;

export interface ManagerLog {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

export interface ManagerOptions {
  limits?: Partial<AdmissionLimits>;
  /** Image caches besides FORKD_IMAGE_CACHE whose images v0.5 clients may name by path (`--allow-image-dir`). */
  extraImageDirs?: readonly string[];
  /** Host-wide cap on BRANCHes in flight (`--branch-concurrency`). @default MAX_CONCURRENT_BRANCHES */
  branchConcurrency?: number;
  /** Lifetime of a sandbox whose spawn names none, in ms; 0 = no limit. @default DEFAULT_SANDBOX_TIMEOUT_MS */
  defaultTimeoutMs?: number;
  log?: ManagerLog;
  sweepIntervalMs?: number;
  /** The snapshot default template names resolve to (default: pyagent when it exists). */
  defaultSnapshot?: string;
  /** Bridge, subnet, DNS and the default egress of sandboxes (see SandboxNetworks). */
  network?: Omit<SandboxNetworksOptions, "log">;
  /** How QEMUs are confined (`forkd daemon --confinement`); default: FORKD_CONFINEMENT, else on. */
  confinement?: ConfinementMode;
  /** Cap on each sandbox's writable disk layer unless its spawn names one. @default DEFAULT_DISK_LIMIT_MIB */
  diskLimitMiB?: number;
  /** Console log budget per sandbox, in bytes. @default DEFAULT_CONSOLE_LOG_BYTES */
  consoleLogBytes?: number;
  /**
   * Let the daemon set vm.unprivileged_userfaultfd=1 when a live BRANCH of an unprivileged QEMU needs it
   * (QEMU 7.2 creates its userfaultfd with the plain system call). @default true
   */
  allowUnprivilegedUserfaultfd?: boolean;
  /**
   * Snapshots to keep prestarted QEMUs of (`--warm-pool TAG:N`): spawns of them without a network of their own
   * and without live_fork take those first (see warm-pool.ts).
   */
  warmPools?: readonly WarmPoolTarget[];
}

interface Live {
  handle: SandboxHandle;
  /** Set when a kill started: calls still running then fail as "killed", not as a broken connection. */
  killing: boolean;
  /** Set when a pause started: calls still running then fail as "paused". */
  pausing?: boolean;
}

export class SandboxManager implements SandboxService {
  readonly snapshots: DaemonSnapshots;
  private readonly brancher: Brancher;
  private readonly live = new Map<string, Live>();
  /** Sandboxes found running at start-up and not re-attached yet, each with its re-attach. */
  private readonly reattaching = new Map<string, Promise<void>>();
  private closed = false;
  /** Kills in progress, so a concurrent kill of the same sandbox waits for the first instead of racing it. */
  private readonly killing = new Map<string, Promise<void>>();
  private readonly admission: Admission;
  private readonly defaultTimeoutMs: number;
  private readonly log: ManagerLog;
  private sweeper: NodeJS.Timeout | undefined;
  private readonly metricsSampler = new MetricsSampler();
  private readonly usageSampler = new UsageSampler();
  private collectionRequested = false;
  private lastCollection = 0;
  private readonly portProxy = new PortProxy();
  /** Pause, resume, kill and BRANCH of one sandbox run one at a time. */
  private readonly locks = new KeyedLock();
  /** Sandboxes whose lifetime ended and whose pause or kill is under way (the sweep starts each once). */
  private readonly timingOut = new Set<string>();
  readonly workspaces: Workspaces;
  private readonly diskLimitMiB: number;
  private readonly consoleLogBytes: number;
  private readonly warmPool: WarmPool;
  /** See spawn-request.ts and spawn-children.ts. */
  private readonly spawning: SpawnRequestContext & SpawnContext;

  private constructor(
    private readonly paths: ForkdPaths,
    private readonly db: StateDb,
    private readonly networks: SandboxNetworks,
    /** How this daemon's QEMUs are confined. */
    readonly confinement: ConfinementConfig,
    /** Where sandbox cgroups go (null: none, confinement off or not root). */
    readonly cgroups: CgroupLayout | null,
    private readonly options: ManagerOptions,
  ) {
    this.diskLimitMiB = options.diskLimitMiB ?? DEFAULT_DISK_LIMIT_MIB;
    validateLimitsRequest({ diskLimitMiB: this.diskLimitMiB });
    this.consoleLogBytes = options.consoleLogBytes ?? DEFAULT_CONSOLE_LOG_BYTES;
    if ((options.warmPools?.length ?? 0) > 0 && cgroups !== null) {
      // A pooled QEMU starts before its sandbox exists: it could not be in that sandbox's cgroups.
      throw invalidArgument(
        "--warm-pool needs sandboxes without cgroups (--confinement off): a pooled QEMU starts before its " +
          "sandbox exists, so it cannot be put under that sandbox's cgroups and limits",
      );
    }
    // Pooled VMs count as sandboxes: they hold host memory and a slot until taken or drained.
    this.admission = new Admission(
      { ...DEFAULT_ADMISSION_LIMITS, ...options.limits },
      () => this.live.size + this.warmPool.count(),
    );
    this.warmPool = new WarmPool(paths, {
      admit: () =>
        this.admission.reserveMemory(this.admission.limits.perSandboxEstimateMiB, "a warm pool VM"),
      log: options.log,
      confinement,
    });
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS;
    if (!isIntIn(this.defaultTimeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(
        `the default sandbox timeout must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS} ms`,
      );
    }
    this.log = options.log ?? { info: () => {}, warn: () => {} };
    this.snapshots = new DaemonSnapshots(paths, db, (tag) => this.usersOf(tag), {
      confinement,
      beforeDelete: (tag) => this.warmPool.drain(tag),
      defaultSnapshot: options.defaultSnapshot,
      imageDirs: [paths.images, ...(options.extraImageDirs ?? [])],
    });
    this.brancher = new Brancher(
      this.snapshots.store,
      db,
      {
        blocked: (sandboxId, reason) => this.db.updateSandbox(sandboxId, { branch_blocked: reason }),
        unblocked: (sandboxId) => this.db.updateSandbox(sandboxId, { branch_blocked: null }),
        branched: (sandboxId, tag) => {
          const current = this.db.sandbox(sandboxId);
          if (!current) return;
          const layers = [...(JSON.parse(current.layer_tags) as string[]), tag];
          // Its pause layers are now under the branch's: part of a chain others depend on, no longer its own.
          this.db.updateSandbox(sandboxId, {
            last_branch_tag: tag,
            layer_tags: JSON.stringify(layers),
            branch_blocked: null,
            pause_tags: "[]",
          });
        },
      },
      options.branchConcurrency,
    );
    this.workspaces = new Workspaces(db, this, paths.snapshots);
    this.spawning = this.spawnContext();
  }

  /** What a spawn uses of the manager: its collaborators and settings, and where a started child goes. */
  private spawnContext(): SpawnRequestContext & SpawnContext {
    return {
      paths: this.paths,
      db: this.db,
      snapshots: this.snapshots,
      networks: this.networks,
      admission: this.admission,
      cgroups: this.cgroups,
      confinement: this.confinement,
      defaultTimeoutMs: this.defaultTimeoutMs,
      diskLimitMiB: this.diskLimitMiB,
      consoleLogBytes: this.consoleLogBytes,
      log: this.log,
      adopt: (sandbox) => {
        this.live.set(sandbox.id, { handle: sandbox, killing: false });
        this.watchExit(sandbox);
      },
      info: (row) => this.info(row),
    };
  }

  /** Opens the manager: reconciles the database with the processes that are actually running. */
  static async open(paths: ForkdPaths, db: StateDb, options: ManagerOptions = {}): Promise<SandboxManager> {
    const confinement = await resolveConfinement(options.confinement);
    let cgroups: CgroupLayout | null = null;
    if (confinement.cgroups) {
      cgroups = await detectCgroupLayout(homeKey(paths.home));
      await prepareCgroupParents(cgroups);
      for (const [controller, why] of Object.entries(cgroups.missing)) {
        // Never silent: spawns get no default limit of this kind and asking for one is refused (501).
        options.log?.warn({ controller, why }, "cgroup controller unavailable: its per-sandbox limit is off");
      }
    }
    const networks = await SandboxNetworks.open(paths, db, { ...options.network, log: options.log });
    let manager: SandboxManager;
    try {
      manager = new SandboxManager(paths, db, networks, confinement, cgroups, options);
    } catch (err) {
      // Refused options (a warm pool on a daemon with cgroups, a bad default): nothing may stay open.
      await networks.close();
      throw err;
    }
    manager.log.info({ confinement: confinement.summary }, "sandbox confinement");
    await manager.snapshots.reconcile();
    await manager.reconcile();
    for (const target of options.warmPools ?? []) manager.warmPool.warm(target.tag, target.size);
    const interval = options.sweepIntervalMs ?? SWEEP_INTERVAL_MS;
    manager.sweeper = setInterval(() => {
      manager.sweep().catch((err) => manager.log.warn({ err: errorMessage(err) }, "sweep failed"));
    }, interval);
    manager.sweeper.unref();
    return manager;
  }

  // ---- spawn ----

  /** All or nothing: every child ready, or none left behind. */
  async spawn(request: SpawnRequest): Promise<SandboxInfo[]> {
    const children = await this.spawnChildren(request, "all-or-nothing");
    return children.map((child) => child.sandbox as SandboxInfo);
  }

  /** Restores `request.n` children under `policy` (see SpawnPolicy): spawn-request.ts, then spawn-children.ts. */
  private async spawnChildren(
    request: SpawnRequest,
    policy: SpawnPolicy,
    /** The daemon's own call that needs these sandboxes only while it runs (see StateDb.markTransientSandbox). */
    transientFor?: string,
  ): Promise<ForkChild[]> {
    const spawn = await resolveSpawn(this.spawning, request);
    // Taken synchronously, before the first await below, so concurrent spawns never share one.
    const pooled = spawn.poolable ? this.warmPool.take(spawn.tag, spawn.n) : undefined;
    const pooledIds = (pooled?.children ?? []).map((child) => child.id);
    const rows = spawnRows(spawn, pooledIds, { runDir: this.paths.run, cgroups: this.cgroups });
    return startChildren(this.spawning, spawn, rows, { policy, pooled, transientFor });
  }

  /** See SandboxService.fork. */
  async fork(
    id: string,
    request: { count: number; timeoutMs?: number; signal?: AbortSignal },
  ): Promise<ForkOutcome> {
    const count = validateChildCount(request.count);
    const row = this.row(id);
    // A paused sandbox forks from its paused state (no VM to capture).
    const paused = row.status === "paused";
    if (!paused) this.liveOrThrow(id);
    // Refused before anything is attempted when the host cannot take that many more (the children's own spawn
    // reserves them again when it starts).
    this.admission.reserveSpawn(count).release();
    const branched = await this.branch(id, {
      tag: `fork-${randomBytes(6).toString("hex")}`,
      mode: row.live_fork === 1 && !paused ? "live" : "diff",
      signal: request.signal,
    });
    this.snapshots.markEphemeral(branched.tag, `fork of ${id}`);
    const children = await this.spawnChildren(
      {
        snapshotTag: branched.tag,
        n: count,
        timeoutMs: request.timeoutMs,
        metadata: parseStringMap(row.metadata),
        env: parseStringMap(row.env_vars),
        templateAlias: row.template_alias ?? undefined,
        // Forks keep the source's egress policy (as it is now) and inbound settings: a fork is never less
        // confined than what it was forked from.
        network: this.networkOf(row),
        inbound: parseInbound(row.inbound),
        owner: row.owner,
        signal: request.signal,
      },
      "each",
    );
    this.requestCollection();
    return { tag: branched.tag, mode: branched.mode, pause_ms: branched.pause_ms, children };
  }

  // ---- queries ----

  list(filter: { snapshotTag?: string; status?: SandboxStatus } = {}): SandboxInfo[] {
    return this.db
      .sandboxes()
      .filter((r) => filter.snapshotTag === undefined || r.snapshot_tag === filter.snapshotTag)
      .filter((r) => filter.status === undefined || r.status === filter.status)
      .map((r) => this.info(r));
  }

  get(id: string): SandboxInfo {
    return this.info(this.row(id));
  }

  /** Live sandbox handles (for benchmarks and metrics). */
  handles(): SandboxHandle[] {
    return [...this.live.values()].map((l) => l.handle);
  }

  // ---- lifecycle ----

  /** Kills `id`. Of concurrent kills of one sandbox, one succeeds; the others wait for it, then get not_found. */
  async kill(id: string): Promise<void> {
    const row = this.row(id);
    const ongoing = this.killing.get(id);
    if (ongoing) {
      await ongoing.catch(() => {});
      throw notFound(`sandbox ${id} not found (it was just killed)`);
    }
    if (row.status === "starting") throw conflict(`sandbox ${id} is still starting; kill it once spawned`);
    // After a pause or resume in progress, whatever state that leaves it in.
    const killing = this.locks.run(id, async () => {
      // A sandbox being re-attached is killed once that is settled (bounded by REATTACH_TIMEOUT_MS).
      await this.reattaching.get(id);
      const current = this.db.sandbox(id);
      if (!current) return;
      await this.destroy(current, "killed");
      this.db.deleteSandbox(id);
      // Its pause layers go now, unless a snapshot depends on them (then once nothing does).
      await this.collectSnapshots();
    });
    this.killing.set(id, killing);
    try {
      await killing;
    } finally {
      this.killing.delete(id);
    }
  }

  async killAll(filter: { snapshotTag?: string } = {}): Promise<string[]> {
    const rows = this.db
      .sandboxes()
      .filter((r) => r.status !== "starting")
      .filter((r) => filter.snapshotTag === undefined || r.snapshot_tag === filter.snapshotTag);
    await Promise.all(rows.map((r) => this.kill(r.id).catch(() => {})));
    return rows.map((r) => r.id);
  }

  // ---- pause and resume ----

  /** See SandboxService.pause; pause-layer.ts writes the layer. */
  async pause(id: string, request: PauseRequest = {}): Promise<PauseOutcome> {
    this.row(id);
    return this.locks.run(id, () => this.pauseNow(id, request));
  }

  private async pauseNow(id: string, request: PauseRequest): Promise<PauseOutcome> {
    // Right after a restart: once its re-attach is settled (bounded by REATTACH_TIMEOUT_MS).
    await this.reattaching.get(id)?.catch(() => {});
    const row = this.row(id);
    if (row.status === "paused") throw conflict(`sandbox ${id} is already paused`);
    const live = this.liveOrThrow(id);
    if (row.branch_blocked) throw conflict(`sandbox ${id} cannot be paused: ${row.branch_blocked}`);
    // A live BRANCH still writing its snapshot: the sandbox's disk already builds on it.
    await this.brancher.settled(id);
    const parentTag = row.last_branch_tag ?? row.snapshot_tag;
    const ramBytes = (await this.snapshots.store.get(parentTag)).manifest.memory.ramBytes;
    // The copy of its private pages is held in memory until written: at most its whole RAM.
    const buffer = this.admission.reserveMemory(ramBytes / 2 ** 20, `a pause of ${id}`);
    const tag = pauseLayerTag(id);
    const freedBytes = await residentBytes(live.handle.pid);
    this.db.updateSandbox(id, { status: "pausing", pending_pause_tag: tag });
    live.pausing = true;
    let layer: Awaited<ReturnType<typeof writePauseLayer>>;
    try {
      layer = await writePauseLayer(
        this.snapshots.store,
        { handle: live.handle, parentTag, ownLayers: JSON.parse(row.pause_tags) as string[] },
        { tag, merge: request.merge, signal: request.signal },
      );
    } catch (err) {
      live.pausing = false;
      // The VM runs again (writePauseLayer continued it), unless it died meanwhile (then it is marked dead).
      if (this.db.sandbox(id)?.status === "pausing") {
        this.db.updateSandbox(id, { status: "running", pending_pause_tag: null });
      }
      throw err;
    } finally {
      buffer.release();
    }
    this.recordPaused(row, layer.tag, layer.replaced);
    crashPoint("pause.recorded");
    await this.stopPausedVm(id, live);
    this.log.info({ id, tag, pause_ms: layer.pause_ms, merged: layer.replaced.length > 0 }, "sandbox paused");
    // Layers merged into this one go now, unless a snapshot depends on them.
    if (layer.replaced.length > 0) await this.collectSnapshots();
    return {
      sandbox: this.get(id),
      tag,
      pause_ms: layer.pause_ms,
      write_ms: layer.write_ms,
      bytes_captured: layer.bytes_captured,
      bytes_stored: layer.pages * 4096,
      merged: layer.replaced.length > 0,
      freed_bytes: freedBytes,
    };
  }

  /**
   * The database's side of a published pause layer, as one step: the sandbox is paused in `tag` (which layers
   * are its own, what its chain is). Also what a restart does for a pause that published its layer and crashed.
   */
  private recordPaused(row: SandboxRow, tag: string, replaced: readonly string[]): void {
    this.snapshots.markEphemeral(tag, `the paused state of ${row.id}`);
    this.db.updateSandbox(row.id, pausedRowUpdate(row, tag, replaced));
  }

  /** The VM of a sandbox whose state is safe in its pause layer goes, and with it its RAM and cgroup. */
  private async stopPausedVm(id: string, live: Live): Promise<void> {
    live.killing = true;
    await live.handle.destroy();
    this.live.delete(id);
    const row = this.db.sandbox(id);
    if (row) {
      await removeCgroups(cgroupDirsOf(row)).catch((e: unknown) =>
        this.log.warn({ id, err: errorMessage(e) }, "could not remove a paused sandbox's cgroups"),
      );
    }
    this.db.updateSandbox(id, { pid: null, pid_start_time: null, cgroup: null });
    this.networks.release(id);
    this.metricsSampler.forget(id);
  }

  /** See SandboxService.resume: restored like a spawn (Sandbox.restore), from its pause layer, under its id. */
  async resume(id: string, request: ResumeRequest = {}): Promise<SandboxInfo> {
    this.row(id);
    if (request.timeoutMs !== undefined && !isIntIn(request.timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    return this.locks.run(id, () => this.resumeNow(id, request));
  }

  private async resumeNow(id: string, request: ResumeRequest): Promise<SandboxInfo> {
    const row = this.row(id);
    if (row.status === "running") throw conflict(`sandbox ${id} is already running`);
    if (row.status !== "paused") throw conflict(`sandbox ${id} is ${row.status}, not paused`);
    const tag = (JSON.parse(row.pause_tags) as string[]).at(-1) ?? row.last_branch_tag;
    if (!tag) throw new ForkdError("internal", `paused sandbox ${id} has no pause layer recorded`);
    const timeoutMs = request.timeoutMs ?? row.timeout_ms ?? 0;
    const reservation = this.admission.reserveSpawn(1);
    let plan: RestorePlan | undefined;
    this.db.updateSandbox(id, { status: "resuming" });
    crashPoint("resume.started");
    try {
      const snapshot = await this.snapshots.bootable(tag);
      plan = await prepareRestore(this.paths, snapshot, {
        inMemory: row.live_fork === 1,
        memoryTag: row.memory_tag ?? row.snapshot_tag,
      });
      const nic = await this.networks.reattach(id, row.network, snapshot.manifest.machine.nic ?? null);
      // The limits it was spawned with, in fresh cgroups (recorded before they are made, as at spawn).
      const limits = parseLimits(row);
      let cgroups: Awaited<ReturnType<typeof createSandboxCgroups>> | undefined;
      if (this.cgroups) {
        this.db.updateSandbox(id, { cgroup: JSON.stringify(sandboxCgroupDirs(this.cgroups, id)) });
        cgroups = await createSandboxCgroups(this.cgroups, id, cgroupLimits(limits));
      }
      const sandbox = await Sandbox.restore(this.paths, plan, {
        id,
        outliveHost: true,
        signal: request.signal,
        nic,
        confinement: this.confinement,
        cgroups,
        diskLimitBytes: limits.disk_mib === null ? undefined : limits.disk_mib * 2 ** 20,
        consoleLogBytes: this.consoleLogBytes,
        onSpawned: async (pid) => {
          await recordSpawned(this.db, id, pid);
          crashPoint("resume.launched");
        },
      });
      crashPoint("resume.restored");
      this.db.updateSandbox(id, {
        status: "running",
        memory_image: sandbox.memoryImage,
        memory_tag: plan.memoryTag === row.snapshot_tag ? null : plan.memoryTag,
        ready_ms: Math.round(sandbox.readyMs * 10) / 10,
        timeout_ms: timeoutMs === 0 ? null : timeoutMs,
        expires_at_unix_ms: timeoutMs === 0 ? null : Date.now() + timeoutMs,
        paused_at_unix_ms: null,
      });
      this.live.set(id, { handle: sandbox, killing: false });
      this.watchExit(sandbox);
    } catch (err) {
      await this.revertResume(id);
      throw err;
    } finally {
      reservation.release();
      await plan?.dispose();
    }
    crashPoint("resume.recorded");
    this.log.info({ id, tag }, "sandbox resumed");
    return this.get(id);
  }

  /** A resume that did not finish leaves the sandbox paused, as before it, with nothing of the attempt left. */
  private async revertResume(id: string): Promise<void> {
    const row = this.db.sandbox(id);
    if (!row) return;
    await settlePaused(this.db, row);
    this.networks.release(id);
  }

  /** Deletes the daemon's own snapshots nothing needs any more (pause layers, fork points) now. */
  private async collectSnapshots(): Promise<void> {
    const deleted = await this.snapshots.collectEphemeral().catch((err: unknown) => {
      this.log.warn({ err: errorMessage(err) }, "could not delete unused snapshots");
      return [] as string[];
    });
    if (deleted.length > 0) this.log.info({ tags: deleted }, "deleted snapshots nothing needs any more");
  }

  setTimeout(id: string, timeoutMs: number): SandboxInfo {
    if (!isIntIn(timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    this.liveOrThrow(id);
    this.db.updateSandbox(id, {
      expires_at_unix_ms: timeoutMs === 0 ? null : Date.now() + timeoutMs,
      timeout_ms: timeoutMs === 0 ? null : timeoutMs,
    });
    return this.get(id);
  }

  extendTimeout(id: string, timeoutMs: number): SandboxInfo {
    if (!isIntIn(timeoutMs, 1, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 1..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    this.liveOrThrow(id);
    const current = this.row(id).expires_at_unix_ms;
    if (current !== null) {
      this.db.updateSandbox(id, { expires_at_unix_ms: Math.max(current, Date.now() + timeoutMs) });
    }
    return this.get(id);
  }

  accessTokens(id: string): AccessTokens {
    const row = this.row(id);
    if (row.access_token !== null && row.traffic_token !== null) {
      return { envd: row.access_token, traffic: row.traffic_token };
    }
    // Sandboxes spawned before the daemon made secrets get theirs on first use.
    const tokens = {
      envd: row.access_token ?? newAccessToken(),
      traffic: row.traffic_token ?? newAccessToken(),
    };
    this.db.updateSandbox(id, { access_token: tokens.envd, traffic_token: tokens.traffic });
    return tokens;
  }

  verifyAccessToken(id: string, kind: keyof AccessTokens, token: string | undefined): boolean {
    if (!isValidSandboxId(id)) return false;
    const row = this.db.sandbox(id);
    if (!row) return false;
    return tokenMatches(token, kind === "envd" ? row.access_token : row.traffic_token);
  }

  envVars(id: string): Record<string, string> {
    return parseStringMap(this.row(id).env_vars);
  }

  async metrics(id: string, options: { signal?: AbortSignal } = {}): Promise<SandboxMetrics> {
    const live = this.liveOrThrow(id);
    const snapshot = await this.snapshots.get(this.row(id).snapshot_tag).catch(() => null);
    return this.metricsSampler.sample(live.handle, {
      vcpus: snapshot?.vcpus ?? 1,
      readGuestFile: (file) => this.files.read(id, file, { maxBytes: 64 * 1024, signal: options.signal }),
    });
  }

  async usage(filter: { ids?: readonly string[] } = {}): Promise<SandboxUsage[]> {
    const wanted = filter.ids === undefined ? undefined : new Set(filter.ids);
    const handles = [...this.live.values()]
      .filter((l) => !l.killing && (wanted === undefined || wanted.has(l.handle.id)))
      .map((l) => l.handle);
    const samples = await Promise.all(handles.map((h) => this.usageSampler.sandbox(h.id, h.pid)));
    return samples.filter((u): u is SandboxUsage => u !== null);
  }

  async host(): Promise<HostStatus> {
    const counts: HostStatus["sandboxes"] = {
      starting: 0,
      running: 0,
      pausing: 0,
      paused: 0,
      resuming: 0,
      stopping: 0,
      dead: 0,
    };
    for (const row of this.db.sandboxes()) counts[row.status]++;
    return this.usageSampler.host(counts);
  }

  // ---- calls into the guest ----

  ping(id: string, options: { signal?: AbortSignal } = {}) {
    return this.call(id, (agent) => agent.ping(options));
  }

  async exec(id: string, argv: string[], options: ExecOptions = {}) {
    if (!Array.isArray(argv) || argv.length === 0)
      throw invalidArgument("args must be a non-empty array of strings");
    const env = layerEnv(this.envVars(id), options.env);
    return this.call(id, (agent) => agent.exec(argv, { ...options, env }));
  }

  async eval(id: string, code: string, options: EvalOptions = {}) {
    const env = layerEnv(this.envVars(id), options.env);
    return this.call(id, (agent) => agent.eval(code, env === undefined ? options : { ...options, env }));
  }

  readonly files: SandboxService["files"] = {
    write: (id, file, data, options = {}) => this.call(id, (agent) => agent.files.write(file, data, options)),
    read: (id, file, options = {}) => this.call(id, (agent) => agent.files.read(file, options)),
    list: (id, file, options = {}) => this.call(id, (agent) => agent.files.list(file, options)),
    stat: (id, file, options = {}) => this.call(id, (agent) => agent.files.stat(file, options)),
    remove: (id, file, options = {}) => this.call(id, (agent) => agent.files.remove(file, options)),
    mkdir: (id, file, options = {}) => this.call(id, (agent) => agent.files.mkdir(file, options)),
    move: (id, source, destination, options = {}) =>
      this.call(id, (agent) => agent.files.move(source, destination, options)),
    watch: (id, file, options = {}) => this.liveOrThrow(id).handle.agent.files.watch(file, options),
  };

  readonly procs: SandboxService["procs"] = {
    start: (id, argv, options = {}) => {
      const env = layerEnv(this.envVars(id), options.env);
      return this.liveOrThrow(id).handle.agent.procs.start(argv, { ...options, env });
    },
    connect: (id, selector, options = {}) =>
      this.liveOrThrow(id).handle.agent.procs.connect(selector, options),
    list: (id, options = {}) => this.call(id, (agent) => agent.procs.list(options)),
    input: (id, selector, data, options = {}) =>
      this.call(id, (agent) => agent.procs.input(selector, data, options)),
    closeStdin: (id, selector, options = {}) =>
      this.call(id, (agent) => agent.procs.closeStdin(selector, options)),
    signal: (id, selector, signal, options = {}) =>
      this.call(id, (agent) => agent.procs.signal(selector, signal, options)),
    resize: (id, selector, size, options = {}) =>
      this.call(id, (agent) => agent.procs.resize(selector, size, options)),
  };

  readonly contexts: SandboxService["contexts"] = {
    create: (id, options = {}) => this.call(id, (agent) => agent.contexts.create(options)),
    list: (id, options = {}) => this.call(id, (agent) => agent.contexts.list(options)),
    restart: (id, context, options = {}) =>
      this.call(id, (agent) => agent.contexts.restart(context, options)),
    remove: (id, context, options = {}) => this.call(id, (agent) => agent.contexts.remove(context, options)),
  };

  /** Stops the sweeper and lets go of the agents. VMs keep running: the next daemon re-attaches to them. */
  /** The warm pools' state (metrics, tests). */
  warmPoolStats(): WarmPoolStats[] {
    return this.warmPool.stats();
  }

  async close(): Promise<void> {
    await this.warmPool.close();
    this.closed = true;
    if (this.sweeper) clearInterval(this.sweeper);
    // Re-attaches in flight let go of what they adopt once they see `closed`.
    await this.reattached.catch(() => {});
    for (const { handle } of this.live.values()) handle.release();
    this.live.clear();
    this.portProxy.close();
    await this.networks.close();
  }

  /** Kills every sandbox (tests, `forkd daemon --kill-on-exit`). */
  async closeAndKill(): Promise<void> {
    await this.warmPool.close();
    if (this.sweeper) clearInterval(this.sweeper);
    await this.killAll();
    this.portProxy.close();
    await this.networks.close();
  }

  // ---- confinement ----

  confinementStatus(): ConfinementStatus {
    const version = (c: "memory" | "cpu" | "pids") => {
      const h = this.cgroups?.hierarchies[c];
      return h ? (`v${h.version}` as const) : null;
    };
    return {
      mode: this.confinement.mode,
      summary: this.confinement.summary,
      uid_base: this.confinement.uids?.base ?? null,
      seccomp: this.confinement.seccomp,
      cgroups: { memory: version("memory"), cpu: version("cpu"), pids: version("pids") },
      default_disk_limit_mib: this.confinement.mode === "on" ? this.diskLimitMiB : null,
      console_log_bytes: this.consoleLogBytes,
    };
  }

  // ---- network ----

  /** How this daemon networks its sandboxes (for status and doctor). */
  networkStatus(): NetworkStatus {
    const { config } = this.networks;
    return {
      mode: this.networks.mode,
      reason: this.networks.reason,
      bridge: this.networks.mode === "netns" ? config.bridge : null,
      subnet: this.networks.mode === "netns" ? `${config.subnet.address}/${config.subnet.prefix}` : null,
      dns: this.networks.mode === "netns" ? `${config.bridgeAddress}:${config.dnsPort}` : null,
      dns_upstreams: config.dnsUpstreams.map((u) => `${u.address}:${u.port}`),
      default_egress: this.networks.mode === "netns" ? this.networks.defaultEgress : "deny",
    };
  }

  /** Replaces sandbox `id`'s egress policy while it runs. */
  async setNetworkPolicy(id: string, policy: EgressPolicyInput): Promise<SandboxInfo> {
    this.liveOrThrow(id);
    await this.networks.setPolicy(id, policy, await this.templateEgressFor(this.row(id).snapshot_tag));
    return this.get(id);
  }

  /** The egress default of snapshot `tag`'s template (undefined: none, or the snapshot is gone). */
  private async templateEgressFor(tag: string): Promise<EgressPolicy | undefined> {
    const snapshot = await this.snapshots.store.get(tag).catch(() => undefined);
    return snapshot && templateEgressOf(snapshot.manifest);
  }

  /** Proxies one HTTP request (`req.url` is the path in the guest) to TCP port `port` of sandbox `id`. */
  async proxyHttp(
    id: string,
    port: number,
    req: http.IncomingMessage,
    res: http.ServerResponse,
  ): Promise<string | null> {
    return this.portProxy.web(req, res, this.portTarget(id, port));
  }

  /** Proxies a WebSocket (HTTP upgrade) to TCP port `port` of sandbox `id`. */
  proxyUpgrade(id: string, port: number, req: http.IncomingMessage, socket: net.Socket, head: Buffer): void {
    this.portProxy.upgrade(req, socket, head, this.portTarget(id, port));
  }

  private portTarget(id: string, port: number): PortTarget {
    if (!isIntIn(port, 1, 65535)) throw invalidArgument(`port must be an integer in 1..65535, got ${port}`);
    this.liveOrThrow(id);
    const inbound = parseInbound(this.row(id).inbound);
    return {
      ...this.networks.portTarget(id, port),
      tls: inbound.httpsPorts.includes(port),
      hostHeader: hostHeaderFor(inbound, port),
      owner: id,
    };
  }

  /** The network request that gives a new sandbox the network `row`'s sandbox has now. */
  private networkOf(row: SandboxRow): NetworkRequest {
    if (row.network === "none") return undefined;
    const policy = this.networks.info(row.id, true).policy;
    return row.network === "private" || policy === null ? "none" : policy;
  }

  // ---- internals ----

  private async call<T>(id: string, fn: (agent: AgentClient) => Promise<T>): Promise<T> {
    // A call right after a restart waits for its own sandbox's re-attach (at most REATTACH_TIMEOUT_MS), not others'.
    await this.reattaching.get(id)?.catch(() => {});
    const live = this.liveOrThrow(id);
    try {
      return await fn(live.handle.agent);
    } catch (err) {
      if (live.pausing) {
        throw new ForkdError("conflict", `sandbox ${id} was paused while the call was running`, {
          cause: err,
        });
      }
      if (live.killing || !this.live.has(id)) {
        throw new ForkdError("conflict", `sandbox ${id} was killed while the call was running`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  private liveOrThrow(id: string): Live {
    const row = this.row(id);
    const live = this.live.get(id);
    if (live && !live.killing && !live.pausing) return live;
    if (this.reattaching.has(id)) {
      throw new ForkdError(
        "unavailable",
        `sandbox ${id} is re-attaching after a daemon restart; retry in a moment`,
      );
    }
    if (row.status === "dead") throw conflict(`sandbox ${id} is dead: ${row.error ?? "its VM exited"}`);
    if (row.status === "starting") throw conflict(`sandbox ${id} is still starting`);
    if (row.status === "paused") {
      throw new ForkdError(
        "conflict",
        `sandbox ${id} is paused; resume it first (POST /v1/sandboxes/${id}/resume)`,
        {
          detail: { status: "paused" },
        },
      );
    }
    if (row.status === "pausing") throw conflict(`sandbox ${id} is being paused`, { status: "pausing" });
    if (row.status === "resuming") throw conflict(`sandbox ${id} is being resumed`, { status: "resuming" });
    throw conflict(`sandbox ${id} is being stopped`);
  }

  private row(id: string): SandboxRow {
    assertSandboxRef(id);
    const row = isValidSandboxId(id) ? this.db.sandbox(id) : undefined;
    if (!row) throw notFound(`sandbox ${id} not found`);
    return row;
  }

  /** Sandboxes (not dead) that depend on snapshot `tag`: restored from it or from a descendant, or branched into it. */
  private usersOf(tag: string): string[] {
    // A workspace's sandbox that died keeps its layers: resuming the workspace starts again from them.
    const workspaceSandboxes = new Set(this.db.workspaces().map((w) => w.sandbox_id));
    return this.db
      .sandboxes()
      .filter(
        (r) =>
          (r.status !== "dead" || workspaceSandboxes.has(r.id)) &&
          (r.snapshot_tag === tag || (JSON.parse(r.layer_tags) as string[]).includes(tag)),
      )
      .map((r) => r.id);
  }

  // ---- BRANCH ----

  /**
   * `snapshot-diff`: a new layer on top of `from` made by running a command — spawn a sandbox from `from`, run
   * `command` (a non-zero exit or a timeout aborts with its output), BRANCH it in diff mode as `tag`, kill it.
   */
  async snapshotDiff(request: {
    from: string;
    tag: string;
    command: string[];
    timeoutMs?: number;
    owner?: string | null;
    signal?: AbortSignal;
  }): Promise<BranchOutcome & { exit_code: number; stdout: string; stderr: string }> {
    assertTag(request.from, "from");
    assertTag(request.tag);
    if (!Array.isArray(request.command) || request.command.length === 0) {
      throw invalidArgument("exec must be a non-empty command");
    }
    if (await this.snapshots.store.exists(request.tag)) {
      throw conflict(`snapshot ${JSON.stringify(request.tag)} already exists`);
    }
    const timeoutMs = request.timeoutMs ?? SNAPSHOT_DIFF_EXEC_TIMEOUT_MS;
    // Transient: a daemon killed mid-way must not leave it running forever (it has no lifetime) for the restart
    // to re-attach (seen in the fault suite: diff.ran left it running).
    const [child] = await this.spawnChildren(
      { snapshotTag: request.from, n: 1, timeoutMs: 0, owner: request.owner, signal: request.signal },
      "all-or-nothing",
      "snapshot-diff",
    );
    const id = ((child as ForkChild).sandbox as SandboxInfo).id;
    crashPoint("diff.spawned");
    try {
      const ran = await this.exec(id, request.command, { timeoutMs, signal: request.signal });
      const stdout = ran.stdout.toString("utf8");
      const stderr = ran.stderr.toString("utf8");
      if (ran.timedOut || ran.exitCode !== 0) {
        const why = ran.timedOut ? `timed out after ${timeoutMs} ms` : `exited with ${ran.exitCode}`;
        throw new ForkdError(
          "unprocessable",
          `snapshot-diff ${request.tag}: the command ${why}\n${tail(stdout)}${tail(stderr)}`,
          {
            detail: { exit_code: ran.exitCode, stdout, stderr },
          },
        );
      }
      // Page cache and journal are in the captured RAM anyway; sync makes the disk layer self-explanatory.
      await this.exec(id, ["sync"], { timeoutMs: 60_000 });
      crashPoint("diff.ran");
      const outcome = await this.branch(id, { tag: request.tag, mode: "diff", signal: request.signal });
      crashPoint("diff.branched");
      return { ...outcome, exit_code: ran.exitCode, stdout, stderr };
    } finally {
      await this.kill(id).catch(() => {});
    }
  }

  /** Snapshots running sandbox `id` mid-work; it keeps running. See snapshots/branch.ts. */
  async branch(id: string, request: BranchRequest & { alias?: string } = {}): Promise<BranchOutcome> {
    this.row(id);
    if (request.alias !== undefined) assertAlias(request.alias);
    return this.locks.run(id, () => this.branchNow(id, request));
  }

  private async branchNow(id: string, request: BranchRequest & { alias?: string }): Promise<BranchOutcome> {
    const row = this.row(id);
    if (row.status === "paused")
      return this.named(await this.branchPaused(row, request), request.alias, row.owner);
    const live = this.liveOrThrow(id);
    // The mark of a BRANCH this process is running is no obstacle: branches of one source queue behind each other.
    const inFlight = this.brancher.isBranching(id) && interruptedBranchTag(row.branch_blocked) !== null;
    if (row.branch_blocked && !inFlight) {
      throw conflict(`sandbox ${id} cannot be branched again: ${row.branch_blocked}`);
    }
    const { alias, ...branchRequest } = request;
    // The copy of the source's private pages is held in memory: at most its whole RAM.
    const ramBytes = (await this.snapshots.store.get(row.snapshot_tag)).manifest.memory.ramBytes;
    const buffer = this.admission.reserveMemory(ramBytes / 2 ** 20, `a BRANCH of ${id}`);
    let result: Awaited<ReturnType<Brancher["branch"]>>;
    try {
      result = await this.brancher.branch(
        {
          handle: live.handle,
          lastBranchTag: row.last_branch_tag,
          liveFork: row.live_fork === 1,
          owner: row.owner,
          beforeLive: () => this.allowLiveCapture(live.handle),
        },
        branchRequest,
      );
    } finally {
      buffer.release();
    }
    return this.named({ ...result, snapshot: await this.snapshots.get(result.tag) }, alias, row.owner);
  }

  /**
   * Points template alias `alias` (if given) at the branch's snapshot, as the branched sandbox's owner's name
   * (like the snapshot); the one it named before goes once unused.
   */
  private async named(
    outcome: BranchOutcome,
    alias: string | undefined,
    owner: string | null,
  ): Promise<BranchOutcome> {
    if (alias === undefined) return outcome;
    const previous = (await this.snapshots.aliases.list()).find((a) => a.alias === alias)?.tag;
    await this.snapshots.aliases.set(alias, outcome.tag, owner);
    // The name moved on: its earlier snapshot goes once nothing else needs it.
    if (previous !== undefined && previous !== outcome.tag) {
      this.snapshots.markEphemeral(previous, `superseded as ${alias}`);
      this.requestCollection();
    }
    return { ...outcome, snapshot: await this.snapshots.get(outcome.tag) };
  }

  /** A BRANCH of a paused sandbox: a snapshot of its paused state (paused-branch.ts), no VM involved. */
  private async branchPaused(row: SandboxRow, request: BranchRequest): Promise<BranchOutcome> {
    const pauseTag = (JSON.parse(row.pause_tags) as string[]).at(-1) ?? row.last_branch_tag;
    if (!pauseTag) throw new ForkdError("internal", `paused sandbox ${row.id} has no pause layer recorded`);
    const result = await branchPausedState(this.paths, this.db, {
      sandboxId: row.id,
      pauseTag,
      tag: request.tag,
      mode: request.mode,
      parentTag: request.parentTag,
      signal: request.signal,
      owner: row.owner,
    });
    return { ...result, snapshot: await this.snapshots.get(result.tag) };
  }

  /** A live BRANCH of a confined QEMU needs the host to let it create its userfaultfd (isolation/userfaultfd.ts). */
  private async allowLiveCapture(handle: SandboxHandle): Promise<void> {
    if (handle.vmOwner === null) return;
    if (this.options.allowUnprivilegedUserfaultfd === false) {
      throw new ForkdError(
        "not_implemented",
        `a live BRANCH of ${handle.id} needs vm.unprivileged_userfaultfd=1 for its unprivileged QEMU, which this ` +
          "daemon was told not to set (--no-unprivileged-userfaultfd); use mode diff",
      );
    }
    if (await allowUnprivilegedUserfaultfd()) {
      this.log.warn(
        { sysctl: "vm.unprivileged_userfaultfd=1" },
        "enabled unprivileged userfaultfd for live BRANCH of confined QEMUs (see docs/security.md)",
      );
    }
  }

  /** The last `maxBytes` of sandbox `id`'s serial console (bounded per sandbox; see vmm/console-log.ts). */
  async console(id: string, maxBytes = CONSOLE_READ_BYTES): Promise<string> {
    const row = this.row(id);
    if (!isIntIn(maxBytes, 1, MAX_CONSOLE_READ_BYTES)) {
      throw invalidArgument(`bytes must be an integer in 1..${MAX_CONSOLE_READ_BYTES}`);
    }
    if (row.status === "dead") return "";
    const live = this.live.get(id);
    const data = live
      ? await live.handle.console.tail(maxBytes)
      : await readTail(path.join(row.run_dir, RUN_FILES.console), maxBytes).catch(() => Buffer.alloc(0));
    return printableConsole(data);
  }

  private info(row: SandboxRow): SandboxInfo {
    return {
      id: row.id,
      snapshot_tag: row.snapshot_tag,
      created_at_unix: row.created_at_unix,
      pid: row.pid,
      memory_limit_mib: row.memory_limit_mib,
      status: row.status,
      expires_at_unix_ms: row.expires_at_unix_ms,
      timeout_ms: row.timeout_ms,
      on_timeout: row.on_timeout,
      auto_resume: row.auto_resume === 1,
      pause_tag: (JSON.parse(row.pause_tags) as string[]).at(-1) ?? null,
      paused_at_unix_ms: row.paused_at_unix_ms,
      ready_ms: row.ready_ms,
      accelerator: row.accelerator,
      live_fork: row.live_fork === 1,
      branch_count: branchCount(row),
      last_branch_tag: row.last_branch_tag,
      last_branch_memory_path: this.branchMemoryPath(row.last_branch_tag),
      metadata: parseStringMap(row.metadata),
      template_alias: row.template_alias,
      inbound: parseInbound(row.inbound),
      owner: row.owner,
      limits: parseLimits(row),
      network:
        row.status === "dead"
          ? { kind: row.network, netns: null, address: null, guestAddress: null, policy: null }
          : this.networks.info(row.id, row.network !== "none"),
    };
  }

  private branchMemoryPath(tag: string | null): string | null {
    if (tag === null) return null;
    const dir = this.snapshots.store.dirOf(tag);
    const flat = path.join(dir, SNAPSHOT_FILES.memory);
    return existsSync(flat) ? flat : path.join(dir, SNAPSHOT_FILES.memoryLayer);
  }

  branchLoad(): { inFlight: number; cap: number } {
    return { inFlight: this.brancher.inFlight, cap: this.brancher.concurrencyCap };
  }

  /** Kills the VM (ours or adopted, or a stray found by its run directory) and removes its leftovers. */
  private async destroy(row: SandboxRow, reason: string): Promise<void> {
    const live = this.live.get(row.id);
    if (live) {
      live.killing = true;
      this.db.updateSandbox(row.id, { status: "stopping" });
      await live.handle.destroy();
      this.live.delete(row.id);
    } else {
      for (const identity of await processesMentioning(row.run_dir)) await killAndWait(identity);
      await rm(row.run_dir, { recursive: true, force: true });
    }
    await removeCgroups(cgroupDirsOf(row)).catch((e: unknown) =>
      this.log.warn({ id: row.id, err: errorMessage(e) }, "could not remove a sandbox's cgroups"),
    );
    this.metricsSampler.forget(row.id);
    this.usageSampler.forget(row.id);
    this.requestCollection();
    // Before its namespace goes: a tunnel to a guest that no longer exists would never finish closing.
    this.portProxy.closeTunnels(row.id);
    await this.networks.detach(row.id);
    this.log.info({ id: row.id, reason }, "sandbox stopped");
  }

  private async markDead(row: SandboxRow, error: string): Promise<void> {
    await this.destroy(row, error);
    this.db.updateSandbox(row.id, { status: "dead", error, pid: null, cgroup: null });
  }

  private watchExit(sandbox: Sandbox): void {
    sandbox.vm.exited.then(async (exit) => {
      const live = this.live.get(sandbox.id);
      if (!live || live.killing) return;
      const row = this.db.sandbox(sandbox.id);
      if (row) await this.markDead(row, await this.whyItExited(row, `its VM ${describeExit(exit)}`));
    });
  }

  /**
   * Why a sandbox's VM ended on its own, for its record: the OOM killer at its memory limit if that was it,
   * and the last lines of its console (a guest panic's message), read before its run directory goes.
   */
  private async whyItExited(row: SandboxRow, what: string): Promise<string> {
    const oom = this.cgroups ? await readOomKills(this.cgroups, row.id).catch(() => 0) : 0;
    const limits = parseLimits(row);
    const cause =
      oom > 0
        ? `${what}: killed by the kernel's OOM killer at its memory limit (${limits.memory_mib} MiB)`
        : what;
    const console = printableConsole(
      await readTail(path.join(row.run_dir, RUN_FILES.console), EXIT_CONSOLE_TAIL_BYTES).catch(() =>
        Buffer.alloc(0),
      ),
    ).trim();
    return console ? `${cause}\n--- guest console (last lines) ---\n${console}` : cause;
  }

  /**
   * Start-up: sandboxes whose VM is gone are marked dead at once; the survivors are re-attached in the background,
   * several at a time with a short deadline each (REATTACH_TIMEOUT_MS), so the API serves meanwhile and one
   * unresponsive guest delays nobody: a call to a sandbox waits only for that sandbox's re-attach, and what cannot
   * wait (setTimeout, branch) answers 503 "re-attaching".
   */
  private async reconcile(): Promise<void> {
    await this.sweepRunDir();
    // Start times count from boot: recorded ones belong to the boot the database last saw (unknown = this one).
    const recordedBoot = this.db.meta(BOOT_ID_KEY) ?? currentBootId();
    const paused = new Set<string>();
    const survivors: { row: SandboxRow; identity: ProcessIdentity }[] = [];
    for (const row of this.db.sandboxes()) {
      if (row.status === "dead") continue;
      const owner = this.db.transientSandboxOwner(row.id);
      if (owner !== undefined) {
        await this.destroy(row, `its ${owner} ended with the daemon`);
        this.db.deleteSandbox(row.id);
        continue;
      }
      const identity = recordedIdentity(row.pid, row.pid_start_time, recordedBoot);
      const alive = identity !== null && (await isOurProcess(identity, row.run_dir));
      if (row.status === "pausing") {
        if (await this.finishPublishedPause(row)) {
          paused.add(row.id);
          continue;
        }
        // Its layer was never published: the VM was only stopped, and runs on (continued once adopted).
        this.db.updateSandbox(row.id, { status: "running", pending_pause_tag: null });
        row.status = "running";
      }
      // A resume that did not finish is undone: the sandbox is paused, as it was before.
      if (row.status === "paused" || row.status === "resuming") {
        await settlePaused(this.db, row);
        paused.add(row.id);
        continue;
      }
      if (row.status !== "running" || !alive || identity === null) {
        const why =
          row.status === "starting"
            ? "the daemon stopped while it was being spawned"
            : "its VM was gone after a daemon restart";
        await this.markDead(row, why);
        continue;
      }
      survivors.push({ row, identity });
    }
    // Networks of sandboxes that did not survive were removed by markDead; this catches records without one.
    // Paused sandboxes keep theirs (a host reboot removed the namespace: resume makes it again).
    const survivorIds = new Set(survivors.map((s) => s.row.id));
    await this.networks.reconcile(survivorIds, paused);
    if (this.cgroups) {
      const busy = await sweepCgroups(this.cgroups, survivorIds);
      if (busy.length > 0)
        this.log.warn({ cgroups: busy }, "cgroups of no known sandbox still hold processes");
    }
    this.db.setMeta(BOOT_ID_KEY, currentBootId());
    this.reattached = this.reattachAll(survivors);
  }

  /** Resolves once every sandbox found running at start-up is re-attached or marked dead (tests, shutdown). */
  reattached: Promise<void> = Promise.resolve();

  private async reattachAll(survivors: { row: SandboxRow; identity: ProcessIdentity }[]): Promise<void> {
    const done = new Map<string, () => void>();
    for (const { row } of survivors) {
      this.reattaching.set(row.id, new Promise<void>((resolve) => done.set(row.id, resolve)));
    }
    let next = 0;
    const worker = async () => {
      while (next < survivors.length) {
        const { row, identity } = survivors[next++] as (typeof survivors)[number];
        try {
          await this.reattach(row, identity);
        } finally {
          this.reattaching.delete(row.id);
          done.get(row.id)?.();
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(REATTACH_CONCURRENCY, survivors.length) }, worker));
  }

  private async reattach(row: SandboxRow, identity: ProcessIdentity): Promise<void> {
    try {
      if (row.memory_image === null) throw new ForkdError("internal", "no memory image recorded");
      const handle = await AdoptedSandbox.adopt(
        { ...row, identity, memory_image: row.memory_image },
        { callTimeoutMs: CHILD_READY_TIMEOUT_MS[row.accelerator], consoleLogBytes: this.consoleLogBytes },
      );
      if (!this.db.sandbox(row.id) || this.closed) {
        // Killed (or the manager closed) while it was being re-attached.
        if (this.closed) handle.release();
        else await handle.destroy();
        return;
      }
      this.live.set(row.id, { handle, killing: false });
      await this.settleInterruptedBranch(row);
      this.log.info({ id: row.id, pid: row.pid }, "re-attached sandbox");
    } catch (err) {
      const current = this.db.sandbox(row.id);
      if (current)
        await this.markDead(current, `could not re-attach after a daemon restart: ${errorMessage(err)}`);
    }
  }

  /**
   * A BRANCH marks its source before the disk switch (BRANCH_INTERRUPTED); a daemon that died after the switch
   * leaves the mark, and the source's disk chain then runs through a layer no snapshot owns unless the snapshot
   * was committed after all. Committed: the mark goes; not: it stays, and the source cannot be branched again.
   */
  private async settleInterruptedBranch(row: SandboxRow): Promise<void> {
    const tag = interruptedBranchTag(row.branch_blocked);
    if (tag === null) return;
    const committed = await this.snapshots.store.get(tag).then(
      () => true,
      () => false,
    );
    if (committed) this.db.updateSandbox(row.id, { branch_blocked: null });
  }

  /**
   * A pause whose layer was published before the daemon died completes: the database records it, the stopped VM
   * goes (it shares its disk file with the layer, so it must never run again). False when nothing was published.
   */
  private async finishPublishedPause(row: SandboxRow): Promise<boolean> {
    const tag = row.pending_pause_tag;
    if (tag === null || !(await this.snapshots.store.exists(tag))) return false;
    const layer = await this.snapshots.store.get(tag);
    const own = JSON.parse(row.pause_tags) as string[];
    const merged = own.length > 0 && layer.manifest.parent?.tag !== own.at(-1);
    this.recordPaused(row, tag, merged ? own : []);
    await settlePaused(this.db, row);
    this.log.info({ id: row.id, tag }, "finished a pause the previous daemon had published");
    return true;
  }

  /**
   * Removes what dead processes left in the run directory: overlay templates of spawns that never finished,
   * and directories of VMs no record knows about (their processes are killed first).
   */
  private async sweepRunDir(): Promise<void> {
    const known = new Set(this.db.sandboxes().map((r) => path.basename(r.run_dir)));
    const templates = path.join(this.paths.run, ".templates");
    for (const name of await readdir(templates).catch(() => [] as string[])) {
      const owner = new RegExp(`-${OWNER_TOKEN_PATTERN}-[0-9a-f]+\\.qcow2$`).exec(name);
      const token = owner ? `${owner[1]}.${owner[2]}.${owner[3]}` : null;
      if (token === null || !(await ownerTokenAlive(token))) {
        await rm(path.join(templates, name), { force: true });
      }
    }
    await rmdir(templates).catch(() => {});
    for (const name of await readdir(this.paths.run).catch(() => [] as string[])) {
      if (known.has(name) || name.startsWith(".")) continue;
      const dir = path.join(this.paths.run, name);
      // A parent being snapshotted by a CLI process also lives here; leave directories whose VM still runs.
      if ((await processesMentioning(dir)).length > 0) continue;
      await rm(dir, { recursive: true, force: true });
    }
  }

  private async sweep(): Promise<void> {
    const now = Date.now();
    for (const row of this.db.sandboxes()) {
      if (row.status !== "running") continue;
      if (row.expires_at_unix_ms !== null && row.expires_at_unix_ms <= now) {
        this.endLifetime(row);
        continue;
      }
      const live = this.live.get(row.id);
      // Not our child, so no exit event: its identity (a zombie or a reused pid is not it) says whether it lives.
      if (live?.handle instanceof AdoptedSandbox && !(await isAlive(live.handle.identity))) {
        await this.markDead(row, await this.whyItExited(row, "its VM exited"));
      }
    }
    if (this.collectionRequested || now - this.lastCollection > EPHEMERAL_COLLECTION_INTERVAL_MS) {
      this.collectionRequested = false;
      this.lastCollection = now;
      const deleted = await this.snapshots.collectEphemeral();
      if (deleted.length > 0) this.log.info({ tags: deleted }, "deleted snapshots nothing needs any more");
    }
  }

  /**
   * A lifetime ran out: the sandbox is paused or killed (its `on_timeout`), in the background, once. A pause that
   * fails leaves it running and is tried again TIMEOUT_PAUSE_RETRY_MS later: a timeout never loses its state.
   */
  private endLifetime(row: SandboxRow): void {
    if (this.timingOut.has(row.id)) return;
    this.timingOut.add(row.id);
    const stillExpired = () => {
      const current = this.db.sandbox(row.id);
      return current?.status === "running" && (current.expires_at_unix_ms ?? Infinity) <= Date.now()
        ? current
        : undefined;
    };
    (async () => {
      if (row.on_timeout === "pause") {
        try {
          await this.locks.run(row.id, async () => {
            if (stillExpired()) await this.pauseNow(row.id, {});
          });
          this.log.info({ id: row.id }, "lifetime ended: paused");
        } catch (err) {
          if (this.db.sandbox(row.id)?.status === "running") {
            this.db.updateSandbox(row.id, { expires_at_unix_ms: Date.now() + TIMEOUT_PAUSE_RETRY_MS });
          }
          this.log.warn({ id: row.id, err: errorMessage(err) }, "lifetime ended, but the pause failed");
        }
        return;
      }
      await this.locks.run(row.id, async () => {
        const current = stillExpired();
        if (!current) return;
        await this.destroy(current, "lifetime expired");
        this.db.deleteSandbox(row.id);
      });
      await this.collectSnapshots();
    })()
      .catch((err: unknown) => this.log.warn({ id: row.id, err: errorMessage(err) }, "lifetime end failed"))
      .finally(() => this.timingOut.delete(row.id));
  }

  /** Asks the next sweep to delete the daemon's own snapshots that nothing needs any more. */
  private requestCollection(): void {
    this.collectionRequested = true;
  }
}

/**
 * Branches taken of a sandbox: `layer_tags` is the chain it was restored from (ending with its snapshot) followed
 * by one tag per branch taken of it.
 */
function branchCount(row: SandboxRow): number {
  const layers = JSON.parse(row.layer_tags) as string[];
  const restoredAt = layers.lastIndexOf(row.snapshot_tag);
  if (restoredAt < 0) return 0;
  // Its pause layers are not branches (pause-layer.ts names them pause-<id>-...).
  return layers.slice(restoredAt + 1).filter((t) => !t.startsWith(`pause-${row.id}-`)).length;
}

/** The last few KiB of a command's output, for an error message. */
function tail(text: string): string {
  const t = text.length > 4096 ? `…${text.slice(-4096)}` : text;
  return t && !t.endsWith("\n") ? `${t}\n` : t;
}

/**
 * Opens everything the daemon serves: state database, snapshots, sandboxes (re-attaching survivors). Holds the
 * home's lock until closed: a second daemon on the same FORKD_HOME is refused (conflict).
 */
export async function openServices(paths: ForkdPaths, options: ManagerOptions = {}) {
  const lock = await lockHome(paths.home);
  let db: StateDb | undefined;
  try {
    db = new StateDb(path.join(paths.home, "state.db"));
    const sandboxes = await SandboxManager.open(paths, db, options);
    const opened = db;
    return {
      sandboxes,
      snapshots: sandboxes.snapshots,
      close: async (opts: { killSandboxes?: boolean } = {}) => {
        if (opts.killSandboxes) await sandboxes.closeAndKill();
        else await sandboxes.close();
        opened.close();
        await lock.release();
      },
    };
  } catch (err) {
    db?.close();
    await lock.release();
    throw err;
  }
}
