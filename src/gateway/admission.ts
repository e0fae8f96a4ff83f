/**
 * Cluster-wide admission per tenant (`forkd gateway --tenant-max-sandboxes N`): a tenant holds at most N
 * sandboxes across all nodes, counting the ones the directory knows (not dead, not lost) and the children of
 * this gateway's spawns and forks still in flight. Admins have no limit. Each gateway replica counts what it
 * sees: two replicas admitting at the same instant can overshoot by what they have in flight, never more
 * (the directories converge within a stream's poll).
 */
import { ForkdError } from "../common/errors.js";
import type { ClusterView } from "./cluster-view.js";
import type { Directory } from "./directory.js";

export class TenantAdmission {
  private readonly inFlight = new Map<string, number>();

  constructor(
    private readonly directory: Directory,
    private readonly view: ClusterView,
    private readonly maxSandboxes: number | undefined,
  ) {}

  /** Sandboxes `tenant` holds now across the cluster. */
  held(tenant: string): number {
    return this.directory
      .all()
      .filter((p) => p.owner === tenant && p.status !== "dead" && !this.view.isLost(p.node, p.epoch).lost)
      .length;
  }

  /** Reserves `n` for `tenant` or throws 429; the caller releases once its spawn answered. */
  reserve(tenant: string | null, n: number): () => void {
    if (tenant === null || this.maxSandboxes === undefined) return () => {};
    const flying = this.inFlight.get(tenant) ?? 0;
    const held = this.held(tenant);
    if (held + flying + n > this.maxSandboxes) {
      throw new ForkdError(
        "too_many_requests",
        `tenant ${tenant} holds ${held} sandbox${held === 1 ? "" : "es"}${flying > 0 ? ` (${flying} starting)` : ""} ` +
          `across the cluster; ${n} more would pass its limit of ${this.maxSandboxes}`,
      );
    }
    this.inFlight.set(tenant, flying + n);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.inFlight.get(tenant) ?? 0) - n;
      if (left > 0) this.inFlight.set(tenant, left);
      else this.inFlight.delete(tenant);
    };
  }
}
