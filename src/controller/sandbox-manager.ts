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
import type { AgentClient } from "../agent/host/client.js";
import type { EvalOptions, ExecOptions } from "../agent/host/types.js";
import { conflict, errorMessage, ForkdError, invalidArgument, notFound } from "../common/errors.js";
import { lockHome } from "../common/home-lock.js";
import { assertSandboxRef, assertTag, isValidSandboxId } from "../common/names.js";
import type { ForkdPaths } from "../common/paths.js";
import {
  currentBootId,
  isAlive,
  OWNER_TOKEN_PATTERN,
  ownerTokenAlive,
  type ProcessIdentity,
} from "../common/processes.js";
import {
  detectMemoryCgroupRoot,
  limitMemory,
  type MemoryCgroupRoot,
  removeCgroup,
} from "../isolation/cgroup.js";
import type { EgressPolicyInput } from "../net/policy.js";
import { PortProxy, type PortTarget } from "../net/port-proxy.js";
import { type SandboxRow, StateDb } from "../store/db.js";
import type { SnapshotManifest } from "../store/manifest.js";
import { Admission, type AdmissionLimits, DEFAULT_ADMISSION_LIMITS } from "./admission.js";
import { AdoptedSandbox } from "./adopted-sandbox.js";
import { Brancher, type BranchRequest, interruptedBranchTag } from "./branch.js";
import { DEFAULT_FORK_CONCURRENCY, validateChildCount } from "./fork.js";
import {
  isOurProcess,
  killAndWait,
  processesMentioning,
  processStartTime,
  recordedIdentity,
} from "./host-processes.js";
import { newSandboxId } from "./ids.js";
import { SNAPSHOT_FILES } from "./machine.js";
import { MetricsSampler } from "./metrics-sampler.js";
import { prepareRestore, type RestorePlan } from "./restore-plan.js";
import { CHILD_READY_TIMEOUT_MS, Sandbox, type SandboxHandle } from "./sandbox.js";
import { type NetworkRequest, SandboxNetworks, type SandboxNetworksOptions } from "./sandbox-network.js";
import type {
  AccessTokens,
  BranchOutcome,
  ForkChild,
  ForkOutcome,
  NetworkStatus,
  SandboxInfo,
  SandboxMetrics,
  SandboxService,
  SpawnRequest,
} from "./sandbox-service.js";
import {
  hostHeaderFor,
  layerEnv,
  newAccessToken,
  parseInbound,
  parseStringMap,
  tokenMatches,
  validateEnvVars,
  validateInbound,
  validateMetadata,
} from "./sandbox-settings.js";
import { DaemonSnapshots } from "./snapshot-service.js";
import { assertAlias } from "./template-aliases.js";
import { discardPrestarted, WarmPool, type WarmPoolStats, type WarmPoolTarget } from "./warm-pool.js";

/**
 * Lifetime of a sandbox spawned without one: none (it lives until killed), as in forkd v0.5. A daemon may set one
 * (`forkd daemon --default-timeout-ms`); callers that want E2B's five minutes ask for them (the SDKs do).
 */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 0;
export const MAX_SANDBOX_TIMEOUT_MS = 7 * 24 * 3_600_000;
export const MIN_MEMORY_LIMIT_MIB = 64;
export const MAX_MEMORY_LIMIT_MIB = 1024 * 1024;
/** Default limit for the command of a snapshot-diff (package installs under TCG take minutes). */
export const SNAPSHOT_DIFF_EXEC_TIMEOUT_MS = 30 * 60_000;

/** How often lifetimes are enforced and dead VMs noticed. */
export const SWEEP_INTERVAL_MS = 1000;
/** How often (at most, unless a kill or fork asked sooner) unused fork points are looked for and deleted. */
export const EPHEMERAL_COLLECTION_INTERVAL_MS = 60_000;
/** Children restored at once within one spawn request (see DEFAULT_FORK_CONCURRENCY for why one per core). */
export const SPAWN_CONCURRENCY = DEFAULT_FORK_CONCURRENCY;
/** Sandboxes re-attached at once after a restart (QMP and one agent round trip each; mostly waiting). */
export const REATTACH_CONCURRENCY = 8;
/** meta key: the boot the recorded pids and start times belong to. */
const BOOT_ID_KEY = "boot_id";
/** Sandbox networks created at once within one spawn request. */
export const NETWORK_SETUP_CONCURRENCY = 8;

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
  private collectionRequested = false;
  private lastCollection = 0;
  private cgroupRoot: Promise<MemoryCgroupRoot | null> | undefined;
  private readonly portProxy = new PortProxy();
  private readonly warmPool: WarmPool;

  private constructor(
    private readonly paths: ForkdPaths,
    private readonly db: StateDb,
    private readonly networks: SandboxNetworks,
    options: ManagerOptions,
  ) {
    // Pooled VMs count as sandboxes: they hold host memory and a slot until taken or drained.
    this.admission = new Admission(
      { ...DEFAULT_ADMISSION_LIMITS, ...options.limits },
      () => this.live.size + this.warmPool.count(),
    );
    this.warmPool = new WarmPool(paths, {
      admit: () =>
        this.admission.reserveMemory(this.admission.limits.perSandboxEstimateMiB, "a warm pool VM"),
      log: options.log,
    });
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS;
    if (!isIntIn(this.defaultTimeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(
        `the default sandbox timeout must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS} ms`,
      );
    }
    this.log = options.log ?? { info: () => {}, warn: () => {} };
    this.snapshots = new DaemonSnapshots(paths, db, (tag) => this.usersOf(tag), {
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
          this.db.updateSandbox(sandboxId, {
            last_branch_tag: tag,
            layer_tags: JSON.stringify(layers),
            branch_blocked: null,
          });
        },
      },
      options.branchConcurrency,
    );
  }

  /** Opens the manager: reconciles the database with the processes that are actually running. */
  static async open(paths: ForkdPaths, db: StateDb, options: ManagerOptions = {}): Promise<SandboxManager> {
    const networks = await SandboxNetworks.open(paths, db, { ...options.network, log: options.log });
    const manager = new SandboxManager(paths, db, networks, options);
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

  /**
   * Restores `request.n` children. "all-or-nothing": the first failure destroys the others and is thrown.
   * "each": every child succeeds or fails on its own (a failed one leaves nothing behind).
   */
  private async spawnChildren(
    request: SpawnRequest,
    policy: "all-or-nothing" | "each",
  ): Promise<ForkChild[]> {
    const tag = assertTag(request.snapshotTag, "snapshot_tag");
    const n = validateChildCount(request.n);
    const memoryLimit = request.memoryLimitMiB ?? null;
    if (memoryLimit !== null && !isIntIn(memoryLimit, MIN_MEMORY_LIMIT_MIB, MAX_MEMORY_LIMIT_MIB)) {
      throw invalidArgument(
        `memory_limit_mib must be an integer in ${MIN_MEMORY_LIMIT_MIB}..${MAX_MEMORY_LIMIT_MIB}`,
      );
    }
    const timeoutMs = request.timeoutMs ?? this.defaultTimeoutMs;
    if (!isIntIn(timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    const metadata = JSON.stringify(validateMetadata(request.metadata));
    const envVars = JSON.stringify(validateEnvVars(request.env));
    const inbound = JSON.stringify(validateInbound(request.inbound));
    // Reserved before the first await: concurrent spawns each see the others' children (admission.ts).
    const reservations = [this.admission.reserveSpawn(n)];
    const releaseAll = () => {
      for (const r of reservations) r.release();
    };
    let snapshot: Awaited<ReturnType<DaemonSnapshots["bootable"]>>;
    let cgroupRoot: MemoryCgroupRoot | null;
    let snapshotNic: SnapshotManifest["machine"]["nic"] | null;
    let network: ReturnType<SandboxNetworks["resolvePolicy"]>;
    try {
      snapshot = await this.snapshots.bootable(tag);
      snapshotNic = snapshot.manifest.machine.nic ?? null;
      if (!snapshotNic && request.network !== undefined && request.network !== "none") {
        throw conflict(
          `snapshot ${tag} has no NIC (its template says network = "none"), so its sandboxes cannot have a network policy`,
        );
      }
      network = this.networks.resolvePolicy(request.network);
      cgroupRoot = memoryLimit === null ? null : await this.memoryCgroupRoot();
      if (memoryLimit !== null && cgroupRoot === null) {
        throw new ForkdError(
          "not_implemented",
          "memory_limit_mib needs a cgroup memory controller, and this host has none",
        );
      }
      // live_fork may copy the RAM image to tmpfs first: host memory that is gone before any child starts.
      if (request.liveFork === true) {
        const ramMiB = snapshot.manifest.memory.ramBytes / 2 ** 20;
        reservations.push(this.admission.reserveMemory(ramMiB, "a tmpfs copy of the RAM image (live_fork)"));
      }
    } catch (err) {
      releaseAll();
      throw err;
    }
    const networkKind = !snapshotNic ? "none" : network === "none" ? "private" : "netns";
    const accelerator = snapshot.manifest.machine.accel;
    // A pooled VM has a private NIC (or none) and maps the snapshot's disk image: not for a sandbox network or
    // live_fork. Taken synchronously, before the first await below, so concurrent spawns never share one.
    const pooled =
      networkKind !== "netns" && request.liveFork !== true ? this.warmPool.take(tag, n) : undefined;
    const prestarted = new Map((pooled?.children ?? []).map((child) => [child.id, child]));
    const pooledIds = [...prestarted.keys()];
    const rows: SandboxRow[] = Array.from({ length: n }, (_, index) => {
      const id = pooledIds[index] ?? newSandboxId();
      return {
        id,
        snapshot_tag: tag,
        status: "starting",
        pid: null,
        pid_start_time: null,
        run_dir: path.join(this.paths.run, id),
        accelerator,
        created_at_unix: Math.floor(Date.now() / 1000),
        expires_at_unix_ms: null,
        memory_limit_mib: memoryLimit,
        memory_image: null,
        layer_tags: "[]",
        last_branch_tag: null,
        branch_blocked: null,
        live_fork: request.liveFork === true ? 1 : 0,
        cgroup: null,
        ready_ms: null,
        error: null,
        metadata,
        env_vars: envVars,
        access_token: newAccessToken(),
        traffic_token: newAccessToken(),
        template_alias: request.templateAlias ?? null,
        network: networkKind,
        inbound,
      };
    });
    // Recorded before any QEMU starts: if the daemon dies mid-spawn, the restart finds and kills them.
    for (const row of rows) this.db.insertSandbox(row);
    const started: Sandbox[] = [];
    const failed = new Map<string, ForkdError>();
    let plan: RestorePlan | undefined;
    const forget = async (row: SandboxRow) => {
      const current = this.db.sandbox(row.id);
      if (current?.cgroup) await removeCgroup(current.cgroup).catch(() => {});
      // A restore that failed killed its QEMU; what remains of the network is the namespace and veth.
      await this.networks
        .detach(row.id)
        .catch((e: unknown) =>
          this.log.warn({ id: row.id, err: errorMessage(e) }, "could not remove a sandbox network"),
        );
      this.db.deleteSandbox(row.id);
    };
    try {
      plan = await prepareRestore(this.paths, snapshot, { inMemory: request.liveFork === true });
      const restorePlan = plan;
      const layerTags = JSON.stringify(plan.chain.map((s) => s.tag));
      for (const row of rows) {
        row.layer_tags = layerTags;
        this.db.updateSandbox(row.id, { layer_tags: layerTags });
      }
      // Networks first, more at once than restores: creating one is mostly waiting on the kernel (namespace
      // and device setup), not CPU, so overlapping them hides that latency.
      // Every setup is waited for, failed or not, so the cleanup below never races one still creating.
      const nics = new Map<string, Awaited<ReturnType<SandboxNetworks["attach"]>>>();
      const failures: unknown[] = [];
      let nextNetwork = 0;
      await Promise.all(
        Array.from({ length: Math.min(NETWORK_SETUP_CONCURRENCY, n) }, async () => {
          while (nextNetwork < rows.length && failures.length === 0) {
            const row = rows[nextNetwork++] as SandboxRow;
            try {
              nics.set(row.id, await this.networks.attach(row.id, network, snapshotNic));
            } catch (err) {
              failures.push(err);
            }
          }
        }),
      );
      if (failures.length > 0) throw failures[0];
      let next = 0;
      const worker = async () => {
        while (next < rows.length && (policy === "each" || failures.length === 0)) {
          const row = rows[next++] as SandboxRow;
          try {
            const child = prestarted.get(row.id);
            prestarted.delete(row.id);
            const sandbox = await Sandbox.restore(
              this.paths,
              child ? (pooled?.plan ?? restorePlan) : restorePlan,
              {
                id: row.id,
                prestarted: child,
                outliveHost: true,
                signal: request.signal,
                nic: nics.get(row.id),
                onSpawned: async (pid) => {
                  const startTime = await processStartTime(pid);
                  this.db.updateSandbox(row.id, { pid, pid_start_time: startTime });
                  if (cgroupRoot && memoryLimit !== null) {
                    const cgroup = await limitMemory(cgroupRoot, row.id, memoryLimit, pid);
                    this.db.updateSandbox(row.id, { cgroup });
                    row.cgroup = cgroup;
                  }
                },
              },
            );
            started.push(sandbox);
            row.pid = sandbox.pid;
            row.memory_image = sandbox.memoryImage;
            row.ready_ms = Math.round(sandbox.readyMs * 10) / 10;
          } catch (err) {
            failures.push(err);
            failed.set(row.id, asForkdError(err));
            // A child that failed on its own leaves nothing behind; all-or-nothing cleans up below.
            if (policy === "each") await forget(row);
          }
        }
      };
      await Promise.all(Array.from({ length: Math.min(SPAWN_CONCURRENCY, n) }, worker));
      if (policy === "all-or-nothing" && failures.length > 0) throw failures[0];
      if (policy === "each" && started.length === 0 && request.signal?.aborted) throw failures[0];
      const now = Date.now();
      for (const sandbox of started) {
        const row = rows.find((r) => r.id === sandbox.id) as SandboxRow;
        row.status = "running";
        row.expires_at_unix_ms = timeoutMs === 0 ? null : now + timeoutMs;
        this.db.updateSandbox(row.id, {
          status: "running",
          expires_at_unix_ms: row.expires_at_unix_ms,
          ready_ms: row.ready_ms,
          memory_image: row.memory_image,
        });
        this.live.set(row.id, { handle: sandbox, killing: false });
        this.watchExit(sandbox);
      }
      this.log.info({ tag, n, ids: started.map((s) => s.id), failed: failed.size }, "spawned");
      return rows.map((r): ForkChild => {
        const error = failed.get(r.id);
        return error ? { error } : { sandbox: this.info(this.db.sandbox(r.id) as SandboxRow) };
      });
    } catch (err) {
      // All or nothing: a spawn that could not start every child starts none.
      await Promise.all(started.map((s) => s.destroy()));
      for (const row of rows) await forget(row);
      throw err;
    } finally {
      releaseAll();
      // Pooled VMs a failed spawn never got to: they have no sandbox to become.
      await Promise.all([...prestarted.values()].map((c) => discardPrestarted(c)));
      await plan?.dispose();
    }
  }

  /** See SandboxService.fork. */
  async fork(
    id: string,
    request: { count: number; timeoutMs?: number; signal?: AbortSignal },
  ): Promise<ForkOutcome> {
    const count = validateChildCount(request.count);
    const live = this.liveOrThrow(id);
    const row = this.row(id);
    // Refused before anything is attempted when the host cannot take that many more (the children's own spawn
    // reserves them again when it starts).
    this.admission.reserveSpawn(count).release();
    const branched = await this.branch(id, {
      tag: `fork-${randomBytes(6).toString("hex")}`,
      mode: row.live_fork === 1 ? "live" : "diff",
      signal: request.signal,
    });
    this.snapshots.markEphemeral(branched.tag, `fork of ${live.handle.id}`);
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
        signal: request.signal,
      },
      "each",
    );
    this.requestCollection();
    return { tag: branched.tag, mode: branched.mode, pause_ms: branched.pause_ms, children };
  }

  // ---- queries ----

  list(filter: { snapshotTag?: string } = {}): SandboxInfo[] {
    return this.db
      .sandboxes()
      .filter((r) => filter.snapshotTag === undefined || r.snapshot_tag === filter.snapshotTag)
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
    const killing = (async () => {
      // A sandbox being re-attached is killed once that is settled (bounded by REATTACH_TIMEOUT_MS).
      await this.reattaching.get(id);
      await this.destroy(row, "killed");
      this.db.deleteSandbox(id);
    })();
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

  setTimeout(id: string, timeoutMs: number): SandboxInfo {
    if (!isIntIn(timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    this.liveOrThrow(id);
    this.db.updateSandbox(id, { expires_at_unix_ms: timeoutMs === 0 ? null : Date.now() + timeoutMs });
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
    await this.networks.setPolicy(id, policy);
    return this.get(id);
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
    if (live && !live.killing) return live;
    if (this.reattaching.has(id)) {
      throw new ForkdError(
        "unavailable",
        `sandbox ${id} is re-attaching after a daemon restart; retry in a moment`,
      );
    }
    if (row.status === "dead") throw conflict(`sandbox ${id} is dead: ${row.error ?? "its VM exited"}`);
    if (row.status === "starting") throw conflict(`sandbox ${id} is still starting`);
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
    return this.db
      .sandboxes()
      .filter(
        (r) =>
          r.status !== "dead" &&
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
    const [sandbox] = await this.spawn({
      snapshotTag: request.from,
      n: 1,
      timeoutMs: 0,
      signal: request.signal,
    });
    const id = (sandbox as SandboxInfo).id;
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
      const outcome = await this.branch(id, { tag: request.tag, mode: "diff", signal: request.signal });
      return { ...outcome, exit_code: ran.exitCode, stdout, stderr };
    } finally {
      await this.kill(id).catch(() => {});
    }
  }

  /** Snapshots running sandbox `id` mid-work; it keeps running. See branch.ts. */
  async branch(id: string, request: BranchRequest & { alias?: string } = {}): Promise<BranchOutcome> {
    const live = this.liveOrThrow(id);
    const row = this.row(id);
    // The mark of a BRANCH this process is running is no obstacle: branches of one source queue behind each other.
    const inFlight = this.brancher.isBranching(id) && interruptedBranchTag(row.branch_blocked) !== null;
    if (row.branch_blocked && !inFlight) {
      throw conflict(`sandbox ${id} cannot be branched again: ${row.branch_blocked}`);
    }
    if (request.alias !== undefined) assertAlias(request.alias);
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
        },
        branchRequest,
      );
    } finally {
      buffer.release();
    }
    if (alias !== undefined) {
      const previous = this.snapshots.aliases.list().find((a) => a.alias === alias)?.tag;
      await this.snapshots.aliases.set(alias, result.tag);
      // The name moved on: its earlier snapshot goes once nothing else needs it.
      if (previous !== undefined && previous !== result.tag) {
        this.snapshots.markEphemeral(previous, `superseded as ${alias}`);
        this.requestCollection();
      }
    }
    return { ...result, snapshot: await this.snapshots.get(result.tag) };
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
      ready_ms: row.ready_ms,
      accelerator: row.accelerator,
      live_fork: row.live_fork === 1,
      branch_count: branchCount(row),
      last_branch_tag: row.last_branch_tag,
      last_branch_memory_path: this.branchMemoryPath(row.last_branch_tag),
      metadata: parseStringMap(row.metadata),
      template_alias: row.template_alias,
      inbound: parseInbound(row.inbound),
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
    if (row.cgroup) await removeCgroup(row.cgroup).catch(() => {});
    this.metricsSampler.forget(row.id);
    this.requestCollection();
    await this.networks.detach(row.id);
    this.log.info({ id: row.id, reason }, "sandbox stopped");
  }

  private async markDead(row: SandboxRow, error: string): Promise<void> {
    await this.destroy(row, error);
    this.db.updateSandbox(row.id, { status: "dead", error, pid: null, cgroup: null });
  }

  private watchExit(sandbox: Sandbox): void {
    sandbox.vm.exited.then(async () => {
      const live = this.live.get(sandbox.id);
      if (!live || live.killing) return;
      const row = this.db.sandbox(sandbox.id);
      if (row) await this.markDead(row, "its VM exited");
    });
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
    const survivors: { row: SandboxRow; identity: ProcessIdentity }[] = [];
    for (const row of this.db.sandboxes()) {
      if (row.status === "dead") continue;
      const identity = recordedIdentity(row.pid, row.pid_start_time, recordedBoot);
      const alive = identity !== null && (await isOurProcess(identity, row.run_dir));
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
    await this.networks.reconcile(new Set(survivors.map((s) => s.row.id)));
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
        { callTimeoutMs: CHILD_READY_TIMEOUT_MS[row.accelerator] },
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
        await this.destroy(row, "lifetime expired");
        this.db.deleteSandbox(row.id);
        continue;
      }
      const live = this.live.get(row.id);
      // Not our child, so no exit event: its identity (a zombie or a reused pid is not it) says whether it lives.
      if (live?.handle instanceof AdoptedSandbox && !(await isAlive(live.handle.identity))) {
        await this.markDead(row, "its VM exited");
      }
    }
    if (this.collectionRequested || now - this.lastCollection > EPHEMERAL_COLLECTION_INTERVAL_MS) {
      this.collectionRequested = false;
      this.lastCollection = now;
      const deleted = await this.snapshots.collectEphemeral();
      if (deleted.length > 0) this.log.info({ tags: deleted }, "deleted snapshots nothing needs any more");
    }
  }

  /** Asks the next sweep to delete the daemon's own snapshots that nothing needs any more. */
  private requestCollection(): void {
    this.collectionRequested = true;
  }

  private memoryCgroupRoot(): Promise<MemoryCgroupRoot | null> {
    this.cgroupRoot ??= detectMemoryCgroupRoot();
    return this.cgroupRoot;
  }
}

/**
 * Branches taken of a sandbox: `layer_tags` is the chain it was restored from (ending with its snapshot) followed
 * by one tag per branch taken of it.
 */
function branchCount(row: SandboxRow): number {
  const layers = JSON.parse(row.layer_tags) as string[];
  const restoredAt = layers.lastIndexOf(row.snapshot_tag);
  return restoredAt < 0 ? 0 : layers.length - 1 - restoredAt;
}

/** The last few KiB of a command's output, for an error message. */
function tail(text: string): string {
  const t = text.length > 4096 ? `…${text.slice(-4096)}` : text;
  return t && !t.endsWith("\n") ? `${t}\n` : t;
}

function asForkdError(err: unknown): ForkdError {
  return err instanceof ForkdError ? err : new ForkdError("internal", errorMessage(err), { cause: err });
}

function isIntIn(value: unknown, min: number, max: number): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= min && value <= max;
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
