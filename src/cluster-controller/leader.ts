/**
 * Leader election among the controller's replicas on the `forkd-controller` Lease: a replica takes the Lease
 * when it has expired (judged by what this replica saw, leases.ts) and renews it every RENEW_MS; the
 * resourceVersion of every write makes two replicas taking it at once a 409 for one of them. A leader that
 * could not renew for RENEW_DEADLINE_MS stops leading before its Lease can run out elsewhere, so two replicas
 * never both act for long.
 */
import type { Logger } from "pino";
import { describeKubeError, isConflict, isNotFound } from "../kube/errors.js";
import { LeaseObserver, type Leases, type V1Lease } from "../kube/leases.js";

export const LEADER_LEASE_SECONDS = 15;
const RENEW_MS = 2_000;
const RENEW_DEADLINE_MS = 10_000;

export class LeaderElection {
  private leading = false;
  private lastRenewed = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly observer = new LeaseObserver();

  constructor(
    private readonly leases: Leases,
    private readonly name: string,
    private readonly identity: string,
    private readonly logger: Logger,
    private readonly onChange: (leading: boolean) => void,
  ) {}

  get isLeader(): boolean {
    return this.leading && Date.now() - this.lastRenewed < RENEW_DEADLINE_MS;
  }

  start(): void {
    const tick = async () => {
      await this.step().catch((err: unknown) =>
        this.logger.warn({ err: describeKubeError("leader election", err) }, "leader election step failed"),
      );
      if (this.leading && Date.now() - this.lastRenewed >= RENEW_DEADLINE_MS) this.setLeading(false);
      this.timer = setTimeout(tick, RENEW_MS);
    };
    void tick();
  }

  stop(): void {
    clearTimeout(this.timer);
    this.setLeading(false);
  }

  private async step(): Promise<void> {
    let current: V1Lease;
    try {
      current = await this.leases.get(this.name);
    } catch (err) {
      if (!isNotFound(err)) throw err;
      try {
        await this.leases.create(this.name, this.identity, LEADER_LEASE_SECONDS);
        this.renewed();
      } catch (createErr) {
        if (!isConflict(createErr)) throw createErr;
      }
      return;
    }
    this.observer.observe([current]);
    const holder = current.spec?.holderIdentity;
    if (holder !== this.identity && !this.observer.expired(this.name)) {
      this.setLeading(false);
      return;
    }
    try {
      await this.leases.renew(current, this.identity, LEADER_LEASE_SECONDS);
      this.renewed();
    } catch (err) {
      if (!isConflict(err)) throw err;
      this.setLeading(false);
    }
  }

  private renewed(): void {
    this.lastRenewed = Date.now();
    this.setLeading(true);
  }

  private setLeading(leading: boolean): void {
    if (this.leading === leading) return;
    this.leading = leading;
    this.logger.info({ identity: this.identity, leading }, leading ? "leading" : "not leading");
    this.onChange(leading);
  }
}
