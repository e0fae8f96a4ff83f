/**
 * A daemon's start-up: the database reconciled with what actually runs. Sandboxes whose VM is gone are marked
 * dead at once; pauses and resumes a crash interrupted are settled; the daemon's own transient sandboxes go;
 * the survivors are re-attached in the background, several at a time with a short deadline each
 * (REATTACH_TIMEOUT_MS), so the API serves meanwhile and one unresponsive guest delays nobody: a call to a
 * sandbox waits only for that sandbox's re-attach, and what cannot wait (setTimeout, branch) answers 503
 * "re-attaching". What dead processes left in the run directory is removed first; kept disks (filesystem-only
 * pauses) no paused sandbox owns go once the records are settled, and a paused sandbox whose kept disk is gone
 * is marked dead as lost.
 */

import { readdir, rm, rmdir } from "node:fs/promises";
import path from "node:path";
import { errorMessage, ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import {
  currentBootId,
  OWNER_TOKEN_PATTERN,
  ownerTokenAlive,
  type ProcessIdentity,
} from "../../common/processes.js";
import { type CgroupLayout, sweepCgroups } from "../../isolation/cgroup.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { SnapshotStore } from "../../store/snapshot-store.js";
import { isOurProcess, processesMentioning, recordedIdentity } from "../host/processes.js";
import { CHILD_READY_TIMEOUT_MS } from "../machines/sandbox-vm.js";
import type { SandboxNetworks } from "../networks/sandbox-networks.js";
import { interruptedBranchTag } from "../snapshots/branch.js";
import { AdoptedSandbox } from "./adopted-sandbox.js";
import { keptDiskExists, keptDiskPath, markKeptDiskLost, sweepKeptDisks } from "./filesystem-pause.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import type { PauseResume } from "./pause-resume.js";
import { settlePaused } from "./paused-state.js";
import type { Teardown } from "./teardown.js";

/** Sandboxes re-attached at once after a restart (QMP and one agent round trip each; mostly waiting). */
export const REATTACH_CONCURRENCY = 8;
/** meta key: the boot the recorded pids and start times belong to. */
const BOOT_ID_KEY = "boot_id";

export interface ReattachContext {
  paths: ForkdPaths;
  db: StateDb;
  live: LiveSandboxes;
  teardown: Pick<Teardown, "destroy" | "markDead">;
  pauseResume: Pick<PauseResume, "finishPublished">;
  networks: Pick<SandboxNetworks, "reconcile">;
  store: Pick<SnapshotStore, "get">;
  /** Where sandbox cgroups go (null: none). */
  cgroups: CgroupLayout | null;
  consoleLogBytes: number;
  /** Whether the manager closed meanwhile (then what a re-attach adopts is let go at once). */
  closed(): boolean;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

/** A sandbox whose VM still runs after a restart, with the identity it was recorded under. */
interface Survivor {
  row: SandboxRow;
  identity: ProcessIdentity;
}

export class Reattach {
  /** Resolves once every sandbox found running at start-up is re-attached or marked dead (tests, shutdown). */
  reattached: Promise<void> = Promise.resolve();

  constructor(private readonly ctx: ReattachContext) {}

  /** Reconciles the records with the processes, then starts re-attaching the survivors (see `reattached`). */
  async reconcile(): Promise<void> {
    const { db } = this.ctx;
    await this.sweepRunDir();
    // Start times count from boot: recorded ones belong to the boot the database last saw (unknown = this one).
    const recordedBoot = db.meta(BOOT_ID_KEY) ?? currentBootId();
    const paused = new Set<string>();
    const survivors: Survivor[] = [];
    for (const row of db.sandboxes()) {
      if (row.status === "dead") continue;
      const found = await this.settle(row, recordedBoot);
      if (found === "paused") paused.add(row.id);
      else if (found !== null) survivors.push(found);
    }
    await this.sweepKeptDisks();
    // Networks of sandboxes that did not survive were removed by markDead; this catches records without one.
    // Paused sandboxes keep theirs (a host reboot removed the namespace: resume makes it again).
    const survivorIds = new Set(survivors.map((s) => s.row.id));
    await this.ctx.networks.reconcile(survivorIds, paused);
    if (this.ctx.cgroups) {
      const busy = await sweepCgroups(this.ctx.cgroups, survivorIds);
      if (busy.length > 0)
        this.ctx.log.warn({ cgroups: busy }, "cgroups of no known sandbox still hold processes");
    }
    db.setMeta(BOOT_ID_KEY, currentBootId());
    this.reattached = this.reattachAll(survivors);
  }

  /**
   * What a restart makes of one record: paused (a pause that published its layer completes, an unfinished
   * resume is undone), a survivor to re-attach, or nothing (gone, transient, or marked dead).
   */
  private async settle(row: SandboxRow, recordedBoot: string): Promise<Survivor | "paused" | null> {
    const { db, teardown } = this.ctx;
    const owner = db.transientSandboxOwner(row.id);
    if (owner !== undefined) {
      await teardown.destroy(row, `its ${owner} ended with the daemon`);
      db.deleteSandbox(row.id);
      return null;
    }
    const identity = recordedIdentity(row.pid, row.pid_start_time, recordedBoot);
    const alive = identity !== null && (await isOurProcess(identity, row.run_dir));
    if (row.status === "pausing") {
      if (await this.ctx.pauseResume.finishPublished(row)) return "paused";
      // Its layer was never published: the VM was only stopped, and runs on (continued once adopted).
      db.updateSandbox(row.id, { status: "running", pending_pause_tag: null });
      row.status = "running";
    }
    // A resume that did not finish is undone: the sandbox is paused, as it was before.
    if (row.status === "paused" || row.status === "resuming") {
      await settlePaused(db, row);
      if (row.kept_disk !== null && !(await keptDiskExists(keptDiskPath(this.ctx.paths, row.id)))) {
        const why = await markKeptDiskLost(this.ctx.paths, db, row, "at the daemon's start", (r, w) =>
          teardown.markDead(r, w),
        );
        this.ctx.log.warn({ id: row.id, kept_disk: row.kept_disk }, why);
        return null;
      }
      return "paused";
    }
    if (row.status !== "running" || !alive || identity === null) {
      const why =
        row.status === "starting"
          ? "the daemon stopped while it was being spawned"
          : "its VM was gone after a daemon restart";
      await teardown.markDead(row, why);
      return null;
    }
    return { row, identity };
  }

  private async reattachAll(survivors: Survivor[]): Promise<void> {
    const { reattaching } = this.ctx.live;
    const done = new Map<string, () => void>();
    for (const { row } of survivors) {
      reattaching.set(row.id, new Promise<void>((resolve) => done.set(row.id, resolve)));
    }
    let next = 0;
    const worker = async () => {
      while (next < survivors.length) {
        const { row, identity } = survivors[next++] as Survivor;
        try {
          await this.reattach(row, identity);
        } finally {
          reattaching.delete(row.id);
          done.get(row.id)?.();
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(REATTACH_CONCURRENCY, survivors.length) }, worker));
  }

  private async reattach(row: SandboxRow, identity: ProcessIdentity): Promise<void> {
    const { db } = this.ctx;
    try {
      if (row.memory_image === null) throw new ForkdError("internal", "no memory image recorded");
      const handle = await AdoptedSandbox.adopt(
        { ...row, identity, memory_image: row.memory_image },
        { callTimeoutMs: CHILD_READY_TIMEOUT_MS[row.accelerator], consoleLogBytes: this.ctx.consoleLogBytes },
      );
      if (!db.sandbox(row.id) || this.ctx.closed()) {
        // Killed (or the manager closed) while it was being re-attached.
        if (this.ctx.closed()) handle.release();
        else await handle.destroy();
        return;
      }
      this.ctx.live.add(handle);
      await this.settleInterruptedBranch(row);
      this.ctx.log.info({ id: row.id, pid: row.pid }, "re-attached sandbox");
    } catch (err) {
      const current = db.sandbox(row.id);
      if (current)
        await this.ctx.teardown.markDead(
          current,
          `could not re-attach after a daemon restart: ${errorMessage(err)}`,
        );
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
    const committed = await this.ctx.store.get(tag).then(
      () => true,
      () => false,
    );
    if (committed) this.ctx.db.updateSandbox(row.id, { branch_blocked: null });
  }

  /** Kept disks of no paused sandbox go (settle has finished or undone every interrupted pause and resume). */
  private async sweepKeptDisks(): Promise<void> {
    const keep = new Set(
      this.ctx.db
        .sandboxes()
        .filter((r) => r.status === "paused" && r.kept_disk !== null)
        .map((r) => r.id),
    );
    const { removed, foreign } = await sweepKeptDisks(this.ctx.paths, keep);
    if (removed.length > 0) this.ctx.log.info({ removed }, "removed kept disks no paused sandbox owns");
    if (foreign.length > 0) {
      this.ctx.log.warn(
        { entries: foreign },
        "kept-disks holds entries not named like a sandbox; left alone",
      );
    }
  }

  /**
   * Removes what dead processes left in the run directory: overlay templates of spawns that never finished,
   * and directories of VMs no record knows about (their processes are killed first).
   */
  private async sweepRunDir(): Promise<void> {
    const { paths } = this.ctx;
    const known = new Set(this.ctx.db.sandboxes().map((r) => path.basename(r.run_dir)));
    const templates = path.join(paths.run, ".templates");
    for (const name of await readdir(templates).catch(() => [] as string[])) {
      const owner = new RegExp(`-${OWNER_TOKEN_PATTERN}-[0-9a-f]+\\.qcow2$`).exec(name);
      const token = owner ? `${owner[1]}.${owner[2]}.${owner[3]}` : null;
      if (token === null || !(await ownerTokenAlive(token))) {
        await rm(path.join(templates, name), { force: true });
      }
    }
    await rmdir(templates).catch(() => {});
    for (const name of await readdir(paths.run).catch(() => [] as string[])) {
      if (known.has(name) || name.startsWith(".")) continue;
      const dir = path.join(paths.run, name);
      // A parent being snapshotted by a CLI process also lives here; leave directories whose VM still runs.
      if ((await processesMentioning(dir)).length > 0) continue;
      await rm(dir, { recursive: true, force: true });
    }
  }
}
