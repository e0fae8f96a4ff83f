/**
 * A node daemon's membership of the cluster: its ForkdNode (registered at start, its status written on change and
 * at most every NODE_STATUS_MIN_INTERVAL_MS), its Lease (renewed every NODE_LEASE_RENEW_INTERVAL_MS), and its
 * fencing epoch. The controller raises the ForkdNode's spec.epoch when it fences the node (after its Lease
 * expired): the cluster has given up on every sandbox the node had then. A node that sees an epoch above the
 * one it runs under kills every sandbox it has, running or paused, before it takes a call again, and only then
 * writes the new epoch as status.observedEpoch; the gateway sends new work only to a node whose observedEpoch
 * is its spec.epoch. A node that could not renew its Lease for a whole duration takes no call either: it cannot
 * know whether the cluster still counts it in.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import {
  NODE_LEASE_DURATION_SECONDS,
  NODE_LEASE_RENEW_INTERVAL_MS,
  NODE_STATUS_MIN_INTERVAL_MS,
} from "../cluster/api-group.js";
import type { ForkdNode, ForkdNodeStatus } from "../cluster/schemas.js";
import { errorMessage } from "../common/errors.js";
import type { Services } from "../controller/tenancy/tenant-view.js";
import { describeKubeError, isConflict, isNotFound } from "../kube/errors.js";
import type { Leases, V1Lease } from "../kube/leases.js";
import type { ForkdObjects } from "../kube/objects.js";
import { DELETE_RETRY_MS } from "./artifact-deletes.js";
import { type DurablePauses, releasedHandOvers } from "./durable-pauses.js";
import { type MembershipState, type NodeStatusSource, readyCondition, statusKey } from "./status.js";

/** How often the node reads its ForkdNode for a raised epoch (a call under a newer epoch reads it at once). */
export const EPOCH_POLL_MS = 2_000;
/** How long a fence may wait for sandboxes that were still starting to finish, so they can be killed too. */
const FENCE_MAX_MS = 120_000;

export type { MembershipState } from "./status.js";

export interface MembershipOptions {
  objects: ForkdObjects;
  leases: Leases;
  nodeName: string;
  /** Where the gateway reaches this daemon (its spec.url). */
  url: string;
  status: NodeStatusSource;
  /** Its durable pauses (listed in its status) and adoptions (from its spec). */
  durable: DurablePauses;
  logger: Logger;
  /** For tests: shorter Lease timings. */
  leaseDurationSeconds?: number;
  renewIntervalMs?: number;
  statusIntervalMs?: number;
}

export class NodeMembership {
  private stateValue: MembershipState = "starting";
  private epochValue = 0;
  private leaseValidUntil = 0;
  private lease: V1Lease | undefined;
  private services: Services | undefined;
  private readonly stopController = new AbortController();
  private fencing: Promise<void> | undefined;
  private lastStatusKey = "";
  private lastStatusAt = 0;
  private readonly readyTransitions = { ready: false, since: new Date().toISOString() };
  private pollNow: (() => void) | undefined;
  private readonly loops: Promise<void>[] = [];
  /** The ForkdNode as last read (its spec's hand-overs and adoptions). */
  private lastNode: ForkdNode | undefined;
  /** Its handed-over durable pauses whose adopters are done with them (read with the ForkdNode). */
  private released: ReadonlySet<string> = new Set();

  constructor(private readonly options: MembershipOptions) {}

  get state(): MembershipState {
    return this.stateValue;
  }

  /** The epoch this node runs under (its status.observedEpoch). */
  get epoch(): number {
    return this.epochValue;
  }

  get nodeName(): string {
    return this.options.nodeName;
  }

  /** Whether the node renewed its Lease within the last duration (else it may have been declared lost). */
  holdsLease(now = Date.now()): boolean {
    return now <= this.leaseValidUntil;
  }

  /** A call came with a newer epoch than the node runs under: read the ForkdNode now instead of at the next poll. */
  checkEpochSoon(): void {
    this.pollNow?.();
  }

  /** Registers the node, fences it if its epoch was raised while it was away, and starts renewing. */
  async start(services: Services): Promise<void> {
    this.services = services;
    const node = await this.register();
    this.lastNode = node;
    this.options.durable.restore(node);
    const observed = node.status?.observedEpoch ?? 0;
    this.epochValue = observed;
    await this.renewLease();
    if (node.spec.epoch > observed) {
      await this.fence(node.spec.epoch, "its epoch was raised while this daemon was away");
    } else {
      this.stateValue = "serving";
      await this.writeStatus(true);
    }
    const signal = this.stopController.signal;
    const renewMs = this.options.renewIntervalMs ?? NODE_LEASE_RENEW_INTERVAL_MS;
    this.loops.push(this.every(renewMs, signal, () => this.renewLease()));
    this.loops.push(this.epochLoop(signal));
    this.loops.push(this.every(1_000, signal, () => this.writeStatus(false)));
    this.loops.push(this.every(DELETE_RETRY_MS, signal, () => this.options.durable.retryDeletes()));
    this.options.logger.info(
      { node: this.options.nodeName, epoch: this.epochValue, url: this.options.url },
      "registered with the cluster",
    );
  }

  /** Stops renewing and writing (the Lease then runs out: a stopped daemon gets no new work). */
  async stop(): Promise<void> {
    if (this.stateValue === "stopped") return;
    this.stopController.abort();
    await Promise.allSettled(this.loops);
    await this.fencing?.catch(() => {});
    this.stateValue = "stopped";
    await this.writeStatus(true).catch(() => {});
  }

  /** Creates the ForkdNode, or points an existing one at this daemon's address (its epoch stays). */
  private async register(): Promise<ForkdNode> {
    const { objects, nodeName, url } = this.options;
    try {
      const existing = (await objects.nodes.get(nodeName)) as ForkdNode;
      if (existing.spec.url === url) return existing;
      return (await objects.nodes.patchSpec(nodeName, { url })) as ForkdNode;
    } catch (err) {
      if (!isNotFound(err)) throw new Error(describeKubeError(`reading ForkdNode ${nodeName}`, err));
    }
    try {
      return (await objects.nodes.create(nodeName, { url, epoch: 0, unschedulable: false })) as ForkdNode;
    } catch (err) {
      throw new Error(describeKubeError(`creating ForkdNode ${nodeName}`, err));
    }
  }

  private async renewLease(): Promise<void> {
    const { leases, nodeName, logger } = this.options;
    const duration = this.options.leaseDurationSeconds ?? NODE_LEASE_DURATION_SECONDS;
    const started = Date.now();
    try {
      if (this.lease === undefined) {
        try {
          this.lease = await leases.get(nodeName);
        } catch (err) {
          if (!isNotFound(err)) throw err;
          this.lease = await leases.create(nodeName, nodeName, duration);
          this.leaseValidUntil = started + duration * 1000;
          return;
        }
      }
      this.lease = await leases.renew(this.lease, nodeName, duration);
      this.leaseValidUntil = started + duration * 1000;
    } catch (err) {
      // Read again next time: a 409 means someone else wrote it (the controller never does: a stale copy).
      this.lease = undefined;
      const level = isConflict(err) ? "info" : "warn";
      logger[level]({ err: describeKubeError(`renewing Lease ${nodeName}`, err) }, "lease renewal failed");
    }
  }

  private async epochLoop(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await new Promise<void>((resolve) => {
        // The abort listener goes with each wait: one per poll would pile up on the daemon's stop signal.
        const done = () => {
          clearTimeout(timer);
          signal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, EPOCH_POLL_MS);
        this.pollNow = done;
        signal.addEventListener("abort", done);
      });
      if (signal.aborted) return;
      try {
        const node = (await this.options.objects.nodes.get(this.options.nodeName)) as ForkdNode;
        this.lastNode = node;
        await this.readReleased(node);
        if (node.spec.epoch > this.epochValue) {
          await this.fence(node.spec.epoch, "the controller raised its epoch (it fenced this node)");
        } else if (this.stateValue === "serving" && this.services) {
          this.options.durable.adoptListed(this.services, node);
        }
      } catch (err) {
        this.options.logger.warn(
          { err: describeKubeError(`reading ForkdNode ${this.options.nodeName}`, err) },
          "epoch check failed",
        );
      }
    }
  }

  /** Which of its handed-over entries the adopters are done with (the nodes are read only while there are some). */
  private async readReleased(node: ForkdNode): Promise<void> {
    const handed = node.spec.handedOver ?? [];
    if (handed.length === 0) {
      this.released = new Set();
      return;
    }
    const nodes = (await this.options.objects.nodes.list()) as ForkdNode[];
    this.released = releasedHandOvers(this.options.nodeName, handed, nodes);
  }

  /**
   * Kills every sandbox (the cluster gave them up), then runs under `epoch`. Calls are refused meanwhile
   * (state "fencing"); sandboxes still starting are waited for and killed too.
   */
  private fence(epoch: number, why: string): Promise<void> {
    this.fencing ??= (async () => {
      const { logger } = this.options;
      this.stateValue = "fencing";
      logger.warn({ from: this.epochValue, to: epoch, why }, "fenced: killing every sandbox this node had");
      const services = this.services as Services;
      const deadline = Date.now() + FENCE_MAX_MS;
      let killed = 0;
      // killAll leaves sandboxes that are still starting: they are killed on a later round, once started.
      for (;;) {
        const left = services.sandboxes.list();
        if (left.length === 0) break;
        if (Date.now() > deadline) {
          logger.error({ left: left.map((s) => s.id) }, "fence: sandboxes still there after the deadline");
          break;
        }
        killed += (await services.sandboxes.killAll()).length;
        if (services.sandboxes.list().length > 0) await sleep(250);
      }
      this.epochValue = epoch;
      await this.writeStatus(true);
      this.stateValue = "serving";
      await this.writeStatus(true);
      logger.info({ epoch, killed }, "fence done: serving under the new epoch");
    })().finally(() => {
      this.fencing = undefined;
    });
    return this.fencing;
  }

  /** Writes the status now; throws unless the API server accepted it (an answer that says "durable" must be). */
  async publishNow(): Promise<void> {
    await this.writeStatus(true, true);
  }

  /** Writes the status when it changed (at most every NODE_STATUS_MIN_INTERVAL_MS unless `force`). */
  private async writeStatus(force: boolean, strict = false): Promise<void> {
    const interval = this.options.statusIntervalMs ?? NODE_STATUS_MIN_INTERVAL_MS;
    if (!force && Date.now() - this.lastStatusAt < interval) return;
    const services = this.services;
    if (!services) return;
    let status: ForkdNodeStatus;
    try {
      status = await this.options.status.read(services);
    } catch (err) {
      if (strict) throw err;
      this.options.logger.warn({ err: errorMessage(err) }, "could not read this node's status");
      return;
    }
    const ready = this.stateValue === "serving";
    if (ready !== this.readyTransitions.ready) {
      this.readyTransitions.ready = ready;
      this.readyTransitions.since = new Date().toISOString();
    }
    const paused = new Set(
      services.sandboxes
        .list()
        .filter((s) => s.status === "paused")
        .map((s) => s.id),
    );
    const full: ForkdNodeStatus = {
      ...status,
      durablePauses: this.options.durable.listed(
        this.lastNode,
        this.epochValue,
        paused,
        this.stateValue === "fencing",
        this.released,
      ),
      adopted: this.options.durable.adoptedIds(this.lastNode),
      observedEpoch: this.epochValue,
      conditions: [readyCondition(this.stateValue, this.readyTransitions.since)],
    };
    const key = statusKey(full);
    if (!force && key === this.lastStatusKey) return;
    try {
      await this.options.objects.nodes.patchStatus(this.options.nodeName, full);
      this.lastStatusKey = key;
      this.lastStatusAt = Date.now();
    } catch (err) {
      const message = describeKubeError(`writing ForkdNode ${this.options.nodeName} status`, err);
      if (strict) throw new Error(message);
      this.options.logger.warn({ err: message }, "status write failed");
    }
  }

  private async every(ms: number, signal: AbortSignal, work: () => Promise<void>): Promise<void> {
    while (!signal.aborted) {
      try {
        await sleep(ms, undefined, { signal });
      } catch {
        return;
      }
      await work().catch((err: unknown) =>
        this.options.logger.warn({ err: errorMessage(err) }, "cluster membership work failed"),
      );
    }
  }
}
