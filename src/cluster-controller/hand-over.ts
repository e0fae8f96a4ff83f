/**
 * The hand-over of durable pauses (docs/kubernetes.md, "The durable pause"): once a node is fenced (its
 * spec.epoch above the epoch an entry of its status.durablePauses was paused under), each such entry goes to
 * one live node — one holding the snapshot it was spawned from when there is one, else the one with the most
 * free sandbox slots — as an entry of that node's spec.adoptions, and then is marked in the fenced node's
 * spec.handedOver. Both writes replace the object at the resourceVersion just read, so a concurrent writer
 * makes this round's write a 409 (retried next round, re-read), and the controller is leader-elected: one
 * sandbox is never handed to two nodes. A round that died between the two writes finds the adoption already
 * written and only marks it handed over.
 */
import type { Logger } from "pino";
import type { Adoption, DurablePause, ForkdNode, HandedOver } from "../cluster/schemas.js";
import { describeKubeError } from "../kube/errors.js";
import type { ForkdObjects } from "../kube/objects.js";

/** A node that may adopt: serving under its epoch with its Lease held (the reconciler's LiveNode). */
export interface AdopterCandidate {
  node: ForkdNode;
  live: boolean;
}

/** The entries of `node` still to hand over: paused under an epoch it was fenced past, not handed over yet. */
export function pendingHandOvers(node: ForkdNode): DurablePause[] {
  const handed = new Set((node.spec.handedOver ?? []).map((h) => h.id));
  return (node.status?.durablePauses ?? []).filter(
    (entry) => entry.epoch < node.spec.epoch && !handed.has(entry.id),
  );
}

/** The node that should adopt `entry`: a live one (not `from`), holders of its parent first, then free slots. */
export function chooseAdopter(
  entry: DurablePause,
  from: string,
  nodes: readonly AdopterCandidate[],
): ForkdNode | undefined {
  const candidates = nodes
    .filter((c) => c.live && c.node.metadata.name !== from && !c.node.spec.unschedulable)
    .map((c) => c.node);
  const score = (node: ForkdNode) => {
    const holdsParent =
      entry.parentDigest !== undefined &&
      (node.status?.snapshots?.some((s) => s.digest === entry.parentDigest) ?? false);
    return (holdsParent ? 1_000_000 : 0) + (node.status?.available?.sandboxes ?? 0);
  };
  return candidates.sort((a, b) => score(b) - score(a) || a.metadata.name.localeCompare(b.metadata.name))[0];
}

/** The node whose spec.adoptions already lists `id` (from an earlier, unfinished round). */
function adoptedBy(id: string, nodes: readonly AdopterCandidate[]): string | undefined {
  return nodes.find((c) => c.node.spec.adoptions?.some((a) => a.id === id))?.node.metadata.name;
}

export class HandOver {
  constructor(
    private readonly objects: ForkdObjects,
    private readonly logger: Logger,
  ) {}

  /** Hands over every pending entry of every fenced node (errors are logged; the next round retries). */
  async round(nodes: readonly AdopterCandidate[]): Promise<void> {
    for (const { node } of nodes) {
      for (const entry of pendingHandOvers(node)) {
        await this.handOver(node.metadata.name, entry, nodes).catch((err: unknown) =>
          this.logger.warn(
            { id: entry.id, from: node.metadata.name, err: describeKubeError("handing over", err) },
            "durable pause hand-over failed; retried next round",
          ),
        );
      }
    }
  }

  private async handOver(from: string, entry: DurablePause, nodes: readonly AdopterCandidate[]) {
    let to = adoptedBy(entry.id, nodes);
    if (to === undefined) {
      const adopter = chooseAdopter(entry, from, nodes);
      if (!adopter) return; // no live node: the gateway answers 503 "being moved" meanwhile
      to = adopter.metadata.name;
      const adoption: Adoption = { id: entry.id, fromNode: from, fromEpoch: entry.epoch };
      await this.addTo(to, "adoptions", adoption);
    }
    const handed: HandedOver = { id: entry.id, toNode: to };
    await this.addTo(from, "handedOver", handed);
    this.logger.warn({ id: entry.id, from, to }, "handed a durable pause of a fenced node over");
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
