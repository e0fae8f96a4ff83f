/**
 * coordination.k8s.io/v1 Leases as forkd uses them: a node daemon holds the Lease named after its node and
 * renews it (NODE_LEASE_*), the gateway and the controller watch those Leases to tell live nodes from lost
 * ones, and the controller's replicas elect a leader with the `forkd-controller` Lease. Times are MicroTime
 * (V1MicroTime), as the API server stores them.
 */
import { CoordinationV1Api, type KubeConfig, type V1Lease, V1MicroTime } from "@kubernetes/client-node";
import { callOptions } from "./objects.js";

export type { V1Lease } from "@kubernetes/client-node";

export class Leases {
  private readonly api: CoordinationV1Api;

  constructor(
    config: KubeConfig,
    readonly namespace: string,
  ) {
    this.api = config.makeApiClient(CoordinationV1Api);
  }

  get(name: string): Promise<V1Lease> {
    return this.api.readNamespacedLease({ name, namespace: this.namespace }, callOptions());
  }

  async list(): Promise<V1Lease[]> {
    return (await this.api.listNamespacedLease({ namespace: this.namespace }, callOptions())).items;
  }

  create(name: string, holder: string, durationSeconds: number): Promise<V1Lease> {
    const now = new V1MicroTime();
    return this.api.createNamespacedLease(
      {
        namespace: this.namespace,
        body: {
          metadata: { name },
          spec: {
            holderIdentity: holder,
            leaseDurationSeconds: durationSeconds,
            acquireTime: now,
            renewTime: now,
            leaseTransitions: 0,
          },
        },
      },
      callOptions(),
    );
  }

  /**
   * Renews `lease` for `holder` from now (a lease another holder had counts one more transition). Its
   * resourceVersion makes a concurrent write a 409, so two holders never both think they renewed.
   */
  renew(lease: V1Lease, holder: string, durationSeconds: number): Promise<V1Lease> {
    const now = new V1MicroTime();
    const spec = lease.spec ?? {};
    const takeover = spec.holderIdentity !== holder;
    return this.api.replaceNamespacedLease(
      {
        name: lease.metadata?.name as string,
        namespace: this.namespace,
        body: {
          ...lease,
          spec: {
            ...spec,
            holderIdentity: holder,
            leaseDurationSeconds: durationSeconds,
            renewTime: now,
            ...(takeover
              ? { acquireTime: now, leaseTransitions: (spec.leaseTransitions ?? 0) + 1 }
              : { acquireTime: spec.acquireTime ? microTime(spec.acquireTime) : now }),
          },
        },
      },
      callOptions(),
    );
  }
}

/**
 * A MicroTime read back from the API server: client-node 1.x hands it over as the wire's string, not as the
 * Date its type says, and serializing it again needs a V1MicroTime.
 */
function microTime(value: Date | string): V1MicroTime {
  return new V1MicroTime(new Date(value).getTime());
}

/** When a Lease runs out by its own record (renewTime + leaseDurationSeconds), in ms; 0 if never renewed. */
export function leaseEndsAt(lease: V1Lease): number {
  const renewed = lease.spec?.renewTime;
  const duration = lease.spec?.leaseDurationSeconds;
  if (!renewed || !duration) return 0;
  return new Date(renewed).getTime() + duration * 1000;
}

/**
 * Tells live Leases from expired ones by what this process saw, not by the holder's clock: a Lease is expired
 * once its renewTime has not changed for its whole duration, as measured here since this process first saw
 * that renewTime (kube-controller-manager judges node Leases the same way). A Lease seen for the first time
 * counts from its recorded renewal, so a holder that died long ago is not given a fresh duration.
 */
export class LeaseObserver {
  private readonly seen = new Map<string, { renew: string; at: number; durationMs: number }>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Takes a fresh list of the Leases; names missing from it are forgotten. */
  observe(leases: readonly V1Lease[]): void {
    const now = this.now();
    const names = new Set<string>();
    for (const lease of leases) {
      const name = lease.metadata?.name;
      if (!name) continue;
      names.add(name);
      const renew = lease.spec?.renewTime ? new Date(lease.spec.renewTime).toISOString() : "";
      const durationMs = (lease.spec?.leaseDurationSeconds ?? 0) * 1000;
      const before = this.seen.get(name);
      if (before?.renew === renew) {
        before.durationMs = durationMs;
        continue;
      }
      // First sight: from its own record, never later than now. A change: from now.
      const at = before === undefined ? Math.min(now, leaseEndsAt(lease) - durationMs) : now;
      this.seen.set(name, { renew, at, durationMs });
    }
    for (const name of this.seen.keys()) if (!names.has(name)) this.seen.delete(name);
  }

  /** Whether the Lease of `name` is unknown or has gone a whole duration without renewal. */
  expired(name: string): boolean {
    const entry = this.seen.get(name);
    if (!entry || entry.renew === "") return true;
    return this.now() - entry.at > entry.durationMs;
  }

  /** Since when (ms) the Lease of `name` counts as expired, or null while it holds. */
  expiredSince(name: string): number | null {
    const entry = this.seen.get(name);
    if (!entry) return null;
    const end = entry.at + entry.durationMs;
    return this.now() > end ? end : null;
  }
}
