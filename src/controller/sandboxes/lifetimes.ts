/**
 * Sandboxes' lifetimes: setting and extending them, and the sweep that enforces them every SWEEP_INTERVAL_MS (a
 * lifetime ends in a kill or a pause, its `on_timeout`), notices adopted VMs that died (no exit event for a
 * process we did not start), and deletes the daemon's snapshots nothing needs when that is due.
 */

import { errorMessage, invalidArgument } from "../../common/errors.js";
import { MAX_SANDBOX_TIMEOUT_MS } from "../../common/limits.js";
import { isAlive } from "../../common/processes.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { SandboxInfo } from "../sandbox-service.js";
import { AdoptedSandbox } from "./adopted-sandbox.js";
import type { KeyedLock } from "./keyed-lock.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import type { PauseResume } from "./pause-resume.js";
import type { SnapshotCollection } from "./snapshot-collection.js";
import { isIntIn } from "./spawn-request.js";
import type { Teardown } from "./teardown.js";

/** How often lifetimes are enforced and dead VMs noticed. */
export const SWEEP_INTERVAL_MS = 1000;
/** A lifetime that ended in a pause that failed is tried again this much later (the sandbox keeps running). */
export const TIMEOUT_PAUSE_RETRY_MS = 60_000;

export interface LifetimesContext {
  db: Pick<StateDb, "sandbox" | "sandboxes" | "updateSandbox" | "deleteSandbox">;
  live: LiveSandboxes;
  locks: KeyedLock;
  pauseResume: Pick<PauseResume, "pauseNow">;
  teardown: Pick<Teardown, "destroy" | "markDead" | "whyItExited">;
  collection: Pick<SnapshotCollection, "now" | "ifDue">;
  /** The sandbox's record as the service returns it. */
  get(id: string): SandboxInfo;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

export class Lifetimes {
  private sweeper: NodeJS.Timeout | undefined;
  /** Sandboxes whose lifetime ended and whose pause or kill is under way (the sweep starts each once). */
  private readonly timingOut = new Set<string>();

  constructor(private readonly ctx: LifetimesContext) {}

  /** Sets the remaining lifetime of running sandbox `id` to `timeoutMs` from now (0 = no limit). */
  set(id: string, timeoutMs: number): SandboxInfo {
    if (!isIntIn(timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    this.ctx.live.running(id);
    this.ctx.db.updateSandbox(id, {
      expires_at_unix_ms: timeoutMs === 0 ? null : Date.now() + timeoutMs,
      timeout_ms: timeoutMs === 0 ? null : timeoutMs,
    });
    return this.ctx.get(id);
  }

  /** Lets running sandbox `id` live at least `timeoutMs` from now; never shortens it. */
  extend(id: string, timeoutMs: number): SandboxInfo {
    if (!isIntIn(timeoutMs, 1, MAX_SANDBOX_TIMEOUT_MS)) {
      throw invalidArgument(`timeout_ms must be an integer in 1..${MAX_SANDBOX_TIMEOUT_MS}`);
    }
    this.ctx.live.running(id);
    const current = this.ctx.live.row(id).expires_at_unix_ms;
    if (current !== null) {
      this.ctx.db.updateSandbox(id, { expires_at_unix_ms: Math.max(current, Date.now() + timeoutMs) });
    }
    return this.ctx.get(id);
  }

  /** Sweeps every `intervalMs` until stopped (the timer does not keep the process alive). */
  start(intervalMs: number): void {
    this.sweeper = setInterval(() => {
      this.sweep().catch((err) => this.ctx.log.warn({ err: errorMessage(err) }, "sweep failed"));
    }, intervalMs);
    this.sweeper.unref();
  }

  stop(): void {
    if (this.sweeper) clearInterval(this.sweeper);
  }

  private async sweep(): Promise<void> {
    const now = Date.now();
    for (const row of this.ctx.db.sandboxes()) {
      if (row.status !== "running") continue;
      if (row.expires_at_unix_ms !== null && row.expires_at_unix_ms <= now) {
        this.endLifetime(row);
        continue;
      }
      const live = this.ctx.live.get(row.id);
      // Not our child, so no exit event: its identity (a zombie or a reused pid is not it) says whether it lives.
      if (live?.handle instanceof AdoptedSandbox && !(await isAlive(live.handle.identity))) {
        await this.ctx.teardown.markDead(row, await this.ctx.teardown.whyItExited(row, "its VM exited"));
      }
    }
    await this.ctx.collection.ifDue(now);
  }

  /**
   * A lifetime ran out: the sandbox is paused or killed (its `on_timeout`), in the background, once. A pause that
   * fails leaves it running and is tried again TIMEOUT_PAUSE_RETRY_MS later: a timeout never loses its state.
   */
  private endLifetime(row: SandboxRow): void {
    if (this.timingOut.has(row.id)) return;
    this.timingOut.add(row.id);
    (row.on_timeout === "pause" ? this.pauseExpired(row) : this.killExpired(row))
      .catch((err: unknown) =>
        this.ctx.log.warn({ id: row.id, err: errorMessage(err) }, "lifetime end failed"),
      )
      .finally(() => this.timingOut.delete(row.id));
  }

  /** `row`'s record now, if it still runs with its lifetime over (a kill, pause or extension may have come first). */
  private stillExpired(row: SandboxRow): SandboxRow | undefined {
    const current = this.ctx.db.sandbox(row.id);
    return current?.status === "running" && (current.expires_at_unix_ms ?? Infinity) <= Date.now()
      ? current
      : undefined;
  }

  private async pauseExpired(row: SandboxRow): Promise<void> {
    const { db, log } = this.ctx;
    try {
      await this.ctx.locks.run(row.id, async () => {
        // Nobody waits for this pause's answer: the lock is held until its VM is gone, as a pause call's is.
        if (this.stillExpired(row)) {
          const memory = row.auto_pause_memory === 0 ? false : undefined;
          await (await this.ctx.pauseResume.pauseNow(row.id, { memory })).stopped;
        }
      });
      log.info({ id: row.id }, "lifetime ended: paused");
    } catch (err) {
      if (db.sandbox(row.id)?.status === "running") {
        db.updateSandbox(row.id, { expires_at_unix_ms: Date.now() + TIMEOUT_PAUSE_RETRY_MS });
      }
      log.warn({ id: row.id, err: errorMessage(err) }, "lifetime ended, but the pause failed");
    }
  }

  private async killExpired(row: SandboxRow): Promise<void> {
    await this.ctx.locks.run(row.id, async () => {
      const current = this.stillExpired(row);
      if (!current) return;
      await this.ctx.teardown.destroy(current, "lifetime expired");
      this.ctx.db.deleteSandbox(row.id);
    });
    await this.ctx.collection.now();
  }
}
