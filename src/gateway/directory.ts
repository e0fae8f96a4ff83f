/**
 * The gateway's directory: which node runs each sandbox, and which nodes hold each snapshot the cluster has no
 * ForkdSnapshot for (BRANCHes, pause layers, a tenant's own). In memory only: filled from what this gateway
 * placed or BRANCHed, from what nodes answered when asked about an id or tag it did not know (locate.ts,
 * placement.ts), and from every node's event stream (its whole state on connect, then each change), so a
 * restarted gateway rebuilds it within a stream's first line. Nothing here is written to the cluster's store.
 *
 * An entry remembers the epoch its node ran under when the entry was learned: once the node is fenced past it,
 * the sandbox is lost (cluster-view.ts), and the entry is kept (bounded) so calls for it say so instead of
 * "unknown".
 */
import type { SandboxRef, SnapshotRef } from "../cluster/protocol.js";

export interface Placement {
  id: string;
  node: string;
  epoch: number;
  owner: string | null;
  status: string;
  snapshot_tag: string;
}

export interface SnapshotPlace {
  node: string;
  epoch: number;
  owner: string | null;
  digest: string | null;
}

/** Entries of nodes that were fenced, kept to answer "lost" (oldest dropped first beyond this). */
const MAX_LOST_ENTRIES = 100_000;

export class Directory {
  /**
   * `isLost(node, epoch)`: whether sandboxes placed on `node` under `epoch` are gone (the cluster view's answer);
   * without it every report counts.
   */
  constructor(private readonly isLost: (node: string, epoch: number) => boolean = () => false) {}

  private readonly sandboxes = new Map<string, Placement>();
  private readonly lost = new Map<string, Placement>();
  private readonly snapshots = new Map<string, Map<string, SnapshotPlace>>();

  /** A node's whole state (the first line of its stream): its entries are replaced by it. */
  applyState(node: string, epoch: number, sandboxes: SandboxRef[], snapshots: SnapshotRef[]): void {
    const present = new Set(sandboxes.map((s) => s.id));
    for (const [id, entry] of this.sandboxes) {
      if (entry.node !== node || present.has(id)) continue;
      this.sandboxes.delete(id);
      if (entry.epoch < epoch) this.remember(entry);
    }
    for (const ref of sandboxes) this.upsert(node, epoch, ref);
    const tags = new Set(snapshots.map((s) => s.tag));
    for (const [tag, places] of this.snapshots) {
      if (!tags.has(tag)) places.delete(node);
      if (places.size === 0) this.snapshots.delete(tag);
    }
    for (const ref of snapshots) this.upsertSnapshot(node, epoch, ref);
  }

  upsert(node: string, epoch: number, ref: SandboxRef): void {
    const before = this.sandboxes.get(ref.id);
    // A sandbox is where the latest report says (an adopted durable pause moves it to another node), unless that
    // report is the same node's under an older epoch than the entry's, or a lost node's while the entry's node is
    // not lost. Epochs are each node's own: never compared across nodes (an adopter's may be below the lost one's).
    if (before && before.node === node && before.epoch > epoch) return;
    if (before && before.node !== node && this.isLost(node, epoch) && !this.isLost(before.node, before.epoch))
      return;
    this.sandboxes.set(ref.id, {
      id: ref.id,
      node,
      epoch,
      owner: ref.owner,
      status: ref.status,
      snapshot_tag: ref.snapshot_tag,
    });
    this.lost.delete(ref.id);
  }

  remove(node: string, id: string): void {
    if (this.sandboxes.get(id)?.node === node) this.sandboxes.delete(id);
  }

  upsertSnapshot(node: string, epoch: number, ref: SnapshotRef): void {
    let places = this.snapshots.get(ref.tag);
    if (!places) {
      places = new Map();
      this.snapshots.set(ref.tag, places);
    }
    places.set(node, { node, epoch, owner: ref.owner, digest: ref.digest });
  }

  /**
   * Records that `node` holds `ref.tag`, learned from a call rather than the node's stream (a BRANCH answer, a
   * lookup): kept only when the stream has not told this already (its entry carries the registry digest).
   */
  learnSnapshot(node: string, epoch: number, ref: SnapshotRef): void {
    if (this.snapshots.get(ref.tag)?.has(node)) return;
    this.upsertSnapshot(node, epoch, ref);
  }

  removeSnapshot(node: string, tag: string): void {
    const places = this.snapshots.get(tag);
    places?.delete(node);
    if (places?.size === 0) this.snapshots.delete(tag);
  }

  /** The entry of `id`, live or lost. */
  lookup(id: string): Placement | undefined {
    return this.sandboxes.get(id) ?? this.lost.get(id);
  }

  /** Every live entry (of every node; the caller asks the cluster view which are lost). */
  all(): Placement[] {
    return [...this.sandboxes.values()];
  }

  /** Where a snapshot tag is, node by node. */
  snapshotPlaces(tag: string): SnapshotPlace[] {
    return [...(this.snapshots.get(tag)?.values() ?? [])];
  }

  /** Forgets a node's sandboxes as lost (it was fenced): they stay known, to answer "lost". */
  markNodeLost(node: string, epoch: number): void {
    for (const [id, entry] of this.sandboxes) {
      if (entry.node === node && entry.epoch <= epoch) {
        this.sandboxes.delete(id);
        this.remember(entry);
      }
    }
  }

  private remember(entry: Placement): void {
    this.lost.set(entry.id, entry);
    if (this.lost.size > MAX_LOST_ENTRIES) {
      const oldest = this.lost.keys().next().value;
      if (oldest !== undefined) this.lost.delete(oldest);
    }
  }
}
