/**
 * The daemon's sandboxes (SandboxService): the manager wires the modules that do the work, one per verb, and
 * holds what they share: the state database, the running VMs (live-sandboxes.ts), the per-sandbox locks,
 * admission, the networks, the snapshots and the daemon's settings.
 *
 *   spawn.ts            spawn (spawn-request.ts, spawn-children.ts, the warm pool)
 *   teardown.ts         kill, a VM that ended on its own
 *   lifetimes.ts        setTimeout/extendTimeout and the sweep that enforces them
 *   guest-calls.ts      exec, eval, files, processes, contexts
 *   pause-resume.ts     pause and resume
 *   branching.ts        BRANCH (running or paused); fork.ts and snapshot-diff.ts build on it
 *   reattach.ts         a restart: the records reconciled, the survivors re-attached
 *   network-calls.ts    network status, egress policy, ports
 *   usage-reports.ts    metrics, host usage, host status
 *
 * State is in SQLite so a daemon restart re-attaches to running VMs (their QEMU outlives the daemon) and
 * cleans up after dead ones.
 */

import type http from "node:http";
import type net from "node:net";
import path from "node:path";
import type { EvalOptions, ExecOptions } from "../../agent/host/types.js";
import { invalidArgument } from "../../common/errors.js";
import { lockHome } from "../../common/home-lock.js";
import { CONSOLE_READ_BYTES, DEFAULT_DISK_LIMIT_MIB, MAX_SANDBOX_TIMEOUT_MS } from "../../common/limits.js";
import type { ForkdPaths } from "../../common/paths.js";
import { type CgroupLayout, detectCgroupLayout, prepareCgroupParents } from "../../isolation/cgroup.js";
import {
  type ConfinementConfig,
  type ConfinementMode,
  resolveConfinement,
} from "../../isolation/confinement.js";
import type { EgressPolicyInput } from "../../net/policy.js";
import { type SandboxRow, StateDb } from "../../store/db.js";
import type { SnapshotStore } from "../../store/snapshot-store.js";
import { DEFAULT_CONSOLE_LOG_BYTES } from "../../vmm/console-log.js";
import { type BuildLimits, DaemonTemplateBuilds } from "../builds/template-builds.js";
import { homeKey } from "../machines/restore-plan.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";
import { SandboxNetworks, type SandboxNetworksOptions } from "../networks/sandbox-networks.js";
import type {
  AccessTokens,
  BranchOutcome,
  ConfinementStatus,
  ForkOutcome,
  HostStatus,
  NetworkStatus,
  PausedSandboxRecord,
  PauseOutcome,
  PauseRequest,
  ResumeRequest,
  SandboxInfo,
  SandboxMetrics,
  SandboxService,
  SandboxStatus,
  SandboxUsage,
  SpawnRequest,
} from "../sandbox-service.js";
import { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import { accessTokensOf, verifyAccessToken } from "./access-tokens.js";
import { Admission, type AdmissionLimits, DEFAULT_ADMISSION_LIMITS } from "./admission.js";
import { Branching, type SandboxBranchRequest } from "./branching.js";
import { readConsole } from "./console.js";
import { insertAdopted, pausedRecordOf } from "./durable-pause.js";
import { type ForkRequest, forkSandbox } from "./fork.js";
import { GuestCalls } from "./guest-calls.js";
import { KeyedLock } from "./keyed-lock.js";
import { Lifetimes, SWEEP_INTERVAL_MS } from "./lifetimes.js";
import { resolveLimits, validateLimitsRequest } from "./limits.js";
import { LiveSandboxes } from "./live-sandboxes.js";
import { NetworkCalls } from "./network-calls.js";
import { PauseResume } from "./pause-resume.js";
import { Reattach } from "./reattach.js";
import { sandboxInfo } from "./sandbox-info.js";
import { SnapshotCollection, sandboxesUsing } from "./snapshot-collection.js";
import { type SnapshotDiffOutcome, type SnapshotDiffRequest, snapshotDiff } from "./snapshot-diff.js";
import { Spawner } from "./spawn.js";
import { isIntIn } from "./spawn-request.js";
import { Teardown } from "./teardown.js";
import { UsageReports } from "./usage-reports.js";
import { WarmPool, type WarmPoolStats, type WarmPoolTarget } from "./warm-pool.js";
import { Workspaces } from "./workspaces.js";

/**
 * Lifetime of a sandbox spawned without one: none (it lives until killed), as in forkd v0.5. A daemon may set one
 * (`forkd daemon --default-timeout-ms`); callers that want E2B's five minutes ask for them (the SDKs do).
 */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 0;
export { EXIT_CONSOLE_TAIL_BYTES } from "./console.js";
export { SWEEP_INTERVAL_MS, TIMEOUT_PAUSE_RETRY_MS } from "./lifetimes.js";
export { REATTACH_CONCURRENCY } from "./reattach.js";
export { EPHEMERAL_COLLECTION_INTERVAL_MS } from "./snapshot-collection.js";
export { SNAPSHOT_DIFF_EXEC_TIMEOUT_MS } from "./snapshot-diff.js";
export { NETWORK_SETUP_CONCURRENCY, SPAWN_CONCURRENCY } from "./spawn-children.js";

export interface ManagerLog {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

export interface ManagerOptions {
  limits?: Partial<AdmissionLimits>;
  /** Template builds (controller/builds): how many at once, upload and machine bounds. */
  buildLimits?: Partial<BuildLimits>;
  /** Image caches besides FORKD_IMAGE_CACHE whose images v0.5 clients may name by path (`--allow-image-dir`). */
  extraImageDirs?: readonly string[];
  /** Host-wide cap on BRANCHes in flight (`--branch-concurrency`). @default MAX_CONCURRENT_BRANCHES */
  branchConcurrency?: number;
  /** Lifetime of a sandbox whose spawn names none, in ms; 0 = no limit. @default DEFAULT_SANDBOX_TIMEOUT_MS */
  defaultTimeoutMs?: number;
  log?: ManagerLog;
  sweepIntervalMs?: number;
  /**
   * Keep each running sandbox's metrics as a series, a sample every this many ms (`forkd daemon
   * --metrics-interval-s`; E2B's metrics route answers the series). 0: none, metrics are sampled when asked.
   * @default 0
   */
  metricsIntervalMs?: number;
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
   * Snapshots to keep prestarted QEMUs of (`--warm-pool TAG:N`): spawns of them under the default limits and
   * without live_fork take those first; in netns mode each pooled VM has a network prepared, and serves spawns
   * with a network of their own (see warm-pool.ts).
   */
  warmPools?: readonly WarmPoolTarget[];
}

/** What the verb modules share: the daemon's state and settings (each module's context names its part). */
interface Shared {
  paths: ForkdPaths;
  db: StateDb;
  networks: SandboxNetworks;
  cgroups: CgroupLayout | null;
  confinement: ConfinementConfig;
  live: LiveSandboxes;
  snapshots: DaemonSnapshots;
  store: SnapshotStore;
  admission: Admission;
  locks: KeyedLock;
  log: ManagerLog;
  diskLimitMiB: number;
  consoleLogBytes: number;
  defaultTimeoutMs: number;
  get(id: string): SandboxInfo;
  info(row: SandboxRow): SandboxInfo;
}

/** The verb modules with what they share (fork.ts and snapshot-diff.ts take it whole). */
type Verbs = Shared & {
  collection: SnapshotCollection;
  networkCalls: NetworkCalls;
  guest: GuestCalls;
  usage: UsageReports;
  teardown: Teardown;
  spawner: Spawner;
  branching: Branching;
  pauseResume: PauseResume;
};

/** The verb modules, wired to each other in the order they depend on each other. */
function wireVerbs(shared: Shared, warmPool: WarmPool, options: ManagerOptions): Verbs {
  const { live } = shared;
  const collection = new SnapshotCollection(shared);
  const networkCalls = new NetworkCalls(shared);
  const guest = new GuestCalls(live);
  const usage = new UsageReports({ ...shared, guest });
  const teardown = new Teardown({
    ...shared,
    networkCalls,
    collection,
    forgetSamples: (id) => usage.forget(id),
  });
  const spawner = new Spawner({
    ...shared,
    warmPool,
    adopt: (sandbox) => {
      live.add(sandbox);
      teardown.watchExit(sandbox);
    },
  });
  const branching = new Branching({
    ...shared,
    collection,
    branchConcurrency: options.branchConcurrency,
    allowUnprivilegedUserfaultfd: options.allowUnprivilegedUserfaultfd,
  });
  const pauseResume = new PauseResume({
    ...shared,
    brancher: branching.brancher,
    teardown,
    collection,
    usage,
  });
  return { ...shared, collection, networkCalls, guest, usage, teardown, spawner, branching, pauseResume };
}

export class SandboxManager implements SandboxService {
  readonly snapshots: DaemonSnapshots;
  /** What every spawn, BRANCH, pause and template build is admitted by. */
  readonly admission: Admission;
  readonly workspaces: Workspaces;
  readonly files: SandboxService["files"];
  readonly procs: SandboxService["procs"];
  readonly contexts: SandboxService["contexts"];
  private readonly live: LiveSandboxes;
  /** Pause, resume, kill and BRANCH of one sandbox run one at a time. */
  private readonly locks = new KeyedLock();
  private readonly log: ManagerLog;
  private readonly diskLimitMiB: number;
  private readonly consoleLogBytes: number;
  private readonly warmPool: WarmPool;
  private readonly verbs: Verbs;
  private readonly lifetimes: Lifetimes;
  private readonly restart: Reattach;
  private closed = false;

  private constructor(
    paths: ForkdPaths,
    private readonly db: StateDb,
    private readonly networks: SandboxNetworks,
    /** How this daemon's QEMUs are confined. */
    readonly confinement: ConfinementConfig,
    /** Where sandbox cgroups go (null: none, confinement off or not root). */
    readonly cgroups: CgroupLayout | null,
    options: ManagerOptions,
  ) {
    const settings = checkedSettings(options);
    this.diskLimitMiB = settings.diskLimitMiB;
    this.consoleLogBytes = settings.consoleLogBytes;
    this.log = options.log ?? { info: () => {}, warn: () => {} };
    const live = new LiveSandboxes(db);
    this.live = live;
    // Pooled VMs count as sandboxes: they hold host memory and a slot until taken or drained.
    const admission = new Admission(
      { ...DEFAULT_ADMISSION_LIMITS, ...options.limits },
      () => live.size + this.warmPool.count(),
    );
    this.admission = admission;
    this.warmPool = new WarmPool(paths, {
      admit: () => admission.reserveMemory(admission.limits.perSandboxEstimateMiB, "a warm pool VM"),
      log: options.log,
      confinement,
      cgroups,
      networks,
      defaultLimits: (snapshot) =>
        resolveLimits(
          {},
          {
            layout: cgroups,
            diskCap: confinement.mode === "on",
            defaultDiskMiB: settings.diskLimitMiB,
            ramMiB: snapshot.manifest.machine.memoryMiB,
            vcpus: snapshot.manifest.machine.vcpus,
          },
        ),
    });
    const snapshots = new DaemonSnapshots(paths, db, (tag) => sandboxesUsing(db, tag), {
      confinement,
      admission,
      beforeDelete: (tag) => this.warmPool.drain(tag),
      defaultSnapshot: options.defaultSnapshot,
      imageDirs: [paths.images, ...(options.extraImageDirs ?? [])],
    });
    this.snapshots = snapshots;
    // What every verb module may use; each takes the part its context names.
    const shared: Shared = {
      ...settings,
      paths,
      db,
      networks,
      cgroups,
      confinement,
      live,
      snapshots,
      admission,
      store: snapshots.store,
      locks: this.locks,
      log: this.log,
      get: (id) => this.get(id),
      info: (row) => this.info(row),
    };
    this.verbs = wireVerbs(shared, this.warmPool, options);
    ({ files: this.files, procs: this.procs, contexts: this.contexts } = this.verbs.guest);
    this.lifetimes = new Lifetimes(this.verbs);
    this.restart = new Reattach({ ...this.verbs, closed: () => this.closed });
    this.workspaces = new Workspaces(db, this, paths.snapshots);
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
    await manager.restart.reconcile();
    for (const target of options.warmPools ?? []) manager.warmPool.warm(target.tag, target.size);
    manager.lifetimes.start(options.sweepIntervalMs ?? SWEEP_INTERVAL_MS);
    manager.verbs.usage.startSeries(options.metricsIntervalMs ?? 0);
    return manager;
  }

  /** Resolves once every sandbox found running at start-up is re-attached or marked dead (tests, shutdown). */
  get reattached(): Promise<void> {
    return this.restart.reattached;
  }

  // ---- spawn, fork, BRANCH ----

  /** All or nothing: every child ready, or none left behind. */
  spawn(request: SpawnRequest): Promise<SandboxInfo[]> {
    return this.verbs.spawner.spawn(request);
  }

  /** See SandboxService.fork. */
  fork(id: string, request: ForkRequest): Promise<ForkOutcome> {
    return forkSandbox(this.verbs, id, request);
  }

  /** Snapshots sandbox `id` mid-work; it keeps running. See snapshots/branch.ts. */
  branch(id: string, request: SandboxBranchRequest = {}): Promise<BranchOutcome> {
    return this.verbs.branching.branch(id, request);
  }

  branchLoad(): { inFlight: number; cap: number } {
    return this.verbs.branching.load();
  }

  /** See snapshot-diff.ts. */
  snapshotDiff(request: SnapshotDiffRequest): Promise<SnapshotDiffOutcome> {
    return snapshotDiff(this.verbs, request);
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
    return this.info(this.live.row(id));
  }

  private info(row: SandboxRow): SandboxInfo {
    return sandboxInfo({ networks: this.networks, store: this.snapshots.store }, row);
  }

  /** Live sandbox handles (for benchmarks and metrics). */
  handles(): SandboxHandle[] {
    return this.live.all().map((l) => l.handle);
  }

  /** The warm pools' state (metrics, tests). */
  warmPoolStats(): WarmPoolStats[] {
    return this.warmPool.stats();
  }

  /** Pids of the warm pools' ready VMs (benchmarks read their CPU time). */
  warmPoolPids(): number[] {
    return this.warmPool.pids();
  }

  /**
   * Keeps `size` VMs of `tag` warm from now on (0 drains its pool): a cluster controller's target. A confined
   * daemon's pooled QEMUs start in the cgroups of the sandbox each will become (warm-pool.ts).
   */
  async setWarmPool(tag: string, size: number): Promise<void> {
    if (size === 0) await this.warmPool.drain(tag);
    else this.warmPool.warm(tag, size);
  }

  // ---- lifecycle ----

  /** Kills `id`. Of concurrent kills of one sandbox, one succeeds; the others wait for it, then get not_found. */
  kill(id: string): Promise<void> {
    return this.verbs.teardown.kill(id);
  }

  killAll(filter: { snapshotTag?: string } = {}): Promise<string[]> {
    return this.verbs.teardown.killAll(filter);
  }

  /** See SandboxService.pause; pause-layer.ts writes the layer. */
  pause(id: string, request: PauseRequest = {}): Promise<PauseOutcome> {
    return this.verbs.pauseResume.pause(id, request);
  }

  /** See SandboxService.resume: restored like a spawn (Sandbox.restore), from its pause layer, under its id. */
  resume(id: string, request: ResumeRequest = {}): Promise<SandboxInfo> {
    return this.verbs.pauseResume.resume(id, request);
  }

  /** See SandboxService.pausedRecord (durable-pause.ts). */
  pausedRecord(id: string): PausedSandboxRecord {
    return pausedRecordOf(this.db, id);
  }

  /** See SandboxService.adoptPaused (durable-pause.ts): under the id's lock, as any change of its record. */
  adoptPaused(record: PausedSandboxRecord): Promise<void> {
    return this.locks.run(record.id, () =>
      insertAdopted(
        { paths: this.verbs.paths, db: this.db, store: this.verbs.store, networks: this.networks },
        record,
      ),
    );
  }

  setTimeout(id: string, timeoutMs: number): SandboxInfo {
    return this.lifetimes.set(id, timeoutMs);
  }

  extendTimeout(id: string, timeoutMs: number): SandboxInfo {
    return this.lifetimes.extend(id, timeoutMs);
  }

  // ---- settings and secrets ----

  accessTokens(id: string): AccessTokens {
    return accessTokensOf(this.db, this.live.row(id));
  }

  verifyAccessToken(id: string, kind: keyof AccessTokens, token: string | undefined): boolean {
    return verifyAccessToken(this.db, id, kind, token);
  }

  envVars(id: string): Record<string, string> {
    return this.verbs.guest.envVars(id);
  }

  // ---- usage, console, confinement ----

  metrics(id: string, options: { signal?: AbortSignal } = {}): Promise<SandboxMetrics> {
    return this.verbs.usage.metrics(id, options);
  }

  metricsHistory(
    id: string,
    range: { startMs?: number; endMs?: number; signal?: AbortSignal } = {},
  ): Promise<SandboxMetrics[]> {
    return this.verbs.usage.history(id, range);
  }

  usage(filter: { ids?: readonly string[] } = {}): Promise<SandboxUsage[]> {
    return this.verbs.usage.usage(filter);
  }

  host(): Promise<HostStatus> {
    return this.verbs.usage.host();
  }

  /** The last `maxBytes` of sandbox `id`'s serial console (bounded per sandbox; see vmm/console-log.ts). */
  console(id: string, maxBytes = CONSOLE_READ_BYTES): Promise<string> {
    return readConsole(this.live, id, maxBytes);
  }

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
    return this.verbs.networkCalls.status();
  }

  /** Replaces sandbox `id`'s egress policy while it runs. */
  async setNetworkPolicy(id: string, policy: EgressPolicyInput): Promise<SandboxInfo> {
    await this.verbs.networkCalls.setPolicy(id, policy);
    return this.get(id);
  }

  /** Proxies one HTTP request (`req.url` is the path in the guest) to TCP port `port` of sandbox `id`. */
  proxyHttp(id: string, port: number, req: http.IncomingMessage, res: http.ServerResponse) {
    return this.verbs.networkCalls.proxyHttp(id, port, req, res);
  }

  /** Proxies a WebSocket (HTTP upgrade) to TCP port `port` of sandbox `id`. */
  proxyUpgrade(id: string, port: number, req: http.IncomingMessage, socket: net.Socket, head: Buffer): void {
    this.verbs.networkCalls.proxyUpgrade(id, port, req, socket, head);
  }

  // ---- calls into the guest ----

  ping(id: string, options: { signal?: AbortSignal } = {}) {
    return this.verbs.guest.ping(id, options);
  }

  exec(id: string, argv: string[], options: ExecOptions = {}) {
    return this.verbs.guest.exec(id, argv, options);
  }

  eval(id: string, code: string, options: EvalOptions = {}) {
    return this.verbs.guest.eval(id, code, options);
  }

  // ---- closing ----

  /** Stops the sweeper and lets go of the agents. VMs keep running: the next daemon re-attaches to them. */
  async close(): Promise<void> {
    await this.warmPool.close();
    await this.verbs.pauseResume.settled();
    this.closed = true;
    this.lifetimes.stop();
    this.verbs.usage.stopSeries();
    // Re-attaches in flight let go of what they adopt once they see `closed`.
    await this.reattached.catch(() => {});
    this.live.releaseAll();
    this.verbs.networkCalls.closeProxy();
    await this.networks.close();
  }

  /** Kills every sandbox (tests, `forkd daemon --kill-on-exit`). */
  async closeAndKill(): Promise<void> {
    await this.warmPool.close();
    await this.verbs.pauseResume.settled();
    this.lifetimes.stop();
    this.verbs.usage.stopSeries();
    await this.killAll();
    this.verbs.networkCalls.closeProxy();
    await this.networks.close();
  }
}

/** The manager's own settings from `options`, checked (a refused option opens nothing). */
function checkedSettings(options: ManagerOptions) {
  const diskLimitMiB = options.diskLimitMiB ?? DEFAULT_DISK_LIMIT_MIB;
  validateLimitsRequest({ diskLimitMiB });
  const consoleLogBytes = options.consoleLogBytes ?? DEFAULT_CONSOLE_LOG_BYTES;
  const defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS;
  if (!isIntIn(defaultTimeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
    throw invalidArgument(
      `the default sandbox timeout must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS} ms`,
    );
  }
  return { diskLimitMiB, consoleLogBytes, defaultTimeoutMs };
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
    const builds = await DaemonTemplateBuilds.open({
      home: paths.home,
      snapshots: sandboxes.snapshots,
      admission: sandboxes.admission,
      limits: options.buildLimits,
    });
    return {
      sandboxes,
      snapshots: sandboxes.snapshots,
      builds,
      close: async (opts: { killSandboxes?: boolean } = {}) => {
        await builds.close();
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
