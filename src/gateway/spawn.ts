/**
 * A spawn through the gateway: resolve the snapshot, place the children (placement.ts: where the snapshot is,
 * best-of-K, spilling over, pulling where needed), send each node its share as the caller's tenant, and record
 * every child in the directory. All or none, as on a single daemon: when one node's share fails, the children
 * the others made are killed again. A share refused before it reached its node (connection refused) is placed
 * once more elsewhere.
 */
import type { Logger } from "pino";
import type { SandboxRef } from "../cluster/protocol.js";
import type { TenantAdmission } from "./admission.js";
import type { Directory } from "./directory.js";
import { type NodeCaller, notDelivered } from "./node-calls.js";
import type { Placer, Share, SnapshotTarget } from "./placement.js";

/** A sandbox as a node answers a forkd spawn (the wire's SandboxInfo: what the gateway reads of it). */
export type SpawnedSandbox = SandboxRef & Record<string, unknown>;

export interface ChildOnNode<T> {
  node: string;
  value: T;
}

export class Spawner {
  constructor(
    private readonly placer: Placer,
    private readonly calls: NodeCaller,
    private readonly directory: Directory,
    private readonly admission: TenantAdmission,
    private readonly logger: Logger,
  ) {}

  /**
   * Places `n` children of `target` and runs `spawnOn` for each node's share; returns every child with its
   * node. `idsOf` names the sandboxes a share's answer made (for the directory and the all-or-none cleanup).
   */
  async spawn<T>(
    tenant: string | null,
    target: SnapshotTarget,
    n: number,
    spawnOn: (share: Share) => Promise<T>,
    refsOf: (answer: T) => SandboxRef[],
    options: { tenantReserved?: boolean } = {},
  ): Promise<ChildOnNode<T>[]> {
    const releaseTenant = options.tenantReserved ? () => {} : this.admission.reserve(tenant, n);
    try {
      const { shares, release } = await this.placer.place(target, n);
      try {
        const settled = await Promise.allSettled(
          shares.map((share) => this.runShare(target, share, spawnOn)),
        );
        const made = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
        for (const child of made) {
          const epoch = this.calls.epochOf(child.node) ?? 0;
          for (const ref of refsOf(child.value)) this.directory.upsert(child.node, epoch, ref);
        }
        const failed = settled.find((s) => s.status === "rejected");
        if (failed) {
          await this.undo(made, refsOf, tenant);
          throw failed.reason;
        }
        return made;
      } finally {
        release();
      }
    } finally {
      releaseTenant();
    }
  }

  /** One node's share; refused before delivery, it is placed once more on another node. */
  private async runShare<T>(
    target: SnapshotTarget,
    share: Share,
    spawnOn: (share: Share) => Promise<T>,
  ): Promise<ChildOnNode<T>> {
    try {
      return { node: share.node, value: await spawnOn(share) };
    } catch (err) {
      if (!notDelivered(err)) throw err;
      this.logger.warn(
        { node: share.node, err: (err as Error).message },
        "spawn share not delivered; placing it again",
      );
      const again = await this.placer.place(target, share.count);
      try {
        const other = again.shares.find((s) => s.node !== share.node && s.count === share.count);
        if (!other) throw err;
        return { node: other.node, value: await spawnOn(other) };
      } finally {
        again.release();
      }
    }
  }

  private async undo<T>(made: ChildOnNode<T>[], refsOf: (answer: T) => SandboxRef[], tenant: string | null) {
    await Promise.allSettled(
      made.flatMap((child) =>
        refsOf(child.value).map(async (ref) => {
          await this.calls.json(child.node, { method: "DELETE", path: `/v1/sandboxes/${ref.id}` }, tenant);
          this.directory.remove(child.node, ref.id);
        }),
      ),
    );
  }
}
