/**
 * Sandboxes ending: a kill (one at a time per sandbox, after any pause or resume in progress), a VM that ended
 * on its own (the sandbox is kept as dead, with why: the OOM killer, the console's last lines), and the teardown
 * both share: the VM (ours, adopted, or a stray found by its run directory), its cgroups, its port tunnels and
 * its network.
 */

import { rm } from "node:fs/promises";
import { conflict, errorMessage, notFound } from "../../common/errors.js";
import { type CgroupLayout, readOomKills, removeCgroups } from "../../isolation/cgroup.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import { describeExit } from "../../vmm/qemu-process.js";
import { killAndWait, processesMentioning } from "../host/processes.js";
import type { Sandbox } from "../machines/sandbox-vm.js";
import type { SandboxNetworks } from "../networks/sandbox-networks.js";
import { exitConsoleTail } from "./console.js";
import { removeKeptDisk } from "./filesystem-pause.js";
import type { KeyedLock } from "./keyed-lock.js";
import { cgroupDirsOf, parseLimits } from "./limits.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import type { NetworkCalls } from "./network-calls.js";
import type { SnapshotCollection } from "./snapshot-collection.js";

export interface TeardownContext {
  db: Pick<StateDb, "sandbox" | "sandboxes" | "updateSandbox" | "deleteSandbox">;
  live: LiveSandboxes;
  locks: KeyedLock;
  /** Where sandbox cgroups go (null: none). */
  cgroups: CgroupLayout | null;
  networks: Pick<SandboxNetworks, "detach">;
  networkCalls: Pick<NetworkCalls, "closeTunnels">;
  collection: Pick<SnapshotCollection, "request" | "now">;
  /** Forgets what was sampled of a sandbox that is gone. */
  forgetSamples(id: string): void;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

export class Teardown {
  /** Kills in progress, so a concurrent kill of the same sandbox waits for the first instead of racing it. */
  private readonly killing = new Map<string, Promise<void>>();

  constructor(private readonly ctx: TeardownContext) {}

  /** Kills `id`. Of concurrent kills of one sandbox, one succeeds; the others wait for it, then get not_found. */
  async kill(id: string): Promise<void> {
    const row = this.ctx.live.row(id);
    const ongoing = this.killing.get(id);
    if (ongoing) {
      await ongoing.catch(() => {});
      throw notFound(`sandbox ${id} not found (it was just killed)`);
    }
    if (row.status === "starting") throw conflict(`sandbox ${id} is still starting; kill it once spawned`);
    // After a pause or resume in progress, whatever state that leaves it in.
    const killing = this.ctx.locks.run(id, async () => {
      // A sandbox being re-attached is killed once that is settled (bounded by REATTACH_TIMEOUT_MS).
      await this.ctx.live.reattaching.get(id);
      const current = this.ctx.db.sandbox(id);
      if (!current) return;
      await this.destroy(current, "killed");
      this.ctx.db.deleteSandbox(id);
      // Its pause layers go now, unless a snapshot depends on them (then once nothing does).
      await this.ctx.collection.now();
    });
    this.killing.set(id, killing);
    try {
      await killing;
    } finally {
      this.killing.delete(id);
    }
  }

  async killAll(filter: { snapshotTag?: string } = {}): Promise<string[]> {
    const rows = this.ctx.db
      .sandboxes()
      .filter((r) => r.status !== "starting")
      .filter((r) => filter.snapshotTag === undefined || r.snapshot_tag === filter.snapshotTag);
    await Promise.all(rows.map((r) => this.kill(r.id).catch(() => {})));
    return rows.map((r) => r.id);
  }

  /** Kills the VM (ours or adopted, or a stray found by its run directory) and removes its leftovers. */
  async destroy(row: SandboxRow, reason: string): Promise<void> {
    const { db, live, log } = this.ctx;
    const running = live.get(row.id);
    if (running) {
      running.killing = true;
      db.updateSandbox(row.id, { status: "stopping" });
      await running.handle.destroy();
      live.delete(row.id);
    } else {
      for (const identity of await processesMentioning(row.run_dir)) await killAndWait(identity);
      await rm(row.run_dir, { recursive: true, force: true });
    }
    // A filesystem-only pause's disk (or the partial one of a pause that never finished).
    if (row.kept_disk !== null) await removeKeptDisk(row.kept_disk);
    await removeCgroups(cgroupDirsOf(row)).catch((e: unknown) =>
      log.warn({ id: row.id, err: errorMessage(e) }, "could not remove a sandbox's cgroups"),
    );
    this.ctx.forgetSamples(row.id);
    this.ctx.collection.request();
    // Before its namespace goes: a tunnel to a guest that no longer exists would never finish closing.
    this.ctx.networkCalls.closeTunnels(row.id);
    await this.ctx.networks.detach(row.id);
    log.info({ id: row.id, reason }, "sandbox stopped");
  }

  /** Tears down what is left of `row`'s VM and keeps its record as dead, saying why. */
  async markDead(row: SandboxRow, error: string): Promise<void> {
    await this.destroy(row, error);
    this.ctx.db.updateSandbox(row.id, { status: "dead", error, pid: null, cgroup: null });
  }

  /** Marks `sandbox` dead when its VM ends while the daemon still serves it (not when a kill or pause ends it). */
  watchExit(sandbox: Sandbox): void {
    sandbox.vm.exited.then(async (exit) => {
      const live = this.ctx.live.get(sandbox.id);
      if (!live || live.killing) return;
      const row = this.ctx.db.sandbox(sandbox.id);
      if (row) await this.markDead(row, await this.whyItExited(row, `its VM ${describeExit(exit)}`));
    });
  }

  /**
   * Why a sandbox's VM ended on its own, for its record: the OOM killer at its memory limit if that was it,
   * and the last lines of its console (a guest panic's message), read before its run directory goes.
   */
  async whyItExited(row: SandboxRow, what: string): Promise<string> {
    const { cgroups } = this.ctx;
    const oom = cgroups ? await readOomKills(cgroups, row.id).catch(() => 0) : 0;
    const limits = parseLimits(row);
    const cause =
      oom > 0
        ? `${what}: killed by the kernel's OOM killer at its memory limit (${limits.memory_mib} MiB)`
        : what;
    const console = await exitConsoleTail(row);
    return console ? `${cause}\n--- guest console (last lines) ---\n${console}` : cause;
  }
}
