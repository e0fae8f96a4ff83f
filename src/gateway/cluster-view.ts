/**
 * What the gateway knows of the cluster, read from the API server (its rights there are read-only): the
 * ForkdNodes, their Leases and the ForkdSnapshots, listed every READ_INTERVAL_MS. Listing a few dozen small
 * objects a second is cheap and cannot miss an event the way a stalled watch can; a read that fails leaves the
 * last view in place (a gateway that cannot reach the API server does not declare nodes lost).
 *
 * A node takes new work when its Lease holds (judged by what this gateway saw, leases.ts), it runs under its
 * spec.epoch (status.observedEpoch equal), it is Ready and not cordoned. It is lost from the moment its Lease
 * is seen expired, or its epoch is raised past the epoch its sandboxes were placed under: calls for those
 * sandboxes answer "lost" at once, whatever the node does later (it kills them when it learns its new epoch).
 */
import type { Logger } from "pino";
import type { ForkdNode, ForkdSnapshot } from "../cluster/schemas.js";
import { describeKubeError } from "../kube/errors.js";
import { LeaseObserver, type Leases, type V1Lease } from "../kube/leases.js";
import type { ForkdObjects } from "../kube/objects.js";

export const READ_INTERVAL_MS = 1_000;

export interface NodeView {
  name: string;
  url: string;
  /** spec.epoch: what calls must carry. */
  epoch: number;
  observedEpoch: number;
  unschedulable: boolean;
  ready: boolean;
  leaseHeld: boolean;
  /** When its Lease was seen expired (ms), or null while it holds. */
  lostSince: number | null;
  node: ForkdNode;
}

/**
 * The three lists the view is made of. In the gateway they come from the API server (kubeReads); the gateway's
 * unit tests hand in lists of their own (a stand-in at the API server's boundary, test/gateway).
 */
export interface ClusterReads {
  nodes(): Promise<ForkdNode[]>;
  leases(): Promise<V1Lease[]>;
  snapshots(): Promise<ForkdSnapshot[]>;
}

/** The lists as the API server has them (the gateway's read-only rights). */
export function kubeReads(objects: ForkdObjects, leases: Leases): ClusterReads {
  return {
    nodes: async () => (await objects.nodes.list()) as ForkdNode[],
    leases: () => leases.list(),
    snapshots: async () => (await objects.snapshots.list()) as ForkdSnapshot[],
  };
}

export interface SnapshotView {
  name: string;
  reference: string;
  digest: string;
  aliases: string[];
  prepull: number;
}

export class ClusterView {
  private nodes = new Map<string, NodeView>();
  private snapshots: SnapshotView[] = [];
  private readonly leases = new LeaseObserver();
  /**
   * The epoch each node was under when this gateway saw it lost: its sandboxes of that epoch or older stay lost
   * and it gets no work until it runs under a newer one (the controller fences it), even if its Lease comes back.
   */
  private readonly lostEpoch = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private lastReadOk = 0;
  private readonly listeners = new Set<() => void>();
  /** The first full read. */
  readonly ready: Promise<void>;
  private markReady!: () => void;

  constructor(
    private readonly reads: ClusterReads,
    private readonly logger: Logger,
    private readonly intervalMs = READ_INTERVAL_MS,
  ) {
    this.ready = new Promise((resolve) => {
      this.markReady = resolve;
    });
  }

  start(): void {
    const tick = async () => {
      await this.read();
      this.timer = setTimeout(tick, this.intervalMs);
      this.timer.unref();
    };
    void tick();
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Called after every successful read. */
  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Reads now (also what the timer does). */
  async read(): Promise<void> {
    try {
      const [nodes, leases, snapshots] = await Promise.all([
        this.reads.nodes(),
        this.reads.leases(),
        this.reads.snapshots(),
      ]);
      this.leases.observe(leases);
      const next = new Map<string, NodeView>();
      for (const node of nodes) {
        const view = this.viewOf(node);
        next.set(view.name, view);
        if (!view.leaseHeld) {
          const before = this.lostEpoch.get(view.name) ?? -1;
          this.lostEpoch.set(view.name, Math.max(before, view.observedEpoch, view.epoch - 1));
        }
      }
      this.nodes = next;
      this.snapshots = snapshots.map((s) => ({
        name: s.metadata.name,
        reference: s.spec.reference,
        digest: s.spec.digest,
        aliases: s.spec.aliases ?? [],
        prepull: s.spec.prepull ?? 0,
      }));
      this.lastReadOk = Date.now();
      this.markReady();
      for (const listener of this.listeners) listener();
    } catch (err) {
      this.logger.warn({ err: describeKubeError("reading the cluster", err) }, "cluster read failed");
    }
  }

  private viewOf(node: ForkdNode): NodeView {
    const name = node.metadata.name;
    const lostSince = this.leases.expiredSince(name);
    const leaseHeld = !this.leases.expired(name);
    const ready = node.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false;
    return {
      name,
      url: node.spec.url,
      epoch: node.spec.epoch,
      observedEpoch: node.status?.observedEpoch ?? 0,
      unschedulable: node.spec.unschedulable,
      ready,
      leaseHeld,
      lostSince: leaseHeld ? null : (lostSince ?? Date.now()),
      node,
    };
  }

  /** When the API server last answered (ms), 0 never. */
  get lastRead(): number {
    return this.lastReadOk;
  }

  node(name: string): NodeView | undefined {
    return this.nodes.get(name);
  }

  allNodes(): NodeView[] {
    return [...this.nodes.values()];
  }

  /**
   * The durable pause of sandbox `id` a fenced or lost node lists (docs/kubernetes.md, "The durable pause"):
   * where it was paused, its owner, and the node the controller handed it to (once it has).
   */
  durablePause(id: string): { from: string; owner: string | null; to: string | undefined } | undefined {
    for (const view of this.nodes.values()) {
      const entry = view.node.status?.durablePauses?.find((p) => p.id === id);
      if (!entry) continue;
      const to = view.node.spec.handedOver?.find((h) => h.id === id)?.toNode;
      return { from: view.name, owner: entry.owner ?? null, to };
    }
    return undefined;
  }

  /** Nodes that take new work. */
  schedulable(): NodeView[] {
    return this.allNodes().filter(
      (n) =>
        n.leaseHeld &&
        n.ready &&
        !n.unschedulable &&
        n.observedEpoch === n.epoch &&
        n.epoch > (this.lostEpoch.get(n.name) ?? -1),
    );
  }

  /** Whether sandboxes placed on `name` under `epoch` are gone: the node's Lease expired, or it was fenced since. */
  isLost(name: string, epoch: number): { lost: boolean; why: string } {
    const node = this.nodes.get(name);
    if (!node) return { lost: true, why: `node ${name} is no longer part of the cluster` };
    if (node.epoch > epoch)
      return { lost: true, why: `node ${name} was fenced (epoch ${epoch} -> ${node.epoch})` };
    if (!node.leaseHeld || epoch <= (this.lostEpoch.get(name) ?? -1)) {
      const since = node.lostSince === null ? "" : ` at ${new Date(node.lostSince).toISOString()}`;
      return { lost: true, why: `node ${name} was lost${since} (its Lease expired)` };
    }
    return { lost: false, why: "" };
  }

  /** A ForkdSnapshot by its name or one of its aliases. */
  snapshot(name: string): SnapshotView | undefined {
    return (
      this.snapshots.find((s) => s.name === name) ?? this.snapshots.find((s) => s.aliases.includes(name))
    );
  }

  allSnapshots(): SnapshotView[] {
    return [...this.snapshots];
  }

  /** Nodes that hold `digest` (by their ForkdNode status). */
  holders(digest: string): string[] {
    return this.allNodes()
      .filter((n) => n.node.status?.snapshots?.some((s) => s.digest === digest))
      .map((n) => n.name);
  }
}
