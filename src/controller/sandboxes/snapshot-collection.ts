/**
 * The daemon's own snapshots (pause layers, fork points, superseded named branches) are deleted once no
 * sandbox or snapshot needs them: at once after a kill or a merge, and by the sweep when asked or every
 * EPHEMERAL_COLLECTION_INTERVAL_MS. Which sandboxes need a snapshot is read from their records.
 */

import { errorMessage } from "../../common/errors.js";
import type { StateDb } from "../../store/db.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";

/** How often (at most, unless a kill or fork asked sooner) unused fork points are looked for and deleted. */
export const EPHEMERAL_COLLECTION_INTERVAL_MS = 60_000;

export interface SnapshotCollectionContext {
  snapshots: Pick<DaemonSnapshots, "collectEphemeral">;
  log: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

export class SnapshotCollection {
  private requested = false;
  private last = 0;

  constructor(private readonly ctx: SnapshotCollectionContext) {}

  /** Asks the next sweep to delete the daemon's own snapshots that nothing needs any more. */
  request(): void {
    this.requested = true;
  }

  /** Deletes the daemon's own snapshots nothing needs any more (pause layers, fork points) now. */
  async now(): Promise<void> {
    const deleted = await this.ctx.snapshots.collectEphemeral().catch((err: unknown) => {
      this.ctx.log.warn({ err: errorMessage(err) }, "could not delete unused snapshots");
      return [] as string[];
    });
    if (deleted.length > 0) this.ctx.log.info({ tags: deleted }, "deleted snapshots nothing needs any more");
  }

  /** The sweep's part: collects when asked to or when the interval has passed (a failure is the sweep's). */
  async ifDue(now: number): Promise<void> {
    if (!this.requested && now - this.last <= EPHEMERAL_COLLECTION_INTERVAL_MS) return;
    this.requested = false;
    this.last = now;
    const deleted = await this.ctx.snapshots.collectEphemeral();
    if (deleted.length > 0) this.ctx.log.info({ tags: deleted }, "deleted snapshots nothing needs any more");
  }
}

/** Sandboxes (not dead) that depend on snapshot `tag`: restored from it or from a descendant, or branched into it. */
export function sandboxesUsing(db: Pick<StateDb, "sandboxes" | "workspaces">, tag: string): string[] {
  // A workspace's sandbox that died keeps its layers: resuming the workspace starts again from them.
  const workspaceSandboxes = new Set(db.workspaces().map((w) => w.sandbox_id));
  return db
    .sandboxes()
    .filter(
      (r) =>
        (r.status !== "dead" || workspaceSandboxes.has(r.id)) &&
        (r.snapshot_tag === tag || (JSON.parse(r.layer_tags) as string[]).includes(tag)),
    )
    .map((r) => r.id);
}
