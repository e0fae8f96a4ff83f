/**
 * The daemon's sandboxes: spawning them from snapshots, serving calls to their agents, their lifetimes and
 * limits, and their state in SQLite so a daemon restart re-attaches to running VMs (their QEMU outlives the
 * daemon) and cleans up after dead ones.
 */
import { readdir, rm, rmdir } from "node:fs/promises";
import type http from "node:http";
import type net from "node:net";
import path from "node:path";
import type { AgentClient } from "../agent/host/client.js";
import type { ExecOptions } from "../agent/host/types.js";
import { conflict, errorMessage, ForkdError, invalidArgument, notFound } from "../common/errors.js";
import { assertSandboxId, assertTag } from "../common/names.js";
import type { ForkdPaths } from "../common/paths.js";
import {
  detectMemoryCgroupRoot,
  limitMemory,
  type MemoryCgroupRoot,
  removeCgroup,
} from "../isolation/cgroup.js";
import type { EgressPolicyInput } from "../net/policy.js";
import { PortProxy } from "../net/port-proxy.js";
import { type SandboxRow, StateDb } from "../store/db.js";
import { type AdmissionLimits, admitSpawn, DEFAULT_ADMISSION_LIMITS } from "./admission.js";
import { AdoptedSandbox } from "./adopted-sandbox.js";
import { Brancher, type BranchRequest } from "./branch.js";
import { DEFAULT_FORK_CONCURRENCY, validateChildCount } from "./fork.js";
import { isOurProcess, killAndWait, processesMentioning, processStartTime } from "./host-processes.js";
import { newSandboxId } from "./ids.js";
import { prepareRestore, type RestorePlan } from "./restore-plan.js";
import { CHILD_READY_TIMEOUT_MS, Sandbox, type SandboxHandle } from "./sandbox.js";
import { SandboxNetworks, type SandboxNetworksOptions } from "./sandbox-network.js";
import type {
  BranchOutcome,
  NetworkStatus,
  SandboxInfo,
  SandboxService,
  SpawnRequest,
} from "./sandbox-service.js";
import { DaemonSnapshots } from "./snapshot-service.js";

/** Default lifetime of a sandbox, as in the SDKs agents already use; extendable. 0 = no limit. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 5 * 60_000;
export const MAX_SANDBOX_TIMEOUT_MS = 7 * 24 * 3_600_000;
export const MIN_MEMORY_LIMIT_MIB = 64;
export const MAX_MEMORY_LIMIT_MIB = 1024 * 1024;
/** Default limit for the command of a snapshot-diff (package installs under TCG take minutes). */
export const SNAPSHOT_DIFF_EXEC_TIMEOUT_MS = 30 * 60_000;

/** How often lifetimes are enforced and dead VMs noticed. */
export const SWEEP_INTERVAL_MS = 1000;
/** Children restored at once within one spawn request (see DEFAULT_FORK_CONCURRENCY for why one per core). */
export const SPAWN_CONCURRENCY = DEFAULT_FORK_CONCURRENCY;
/** Sandbox networks created at once within one spawn request. */
export const NETWORK_SETUP_CONCURRENCY = 8;

export interface ManagerLog {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

export interface ManagerOptions {
  limits?: Partial<AdmissionLimits>;
  log?: ManagerLog;
  sweepIntervalMs?: number;
  /** Bridge, subnet, DNS and the default egress of sandboxes (see SandboxNetworks). */
  network?: Omit<SandboxNetworksOptions, "log">;
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
  /** Kills in progress, so a concurrent kill of the same sandbox waits for the first instead of racing it. */
  private readonly killing = new Map<string, Promise<void>>();
  private readonly limits: AdmissionLimits;
  private readonly log: ManagerLog;
  private spawning = 0;
  private sweeper: NodeJS.Timeout | undefined;
  private cgroupRoot: Promise<MemoryCgroupRoot | null> | undefined;
  private readonly portProxy = new PortProxy();

  private constructor(
    private readonly paths: ForkdPaths,
    private readonly db: StateDb,
    private readonly networks: SandboxNetworks,
    options: ManagerOptions,
  ) {
    this.limits = { ...DEFAULT_ADMISSION_LIMITS, ...options.limits };
    this.log = options.log ?? { info: () => {}, warn: () => {} };
    this.snapshots = new DaemonSnapshots(paths, db, (tag) => this.usersOf(tag));
    this.brancher = new Brancher(this.snapshots.store, db, {
      blocked: (sandboxId, reason) => this.db.updateSandbox(sandboxId, { branch_blocked: reason }),
      branched: (sandboxId, tag) => {
        const current = this.db.sandbox(sandboxId);
        if (!current) return;
        const layers = [...(JSON.parse(current.layer_tags) as string[]), tag];
        this.db.updateSandbox(sandboxId, { last_branch_tag: tag, layer_tags: JSON.stringify(layers) });
      },
    });
  }

  /** Opens the manager: reconciles the database with the processes that are actually running. */
  static async open(paths: ForkdPaths, db: StateDb, options: ManagerOptions = {}): Promise<SandboxManager> {
    const networks = await SandboxNetworks.open(paths, db, { ...options.network, log: options.log });
    const manager = new SandboxManager(paths, db, networks, options);
    await manager.snapshots.reconcile();
    await manager.reconcile();
    const interval = options.sweepIntervalMs ?? SWEEP_INTERVAL_MS;
    manager.sweeper = setInterval(() => {
      manager.sweep().catch((err) => manager.log.warn({ err: errorMessage(err) }, "sweep failed"));
    }, interval);
    manager.sweeper.unref();
    return manager;
  }

  // ---- spawn ----

  async spawn(request: SpawnRequest): Promise<SandboxInfo[]> {
    const tag = assertTag(request.snapshotTag, "snapshot_tag");
    const n = validateChildCount(request.n);
    const memoryLimit = request.memoryLimitMiB ?? null;
    if (memoryLimit !== null && !isIntIn(memoryLimit, MIN_MEMORY_LIMIT_MIB, MAX_MEMORY_LIMIT_MIB)) {
      throw invalidArgument(
        `memory_limit_mib must be an integer in ${MIN_MEMORY_LIMIT_MIB}..${MAX_MEMORY_LIMIT_MIB}`,
      );
    }
    const timeoutMs = request.timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS;
    if (!isIntIn(timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    const snapshot = await this.snapshots.bootable(tag);
    const snapshotNic = snapshot.manifest.machine.nic ?? null;
    if (!snapshotNic && request.network !== undefined && request.network !== "none") {
      throw conflict(
        `snapshot ${tag} has no NIC (its template says network = "none"), so its sandboxes cannot have a network policy`,
      );
    }
    const network = this.networks.resolvePolicy(request.network);
    const networkKind = !snapshotNic ? "none" : network === "none" ? "private" : "netns";
    const cgroupRoot = memoryLimit === null ? null : await this.memoryCgroupRoot();
    if (memoryLimit !== null && cgroupRoot === null) {
      throw new ForkdError(
        "not_implemented",
        "memory_limit_mib needs a cgroup memory controller, and this host has none",
      );
    }
    await admitSpawn(this.limits, { alive: this.live.size, spawning: this.spawning, requested: n });
    this.spawning++;
    const accelerator = snapshot.manifest.machine.accel;
    const rows: SandboxRow[] = Array.from({ length: n }, () => {
      const id = newSandboxId();
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
        network: networkKind,
      };
    });
    // Recorded before any QEMU starts: if the daemon dies mid-spawn, the restart finds and kills them.
    for (const row of rows) this.db.insertSandbox(row);
    const started: Sandbox[] = [];
    let plan: RestorePlan | undefined;
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
        while (next < rows.length && failures.length === 0) {
          const row = rows[next++] as SandboxRow;
          try {
            const sandbox = await Sandbox.restore(this.paths, restorePlan, {
              id: row.id,
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
            });
            started.push(sandbox);
            row.pid = sandbox.pid;
            row.memory_image = sandbox.memoryImage;
            row.ready_ms = Math.round(sandbox.readyMs * 10) / 10;
          } catch (err) {
            failures.push(err);
          }
        }
      };
      await Promise.all(Array.from({ length: Math.min(SPAWN_CONCURRENCY, n) }, worker));
      if (failures.length > 0) throw failures[0];
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
      this.log.info({ tag, n, ids: rows.map((r) => r.id) }, "spawned");
      return rows.map((r) => this.info(this.db.sandbox(r.id) as SandboxRow));
    } catch (err) {
      // All or nothing: a spawn that could not start every child starts none.
      await Promise.all(started.map((s) => s.destroy()));
      for (const row of rows) {
        const current = this.db.sandbox(row.id);
        if (current?.cgroup) await removeCgroup(current.cgroup).catch(() => {});
        // A restore that failed killed its QEMU; what remains of the network is the namespace and veth.
        await this.networks
          .detach(row.id)
          .catch((e: unknown) =>
            this.log.warn({ id: row.id, err: errorMessage(e) }, "could not remove a sandbox network"),
          );
        this.db.deleteSandbox(row.id);
      }
      throw err;
    } finally {
      this.spawning--;
      await plan?.dispose();
    }
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

  // ---- calls into the guest ----

  ping(id: string, options: { signal?: AbortSignal } = {}) {
    return this.call(id, (agent) => agent.ping(options));
  }

  exec(id: string, argv: string[], options: ExecOptions = {}) {
    if (!Array.isArray(argv) || argv.length === 0)
      throw invalidArgument("args must be a non-empty array of strings");
    return this.call(id, (agent) => agent.exec(argv, options));
  }

  eval(id: string, code: string, options: { timeoutMs?: number; signal?: AbortSignal } = {}) {
    return this.call(id, (agent) => agent.eval(code, options));
  }

  readonly files: SandboxService["files"] = {
    write: (id, file, data, options = {}) => this.call(id, (agent) => agent.files.write(file, data, options)),
    read: (id, file, options = {}) => this.call(id, (agent) => agent.files.read(file, options)),
    list: (id, file, options = {}) => this.call(id, (agent) => agent.files.list(file, options)),
    stat: (id, file, options = {}) => this.call(id, (agent) => agent.files.stat(file, options)),
    remove: (id, file, options = {}) => this.call(id, (agent) => agent.files.remove(file, options)),
  };

  /** Stops the sweeper and lets go of the agents. VMs keep running: the next daemon re-attaches to them. */
  async close(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    for (const { handle } of this.live.values()) handle.agent.close();
    this.live.clear();
    this.portProxy.close();
    await this.networks.close();
  }

  /** Kills every sandbox (tests, `forkd daemon --kill-on-exit`). */
  async closeAndKill(): Promise<void> {
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
  ): Promise<void> {
    await this.portProxy.web(req, res, this.portTarget(id, port));
  }

  /** Proxies a WebSocket (HTTP upgrade) to TCP port `port` of sandbox `id`. */
  proxyUpgrade(id: string, port: number, req: http.IncomingMessage, socket: net.Socket, head: Buffer): void {
    this.portProxy.upgrade(req, socket, head, this.portTarget(id, port));
  }

  private portTarget(id: string, port: number) {
    if (!isIntIn(port, 1, 65535)) throw invalidArgument(`port must be an integer in 1..65535, got ${port}`);
    this.liveOrThrow(id);
    return this.networks.portTarget(id, port);
  }

  // ---- internals ----

  private async call<T>(id: string, fn: (agent: AgentClient) => Promise<T>): Promise<T> {
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
    if (row.status === "dead") throw conflict(`sandbox ${id} is dead: ${row.error ?? "its VM exited"}`);
    if (row.status === "starting") throw conflict(`sandbox ${id} is still starting`);
    throw conflict(`sandbox ${id} is being stopped`);
  }

  private row(id: string): SandboxRow {
    assertSandboxId(id);
    const row = this.db.sandbox(id);
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
  async branch(id: string, request: BranchRequest = {}): Promise<BranchOutcome> {
    const live = this.liveOrThrow(id);
    const row = this.row(id);
    if (row.branch_blocked) throw conflict(`sandbox ${id} cannot be branched again: ${row.branch_blocked}`);
    const result = await this.brancher.branch(
      {
        handle: live.handle,
        lastBranchTag: row.last_branch_tag,
        liveFork: row.live_fork === 1,
      },
      request,
    );
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
      network:
        row.status === "dead"
          ? { kind: row.network, netns: null, address: null, guestAddress: null, policy: null }
          : this.networks.info(row.id, row.network !== "none"),
    };
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
      for (const pid of await processesMentioning(row.run_dir)) await killAndWait(pid);
      await rm(row.run_dir, { recursive: true, force: true });
    }
    if (row.cgroup) await removeCgroup(row.cgroup).catch(() => {});
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

  private async reconcile(): Promise<void> {
    await this.sweepRunDir();
    for (const row of this.db.sandboxes()) {
      if (row.status === "dead") continue;
      const alive =
        row.pid !== null &&
        row.pid_start_time !== null &&
        (await isOurProcess(row.pid, row.pid_start_time, row.run_dir));
      if (row.status !== "running" || !alive || row.pid === null) {
        const why =
          row.status === "starting"
            ? "the daemon stopped while it was being spawned"
            : "its VM was gone after a daemon restart";
        await this.markDead(row, why);
        continue;
      }
      try {
        if (row.memory_image === null) throw new ForkdError("internal", "no memory image recorded");
        const handle = await AdoptedSandbox.adopt(
          { ...row, pid: row.pid, memory_image: row.memory_image },
          { callTimeoutMs: CHILD_READY_TIMEOUT_MS[row.accelerator] },
        );
        this.live.set(row.id, { handle, killing: false });
        this.log.info({ id: row.id, pid: row.pid }, "re-attached sandbox");
      } catch (err) {
        await this.markDead(row, `could not re-attach after a daemon restart: ${errorMessage(err)}`);
      }
    }
    // Networks of sandboxes that did not survive were removed by markDead; this catches records without one.
    await this.networks.reconcile(new Set(this.live.keys()));
  }

  /**
   * Removes what dead processes left in the run directory: overlay templates of spawns that never finished,
   * and directories of VMs no record knows about (their processes are killed first).
   */
  private async sweepRunDir(): Promise<void> {
    const known = new Set(this.db.sandboxes().map((r) => path.basename(r.run_dir)));
    const templates = path.join(this.paths.run, ".templates");
    for (const name of await readdir(templates).catch(() => [] as string[])) {
      const writer = /-(\d+)-[0-9a-f]+\.qcow2$/.exec(name)?.[1];
      if (writer !== undefined && (await processStartTime(Number(writer))) === null) {
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
      if (live?.handle instanceof AdoptedSandbox && row.pid_start_time !== null) {
        if ((await processStartTime(live.handle.pid)) !== row.pid_start_time)
          await this.markDead(row, "its VM exited");
      }
    }
  }

  private memoryCgroupRoot(): Promise<MemoryCgroupRoot | null> {
    this.cgroupRoot ??= detectMemoryCgroupRoot();
    return this.cgroupRoot;
  }
}

/** The last few KiB of a command's output, for an error message. */
function tail(text: string): string {
  const t = text.length > 4096 ? `…${text.slice(-4096)}` : text;
  return t && !t.endsWith("\n") ? `${t}\n` : t;
}

function isIntIn(value: unknown, min: number, max: number): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= min && value <= max;
}

/** Opens everything the daemon serves: state database, snapshots, sandboxes (re-attaching survivors). */
export async function openServices(paths: ForkdPaths, options: ManagerOptions = {}) {
  const db = new StateDb(path.join(paths.home, "state.db"));
  let sandboxes: SandboxManager;
  try {
    sandboxes = await SandboxManager.open(paths, db, options);
  } catch (err) {
    db.close();
    throw err;
  }
  return {
    sandboxes,
    snapshots: sandboxes.snapshots,
    close: async (opts: { killSandboxes?: boolean } = {}) => {
      if (opts.killSandboxes) await sandboxes.closeAndKill();
      else await sandboxes.close();
      db.close();
    },
  };
}
