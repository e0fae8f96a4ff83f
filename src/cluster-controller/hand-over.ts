/**
 * The hand-over of durable pauses (docs/kubernetes.md, "The durable pause"): once a node is fenced (its
 * spec.epoch above the epoch an entry of its status.durablePauses was paused under), each such entry goes to
 * one live node — one holding the snapshot it was spawned from when there is one, else the one with the most
 * free sandbox slots — as an entry of that node's spec.adoptions, and then is marked in the fenced node's
 * spec.handedOver. Both writes replace the object at the resourceVersion just read, so a concurrent writer
 * makes this round's write a 409 (retried next round, re-read), and the controller is leader-elected: one
 * sandbox is never handed to two nodes. A round that died between the two writes finds the adoption already
 * written and only marks it handed over.
 *
 * The adopter needs the chain's guest image, which the pushed artifact leaves out, so when the entry names the
 * snapshot it was spawned from (parentDigest) only a live node holding that snapshot adopts it; while none
 * does, the ForkdSnapshot of that digest (if any) is pulled on the live node with the most free slots first,
 * and without one the entry waits (the gateway answers 503 "being moved" meanwhile).
 *
 * Both lists are pruned each round, at the resourceVersion read: an adoption once its adopter lists it as done
 * in status.adopted and the fenced node's spec.handedOver names the adopter, or once it is moot (the fenced
 * node's ForkdNode is gone, or no longer lists the entry under that epoch); a handedOver entry once the fenced
 * node no longer lists the pause under an older epoch (it came back and dropped it).
 */
import type { Logger } from "pino";
import {
  type Adoption,
  CLUSTER_LIMITS,
  type DurablePause,
  type ForkdNode,
  type ForkdSnapshot,
  type HandedOver,
} from "../cluster/schemas.js";
import { describeKubeError } from "../kube/errors.js";
import type { ForkdObjects } from "../kube/objects.js";

/** A node that may adopt: serving under its epoch with its Lease held (the reconciler's LiveNode). */
export interface AdopterCandidate {
  node: ForkdNode;
  live: boolean;
}

/** What the hand-over needs of the rest of the reconciler: the ForkdSnapshots, and a pull on a node. */
export interface HandOverContext {
  snapshots: readonly ForkdSnapshot[];
  /** Starts a pull of `snapshot` on `node` in the background (at most one per node and digest at once). */
  pull(node: ForkdNode, snapshot: ForkdSnapshot): void;
}

/** The entries of `node` still to hand over: paused under an epoch it was fenced past, not handed over yet. */
export function pendingHandOvers(node: ForkdNode): DurablePause[] {
  const handed = new Set((node.spec.handedOver ?? []).map((h) => h.id));
  return (node.status?.durablePauses ?? []).filter(
    (entry) => entry.epoch < node.spec.epoch && !handed.has(entry.id),
  );
}

/** Live, schedulable nodes other than `from` with room in spec.adoptions, the most free sandbox slots first. */
export function adopterCandidates(from: string, nodes: readonly AdopterCandidate[]): ForkdNode[] {
  const free = (node: ForkdNode) => node.status?.available?.sandboxes ?? 0;
  return nodes
    .filter(
      (c) =>
        c.live &&
        c.node.metadata.name !== from &&
        !c.node.spec.unschedulable &&
        (c.node.spec.adoptions?.length ?? 0) < CLUSTER_LIMITS.handOversPerNode,
    )
    .map((c) => c.node)
    .sort((a, b) => free(b) - free(a) || a.metadata.name.localeCompare(b.metadata.name));
}

const holds = (node: ForkdNode, digest: string) => node.status?.snapshots?.some((s) => s.digest === digest);

/**
 * The node that should adopt `entry`: of the candidates, one holding its parent when it names one (none
 * holds it: undefined), else the one with the most free slots.
 */
export function chooseAdopter(
  entry: DurablePause,
  from: string,
  nodes: readonly AdopterCandidate[],
): ForkdNode | undefined {
  const candidates = adopterCandidates(from, nodes);
  const parent = entry.parentDigest;
  return parent === undefined ? candidates[0] : candidates.find((n) => holds(n, parent));
}

/** The entries of `node`'s spec.adoptions that are done (reported and marked handed over) or moot. */
export function finishedAdoptions(node: ForkdNode, nodes: readonly ForkdNode[]): Adoption[] {
  const done = new Set(node.status?.adopted ?? []);
  return (node.spec.adoptions ?? []).filter((a) => {
    const from = nodes.find((n) => n.metadata.name === a.fromNode);
    if (!from) return true;
    const listed = from.status?.durablePauses?.some((e) => e.id === a.id && e.epoch === a.fromEpoch);
    if (!listed) return true;
    // Only once marked: else the next round would not find the adoption and would choose another adopter.
    const marked = from.spec.handedOver?.some((h) => h.id === a.id && h.toNode === node.metadata.name);
    return done.has(a.id) && marked === true;
  });
}

/** The entries of `node`'s spec.handedOver it no longer lists as an older epoch's pause (it dropped them). */
export function finishedHandOvers(node: ForkdNode): HandedOver[] {
  const listed = new Set(
    (node.status?.durablePauses ?? []).filter((e) => e.epoch < node.spec.epoch).map((e) => e.id),
  );
  return (node.spec.handedOver ?? []).filter((h) => !listed.has(h.id));
}

/** The node whose spec.adoptions already lists `id` (from an earlier, unfinished round). */
function adoptedBy(id: string, nodes: readonly AdopterCandidate[]): string | undefined {
  return nodes.find((c) => c.node.spec.adoptions?.some((a) => a.id === id))?.node.metadata.name;
}

export class HandOver {
  /** Entries already logged as waiting for a node that holds their parent (logged once each). */
  private readonly waiting = new Set<string>();

  constructor(
    private readonly objects: ForkdObjects,
    private readonly logger: Logger,
  ) {}

  /**
   * Hands over every pending entry of every fenced node, then prunes what is finished (errors are logged;
   * the next round retries).
   */
  async round(nodes: readonly AdopterCandidate[], context?: HandOverContext): Promise<void> {
    for (const { node } of nodes) {
      for (const entry of pendingHandOvers(node)) {
        await this.handOver(node.metadata.name, entry, nodes, context).catch((err: unknown) =>
          this.logger.warn(
            { id: entry.id, from: node.metadata.name, err: describeKubeError("handing over", err) },
            "durable pause hand-over failed; retried next round",
          ),
        );
      }
    }
    await this.prune(nodes.map((c) => c.node));
  }

  private async prune(nodes: readonly ForkdNode[]): Promise<void> {
    for (const node of nodes) {
      const name = node.metadata.name;
      const adoptions = finishedAdoptions(node, nodes);
      const handed = finishedHandOvers(node);
      if (adoptions.length === 0 && handed.length === 0) continue;
      await this.removeFrom(name, adoptions, handed)
        .then(() =>
          this.logger.info(
            { node: name, adoptions: adoptions.map((a) => a.id), handedOver: handed.map((h) => h.id) },
            "pruned finished durable pause hand-overs",
          ),
        )
        .catch((err: unknown) =>
          this.logger.warn(
            { node: name, err: describeKubeError("pruning hand-overs", err) },
            "pruning failed; retried next round",
          ),
        );
    }
  }

  /** Removes exactly these items from node `name`'s spec lists, at the resourceVersion read now. */
  private async removeFrom(name: string, adoptions: Adoption[], handed: HandedOver[]): Promise<void> {
    const node = (await this.objects.nodes.get(name)) as ForkdNode;
    const keepA = (node.spec.adoptions ?? []).filter(
      (a) =>
        !adoptions.some((x) => x.id === a.id && x.fromNode === a.fromNode && x.fromEpoch === a.fromEpoch),
    );
    const keepH = (node.spec.handedOver ?? []).filter(
      (h) => !handed.some((x) => x.id === h.id && x.toNode === h.toNode),
    );
    node.spec = { ...node.spec, adoptions: keepA, handedOver: keepH };
    await this.objects.nodes.replace(node);
  }

  private async handOver(
    from: string,
    entry: DurablePause,
    nodes: readonly AdopterCandidate[],
    context: HandOverContext | undefined,
  ) {
    let to = adoptedBy(entry.id, nodes);
    if (to === undefined) {
      const adopter = chooseAdopter(entry, from, nodes);
      if (!adopter) {
        this.pullParent(entry, from, nodes, context);
        return; // the gateway answers 503 "being moved" meanwhile
      }
      this.waiting.delete(entry.id);
      to = adopter.metadata.name;
      const adoption: Adoption = { id: entry.id, fromNode: from, fromEpoch: entry.epoch };
      await this.addTo(to, "adoptions", adoption);
    }
    const handed: HandedOver = { id: entry.id, toNode: to };
    await this.addTo(from, "handedOver", handed);
    this.logger.warn({ id: entry.id, from, to }, "handed a durable pause of a fenced node over");
  }

  /** No live node holds `entry`'s parent: the best candidate pulls its ForkdSnapshot, when there is one. */
  private pullParent(
    entry: DurablePause,
    from: string,
    nodes: readonly AdopterCandidate[],
    context: HandOverContext | undefined,
  ): void {
    const target = adopterCandidates(from, nodes)[0];
    const snapshot = context?.snapshots.find((s) => s.spec.digest === entry.parentDigest);
    if (target && snapshot && context) {
      context.pull(target, snapshot);
    } else if (!this.waiting.has(entry.id)) {
      this.logger.warn(
        { id: entry.id, from, parent: entry.parentDigest, live: target !== undefined },
        target
          ? "no live node holds a durable pause's parent snapshot and no ForkdSnapshot has its digest: it waits"
          : "no live node can adopt a durable pause: it waits",
      );
    }
    this.waiting.add(entry.id);
  }

  /** Adds `item` to a spec list of node `name`, at the resourceVersion read now (a 409 if anyone wrote since). */
  private async addTo<K extends "adoptions" | "handedOver">(
    name: string,
    list: K,
    item: NonNullable<ForkdNode["spec"][K]>[number],
  ): Promise<void> {
    const node = (await this.objects.nodes.get(name)) as ForkdNode;
    const current = (node.spec[list] ?? []) as { id: string }[];
    if (current.some((c) => c.id === item.id)) return;
    node.spec = { ...node.spec, [list]: [...current, item] };
    await this.objects.nodes.replace(node);
  }
}
