/**
 * Pause and resume of one sandbox, as the service sequences them (docs/api.md#pause-and-resume): under the
 * sandbox's lock, with admission for the copy or the restore, the VM's teardown once its state is safe in its
 * pause layer (pause-layer.ts writes it; paused-state.ts is the record side), and a restore under the same id,
 * network and limits on resume. A restart completes a pause whose layer was published (finishPublished).
 */

import path from "node:path";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { MAX_SANDBOX_TIMEOUT_MS } from "../../common/limits.js";
import type { ForkdPaths } from "../../common/paths.js";
import {
  type CgroupLayout,
  createSandboxCgroups,
  removeCgroups,
  sandboxCgroupDirs,
} from "../../isolation/cgroup.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import { resolveChain } from "../../store/chain.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import { prepareRestore, type RestorePlan, trustPauseLayer } from "../machines/restore-plan.js";
import { Sandbox } from "../machines/sandbox-vm.js";
import type { SandboxNetworks } from "../networks/sandbox-networks.js";
import type { PauseOutcome, PauseRequest, ResumeRequest, SandboxInfo } from "../sandbox-service.js";
import type { Brancher } from "../snapshots/branch.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { Admission } from "./admission.js";
import {
  COLD_BOOTED_REASON,
  FILESYSTEM_PAUSE_MARK,
  keepDisk,
  keptDiskExists,
  keptDiskPath,
  markKeptDiskLost,
  removeKeptDisk,
} from "./filesystem-pause.js";
import type { KeyedLock } from "./keyed-lock.js";
import { cgroupDirsOf, cgroupLimits, parseLimits } from "./limits.js";
import type { Live, LiveSandboxes } from "./live-sandboxes.js";
import { pauseLayerTag, writePauseLayer } from "./pause-layer.js";
import { keptRowUpdate, pausedRowUpdate, residentBytes, settlePaused } from "./paused-state.js";
import type { SnapshotCollection } from "./snapshot-collection.js";
import { recordSpawned } from "./spawn-children.js";
import { isIntIn } from "./spawn-request.js";
import type { Teardown } from "./teardown.js";
import type { UsageReports } from "./usage-reports.js";

export interface PauseResumeContext {
  paths: ForkdPaths;
  db: StateDb;
  live: LiveSandboxes;
  locks: KeyedLock;
  snapshots: Pick<DaemonSnapshots, "store" | "markEphemeral" | "bootable">;
  brancher: Pick<Brancher, "settled">;
  admission: Pick<Admission, "reserveMemory" | "reserveSpawn">;
  networks: Pick<SandboxNetworks, "release" | "reattach">;
  /** Where sandbox cgroups go (null: none). */
  cgroups: CgroupLayout | null;
  confinement: ConfinementConfig;
  consoleLogBytes: number;
  teardown: Pick<Teardown, "watchExit" | "markDead">;
  collection: Pick<SnapshotCollection, "now">;
  usage: Pick<UsageReports, "forgetMetrics">;
  /** The sandbox's record as the service returns it. */
  get(id: string): SandboxInfo;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

export class PauseResume {
  /** Stops of paused sandboxes' VMs (and collections after merges) still running after their pause answered. */
  private readonly background = new Set<Promise<void>>();

  constructor(private readonly ctx: PauseResumeContext) {}

  /** See SandboxService.pause; pause-layer.ts writes the layer. */
  async pause(id: string, request: PauseRequest = {}): Promise<PauseOutcome> {
    this.ctx.live.row(id);
    // Answered once the layer is durable; the lock is held until the stopped VM is gone (`stopped`), so a resume
    // or kill asked for meanwhile runs after it, never beside it.
    return this.ctx.locks.runHolding(id, async () => {
      const { outcome, stopped } = await this.pauseNow(id, request);
      return { result: outcome, hold: stopped };
    });
  }

  /**
   * A pause of `id` with its lock held (a lifetime that ends in a pause takes the lock itself). `stopped`
   * settles (never rejects) once the stopped VM, its cgroups and its network are gone: the lock must be held
   * until then.
   */
  async pauseNow(
    id: string,
    request: PauseRequest,
  ): Promise<{ outcome: PauseOutcome; stopped: Promise<void> }> {
    const { db, live, snapshots, log } = this.ctx;
    // Right after a restart: once its re-attach is settled (bounded by REATTACH_TIMEOUT_MS).
    await live.reattaching.get(id)?.catch(() => {});
    const row = live.row(id);
    if (row.status === "paused") throw conflict(`sandbox ${id} is already paused`);
    const running = live.running(id);
    if (request.memory === false) return this.pauseWithoutMemory(row, running, request);
    if (row.cold_booted === 1)
      throw conflict(`sandbox ${id} cannot be paused with memory: ${COLD_BOOTED_REASON}`);
    if (row.branch_blocked) throw conflict(`sandbox ${id} cannot be paused: ${row.branch_blocked}`);
    // A live BRANCH still writing its snapshot: the sandbox's disk already builds on it.
    await this.ctx.brancher.settled(id);
    const parentTag = row.last_branch_tag ?? row.snapshot_tag;
    const ramBytes = (await snapshots.store.get(parentTag)).manifest.memory.ramBytes;
    // The copy of its private pages is held in memory until written: at most its whole RAM.
    const buffer = this.ctx.admission.reserveMemory(ramBytes / 2 ** 20, `a pause of ${id}`);
    const tag = pauseLayerTag(id);
    const freedBytes = await residentBytes(running.handle.pid);
    db.updateSandbox(id, { status: "pausing", pending_pause_tag: tag });
    running.pausing = true;
    let layer: Awaited<ReturnType<typeof writePauseLayer>>;
    try {
      layer = await writePauseLayer(
        snapshots.store,
        { handle: running.handle, parentTag, ownLayers: JSON.parse(row.pause_tags) as string[] },
        { tag, merge: request.merge, signal: request.signal },
      );
    } catch (err) {
      running.pausing = false;
      // The VM runs again (writePauseLayer continued it), unless it died meanwhile (then it is marked dead).
      if (db.sandbox(id)?.status === "pausing") {
        db.updateSandbox(id, { status: "running", pending_pause_tag: null });
      }
      throw err;
    } finally {
      buffer.release();
    }
    this.recordPaused(row, layer.tag, layer.replaced);
    crashPoint("pause.recorded");
    await trustPauseLayer(this.ctx.paths, await snapshots.store.get(tag));
    // The call is answered now: the state is durable. The stopped VM goes next, while the caller still holds the
    // sandbox's lock (a resume or kill waits for it); a restart kills what is left of it (settlePaused).
    this.leaveLive(id, running);
    const stopped = this.inBackground(this.stopPausedVm(id, running));
    // Layers merged into this one go next (unless a snapshot depends on them), outside the lock: a resume does
    // not need them.
    if (layer.replaced.length > 0) this.inBackground(stopped.then(() => this.ctx.collection.now()));
    log.info({ id, tag, pause_ms: layer.pause_ms, merged: layer.replaced.length > 0 }, "sandbox paused");
    const outcome: PauseOutcome = {
      sandbox: this.ctx.get(id),
      tag,
      pause_ms: layer.pause_ms,
      write_ms: layer.write_ms,
      bytes_captured: layer.bytes_captured,
      bytes_stored: layer.pages * 4096,
      merged: layer.replaced.length > 0,
      freed_bytes: freedBytes,
    };
    return { outcome, stopped };
  }

  /**
   * A filesystem-only pause (filesystem-pause.ts): the disk kept, the row paused with it, the VM stopped next
   * (as pauseNow, under the caller's lock).
   */
  private async pauseWithoutMemory(
    row: SandboxRow,
    running: Live,
    request: PauseRequest,
  ): Promise<{ outcome: PauseOutcome; stopped: Promise<void> }> {
    const { db, paths, log } = this.ctx;
    const { id } = row;
    // A failed BRANCH left a layer in its chain that no snapshot owns: its disk is not one to keep.
    if (row.branch_blocked) throw conflict(`sandbox ${id} cannot be paused: ${row.branch_blocked}`);
    await this.ctx.brancher.settled(id);
    const target = keptDiskPath(paths, id);
    const freedBytes = await residentBytes(running.handle.pid);
    const started = performance.now();
    db.updateSandbox(id, { status: "pausing", pending_pause_tag: FILESYSTEM_PAUSE_MARK });
    running.pausing = true;
    let kept: Awaited<ReturnType<typeof keepDisk>>;
    try {
      kept = await keepDisk(running.handle, target, request.signal);
    } catch (err) {
      running.pausing = false;
      if (db.sandbox(id)?.status === "pausing") {
        db.updateSandbox(id, { status: "running", pending_pause_tag: null });
      }
      throw err;
    }
    db.updateSandbox(id, keptRowUpdate(target));
    crashPoint("pause.recorded");
    this.leaveLive(id, running);
    const stopped = this.inBackground(this.stopPausedVm(id, running));
    log.info({ id, kept_disk: target, pause_ms: round1(kept.pause_ms) }, "sandbox paused (filesystem only)");
    const outcome: PauseOutcome = {
      sandbox: this.ctx.get(id),
      tag: path.basename(path.dirname(target)),
      pause_ms: round1(kept.pause_ms),
      write_ms: round1(performance.now() - started),
      bytes_captured: 0,
      bytes_stored: kept.bytes,
      merged: false,
      freed_bytes: freedBytes,
    };
    return { outcome, stopped };
  }

  /**
   * The database's side of a published pause layer, as one step: the sandbox is paused in `tag` (which layers
   * are its own, what its chain is). Also what a restart does for a pause that published its layer and crashed.
   */
  private recordPaused(row: SandboxRow, tag: string, replaced: readonly string[]): void {
    this.ctx.snapshots.markEphemeral(tag, `the paused state of ${row.id}`);
    this.ctx.db.updateSandbox(row.id, pausedRowUpdate(row, tag, replaced));
  }

  /** Resolves once the VMs of paused sandboxes are gone (the daemon closing waits for them). */
  async settled(): Promise<void> {
    while (this.background.size > 0) await Promise.allSettled([...this.background]);
  }

  /** Tracks `work` until it settles (the daemon closing waits for it); the returned promise never rejects. */
  private inBackground(work: Promise<unknown>): Promise<void> {
    const tracked: Promise<void> = work
      .then(
        () => {},
        (err: unknown) =>
          this.ctx.log.warn({ err: errorMessage(err) }, "could not finish stopping a paused sandbox's VM"),
      )
      .finally(() => this.background.delete(tracked));
    this.background.add(tracked);
    return tracked;
  }

  /** A paused sandbox takes no more calls into its guest, and its VM's end is not a death. */
  private leaveLive(id: string, running: Live): void {
    running.killing = true;
    this.ctx.live.delete(id);
  }

  /** The VM of a sandbox whose state is safe in its pause layer goes, and with it its RAM and cgroup. */
  private async stopPausedVm(id: string, running: Live): Promise<void> {
    const { db, log } = this.ctx;
    await running.handle.destroy();
    const row = db.sandbox(id);
    if (row) {
      await removeCgroups(cgroupDirsOf(row)).catch((e: unknown) =>
        log.warn({ id, err: errorMessage(e) }, "could not remove a paused sandbox's cgroups"),
      );
    }
    db.updateSandbox(id, { pid: null, pid_start_time: null, cgroup: null });
    this.ctx.networks.release(id);
    this.ctx.usage.forgetMetrics(id);
  }

  /**
   * A pause whose layer was published before the daemon died completes: the database records it, the stopped VM
   * goes (it shares its disk file with the layer, so it must never run again). False when nothing was published.
   */
  async finishPublished(row: SandboxRow): Promise<boolean> {
    const { store } = this.ctx.snapshots;
    const tag = row.pending_pause_tag;
    if (tag === FILESYSTEM_PAUSE_MARK) return this.finishKeptDisk(row);
    if (tag === null || !(await store.exists(tag))) return false;
    const layer = await store.get(tag);
    const own = JSON.parse(row.pause_tags) as string[];
    const merged = own.length > 0 && layer.manifest.parent?.tag !== own.at(-1);
    this.recordPaused(row, tag, merged ? own : []);
    await settlePaused(this.ctx.db, row);
    this.ctx.log.info({ id: row.id, tag }, "finished a pause the previous daemon had published");
    return true;
  }

  /** A filesystem-only pause whose disk was published before the daemon died completes; else nothing is left of it. */
  private async finishKeptDisk(row: SandboxRow): Promise<boolean> {
    const target = keptDiskPath(this.ctx.paths, row.id);
    if (!(await keptDiskExists(target))) {
      await removeKeptDisk(target);
      return false;
    }
    this.ctx.db.updateSandbox(row.id, keptRowUpdate(target));
    await settlePaused(this.ctx.db, row);
    this.ctx.log.info({ id: row.id }, "finished a filesystem-only pause the previous daemon had published");
    return true;
  }

  /** See SandboxService.resume: restored like a spawn (Sandbox.restore), from its pause layer, under its id. */
  async resume(id: string, request: ResumeRequest = {}): Promise<SandboxInfo> {
    this.ctx.live.row(id);
    if (request.timeoutMs !== undefined && !isIntIn(request.timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    return this.ctx.locks.run(id, () => this.resumeNow(id, request));
  }

  private async resumeNow(id: string, request: ResumeRequest): Promise<SandboxInfo> {
    const { db } = this.ctx;
    const row = this.ctx.live.row(id);
    if (row.status === "running") throw conflict(`sandbox ${id} is already running`);
    if (row.status === "dead")
      throw conflict(`sandbox ${id} is dead, not paused: ${row.error ?? "its VM exited"}`);
    if (row.status !== "paused") throw conflict(`sandbox ${id} is ${row.status}, not paused`);
    checkResumeMemory(row, request.memory);
    if (row.kept_disk !== null) return this.resumeByColdBoot(row, keptDiskPath(this.ctx.paths, id), request);
    const tag = (JSON.parse(row.pause_tags) as string[]).at(-1) ?? row.last_branch_tag;
    if (!tag) throw new ForkdError("internal", `paused sandbox ${id} has no pause layer recorded`);
    const timeoutMs = request.timeoutMs ?? row.timeout_ms ?? 0;
    const reservation = this.ctx.admission.reserveSpawn(1);
    let plan: RestorePlan | undefined;
    db.updateSandbox(id, { status: "resuming" });
    crashPoint("resume.started");
    try {
      const snapshot = await this.ctx.snapshots.bootable(tag);
      plan = await prepareRestore(this.ctx.paths, snapshot, {
        inMemory: row.live_fork === 1,
        memoryTag: row.memory_tag ?? row.snapshot_tag,
      });
      const sandbox = await this.restoreVm(row, plan, snapshot, request.signal);
      crashPoint("resume.restored");
      this.recordResumed(sandbox, timeoutMs, {
        memory_tag: plan.memoryTag === row.snapshot_tag ? null : plan.memoryTag,
      });
    } catch (err) {
      await this.revertResume(id);
      throw err;
    } finally {
      reservation.release();
      await plan?.dispose();
    }
    crashPoint("resume.recorded");
    this.ctx.log.info({ id, tag }, "sandbox resumed");
    return this.ctx.get(id);
  }

  /** A filesystem-only pause's resume: a cold boot on the kept disk, under its id, network, limits and tokens. */
  private async resumeByColdBoot(
    row: SandboxRow,
    keptDisk: string,
    request: ResumeRequest,
  ): Promise<SandboxInfo> {
    const { db } = this.ctx;
    const { id } = row;
    if (!(await keptDiskExists(keptDisk))) {
      const why = await markKeptDiskLost(this.ctx.paths, db, row, "at its resume", (r, w) =>
        this.ctx.teardown.markDead(r, w),
      );
      this.ctx.log.warn({ id }, why);
      throw conflict(`sandbox ${id} cannot be resumed: ${why}`, { status: "dead" });
    }
    const timeoutMs = request.timeoutMs ?? row.timeout_ms ?? 0;
    const reservation = this.ctx.admission.reserveSpawn(1);
    db.updateSandbox(id, { status: "resuming" });
    crashPoint("resume.started");
    try {
      const chain = await resolveChain(this.ctx.snapshots.store, row.last_branch_tag ?? row.snapshot_tag);
      const snapshot = chain[chain.length - 1] as StoredSnapshot;
      const nic = await this.ctx.networks.reattach(id, row.network, snapshot.manifest.machine.nic ?? null);
      const limits = parseLimits(row);
      const cgroups = await this.freshCgroups(id, limits);
      const sandbox = await Sandbox.coldBoot(this.ctx.paths, {
        id,
        snapshot,
        chain,
        disk: keptDisk,
        outliveHost: true,
        signal: request.signal,
        nic,
        confinement: this.ctx.confinement,
        cgroups,
        diskLimitBytes: limits.disk_mib === null ? undefined : limits.disk_mib * 2 ** 20,
        consoleLogBytes: this.ctx.consoleLogBytes,
        onSpawned: async (pid) => {
          await recordSpawned(this.ctx.db, id, pid);
          crashPoint("resume.launched");
        },
      });
      crashPoint("resume.restored");
      this.recordResumed(sandbox, timeoutMs, { kept_disk: null, cold_booted: 1, memory_tag: null });
    } catch (err) {
      await this.revertResume(id);
      throw stillPaused(id, err);
    } finally {
      reservation.release();
    }
    // A crash from here on leaves the kept name behind: the next daemon's start sweeps it (reattach.ts).
    crashPoint("resume.recorded");
    // The running VM holds the disk through its run directory's link; the kept name goes.
    await removeKeptDisk(keptDisk).catch(() => {});
    this.ctx.log.info({ id }, "sandbox resumed by a cold boot (filesystem-only pause)");
    return this.ctx.get(id);
  }

  /** The resumed VM recorded as running (its timeout restarted from now), served and watched. */
  private recordResumed(sandbox: Sandbox, timeoutMs: number, fields: Partial<Omit<SandboxRow, "id">>): void {
    this.ctx.db.updateSandbox(sandbox.id, {
      ...fields,
      status: "running",
      memory_image: sandbox.memoryImage,
      ready_ms: round1(sandbox.readyMs),
      timeout_ms: timeoutMs === 0 ? null : timeoutMs,
      expires_at_unix_ms: timeoutMs === 0 ? null : Date.now() + timeoutMs,
      paused_at_unix_ms: null,
    });
    this.ctx.live.add(sandbox);
    this.ctx.teardown.watchExit(sandbox);
  }

  /** Fresh cgroups with the sandbox's limits (recorded before they are made, as at spawn); none without cgroups. */
  private async freshCgroups(id: string, limits: ReturnType<typeof parseLimits>) {
    if (!this.ctx.cgroups) return undefined;
    this.ctx.db.updateSandbox(id, { cgroup: JSON.stringify(sandboxCgroupDirs(this.ctx.cgroups, id)) });
    return createSandboxCgroups(this.ctx.cgroups, id, cgroupLimits(limits));
  }

  /** The paused sandbox's VM restored from `plan` under its id, in its network and its limits' fresh cgroups. */
  private async restoreVm(
    row: SandboxRow,
    plan: RestorePlan,
    snapshot: StoredSnapshot,
    signal: AbortSignal | undefined,
  ): Promise<Sandbox> {
    const { id } = row;
    const nic = await this.ctx.networks.reattach(id, row.network, snapshot.manifest.machine.nic ?? null);
    // The limits it was spawned with, in fresh cgroups (recorded before they are made, as at spawn).
    const limits = parseLimits(row);
    const cgroups = await this.freshCgroups(id, limits);
    return Sandbox.restore(this.ctx.paths, plan, {
      id,
      outliveHost: true,
      signal,
      nic,
      confinement: this.ctx.confinement,
      cgroups,
      diskLimitBytes: limits.disk_mib === null ? undefined : limits.disk_mib * 2 ** 20,
      consoleLogBytes: this.ctx.consoleLogBytes,
      onSpawned: async (pid) => {
        await recordSpawned(this.ctx.db, id, pid);
        crashPoint("resume.launched");
      },
    });
  }

  /** A resume that did not finish leaves the sandbox paused, as before it, with nothing of the attempt left. */
  private async revertResume(id: string): Promise<void> {
    const row = this.ctx.db.sandbox(id);
    if (!row) return;
    await settlePaused(this.ctx.db, row);
    this.ctx.networks.release(id);
  }
}

/** A cold boot that failed (its boot, or the template's start or ready in it): the answer says what is left. */
function stillPaused(id: string, err: unknown): ForkdError {
  return new ForkdError(
    err instanceof ForkdError ? err.code : "internal",
    `${errorMessage(err)}\nsandbox ${id} was not resumed: it stays paused on its kept disk (its files as the ` +
      "failed boot left them)",
    { cause: err, detail: err instanceof ForkdError ? err.detail : undefined },
  );
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}

/**
 * A resume asking for memory (E2B's memory: true) of a sandbox paused without it is 400: it can only cold-boot.
 * One asking for a cold boot (false) of a sandbox paused with memory is 501: its disk was not synced by the guest
 * when it paused, so a cold boot of it could miss the latest writes.
 */
function checkResumeMemory(row: SandboxRow, memory: boolean | undefined): void {
  if (row.kept_disk !== null && memory === true) {
    throw invalidArgument(
      `sandbox ${row.id} was paused with memory: false (filesystem only): it has no memory to restore and ` +
        "resumes by a cold boot; omit memory or send false",
    );
  }
  if (row.kept_disk === null && memory === false) {
    throw new ForkdError(
      "not_implemented",
      `sandbox ${row.id} was paused with its memory: resuming it by a cold boot (memory: false, onResume ` +
        "'reboot') is not supported by forkd; omit memory to restore it as it was, or pause with memory: false",
    );
  }
}
