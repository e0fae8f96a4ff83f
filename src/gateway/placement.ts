/**
 * Where new sandboxes go. A snapshot the cluster knows as a ForkdSnapshot is placed on the nodes holding its
 * digest; any other snapshot (a BRANCH, a tenant's own) on the nodes the directory says hold its tag (asked of
 * the nodes when the directory does not know it, or when the nodes it knows have no room: a node's stream
 * reports new snapshots every 2 s, so a node that just got the tag is not among them yet). Among
 * those, best-of-K (E2B's scheduler does the same with K = 3): K nodes drawn at random, the one with the most
 * free slots wins, so load spreads without every gateway replica piling onto the same "emptiest" node. A spawn
 * of more children than one node has room for spills over to the next best. A ForkdSnapshot no schedulable
 * node holds is pulled first by the best node of all (one pull per digest per node: the node dedupes, and so
 * does this gateway).
 *
 * Free slots of a node: the smaller of its free sandbox count and its free memory over PER_SANDBOX_MIB (its
 * ForkdNode status), less what this gateway is placing there now and has not seen in a status yet.
 */
import { randomInt } from "node:crypto";
import { NODE_ROUTES, type PullAnswer, type PullBody } from "../cluster/protocol.js";
import { ForkdError, notFound } from "../common/errors.js";
import type { ClusterView, NodeView, SnapshotView } from "./cluster-view.js";
import type { Directory } from "./directory.js";
import { LOOKUP_TIMEOUT_MS } from "./locate.js";
import type { NodeCaller } from "./node-calls.js";
import type { NodeLinks } from "./node-links.js";

export const BEST_OF_K = 3;
/** What one sandbox is assumed to take of a node's memory for placement (PSS of a warm child is ~35 MiB). */
export const DEFAULT_PER_SANDBOX_MIB = 128;
/** A pull of a whole chain (image included) over a slow registry. */
const PULL_DEADLINE_MS = 30 * 60_000;

/** What a spawn names, resolved: a ForkdSnapshot, or a node-local tag. */
export type SnapshotTarget =
  | { kind: "cluster"; tag: string; snapshot: SnapshotView }
  | {
      kind: "local";
      tag: string;
      nodes: string[];
      /**
       * Set when the nodes are what the directory knew (resolve): the tenant to ask the other nodes as when they
       * have too little room, since a node that got the tag since its stream's last snapshot poll is not in
       * `nodes` yet. Unset: `nodes` is the whole list (a fork's branch, pulled where it goes).
       */
      askAs?: string | null;
    };

export interface Share {
  node: string;
  count: number;
}

export interface PlacementOptions {
  perSandboxMiB?: number;
  bestOfK?: number;
  insecureRegistry?: boolean;
}

export class Placer {
  private readonly placing = new Map<string, number>();
  private readonly pulls = new Map<string, Promise<void>>();
  private readonly perSandboxMiB: number;
  private readonly k: number;

  constructor(
    private readonly view: ClusterView,
    private readonly links: NodeLinks,
    private readonly directory: Directory,
    private readonly calls: NodeCaller,
    private readonly options: PlacementOptions = {},
  ) {
    this.perSandboxMiB = options.perSandboxMiB ?? DEFAULT_PER_SANDBOX_MIB;
    this.k = options.bestOfK ?? BEST_OF_K;
  }

  /**
   * The snapshot a spawn names: a ForkdSnapshot by name or alias, else a tag the directory says some node holds,
   * else a tag a node answers for when asked (a BRANCH made a moment ago: its node's stream reports snapshots
   * only every few seconds, and another replica may have made it), else not_found. `ask: false` skips the
   * question (a name that usually means something else).
   */
  async resolve(
    name: string,
    tenant: string | null,
    options: { ask?: boolean } = {},
  ): Promise<SnapshotTarget> {
    const snapshot = this.view.snapshot(name);
    if (snapshot) return { kind: "cluster", tag: snapshot.name, snapshot };
    let nodes = this.directory.snapshotPlaces(name).map((p) => p.node);
    if (nodes.length === 0 && options.ask !== false) nodes = await this.askHolders(name, tenant, []);
    if (nodes.length > 0) return { kind: "local", tag: name, nodes, askAs: tenant };
    throw notFound(`snapshot ${JSON.stringify(name)} not found in the cluster`);
  }

  /**
   * Asks every node that takes work, but those in `known`, whether it holds `tag` as `tenant` sees it (bounded by
   * LOOKUP_TIMEOUT_MS); each that does is recorded in the directory and returned.
   */
  private async askHolders(tag: string, tenant: string | null, known: readonly string[]): Promise<string[]> {
    const signal = AbortSignal.timeout(LOOKUP_TIMEOUT_MS);
    const others = this.usable().filter((n) => !known.includes(n.name));
    const answers = await Promise.allSettled(
      others.map(async (node) => {
        const epoch = this.calls.epochOf(node.name) ?? node.epoch;
        const info = await this.calls.json<{ tag: string; owner?: string | null }>(
          node.name,
          { method: "GET", path: `/v1/snapshots/${encodeURIComponent(tag)}` },
          tenant,
          signal,
        );
        return { node: node.name, epoch, owner: info.owner ?? null };
      }),
    );
    const found: string[] = [];
    for (const answer of answers) {
      if (answer.status !== "fulfilled") continue;
      const { node, epoch, owner } = answer.value;
      this.directory.learnSnapshot(node, epoch, { tag, owner, digest: null });
      found.push(node);
    }
    return found;
  }

  /** Nodes that take work now: schedulable in the cluster view, and their link up. */
  usable(): NodeView[] {
    return this.view.schedulable().filter((n) => this.links.isUp(n.name));
  }

  slots(node: NodeView): number {
    const available = node.node.status?.available;
    if (!available) return 0;
    const byMemory = Math.floor(available.memoryMiB / this.perSandboxMiB);
    return Math.max(0, Math.min(available.sandboxes, byMemory) - (this.placing.get(node.name) ?? 0));
  }

  /** Free slots of `nodes` together. */
  private room(nodes: readonly NodeView[]): number {
    return nodes.reduce((sum, node) => sum + this.slots(node), 0);
  }

  /** The nodes holding `target`, among those that take work. */
  holders(target: SnapshotTarget): NodeView[] {
    const usable = this.usable();
    if (target.kind === "local") return usable.filter((n) => target.nodes.includes(n.name));
    const holding = new Set(this.view.holders(target.snapshot.digest));
    return usable.filter((n) => holding.has(n.name));
  }

  /**
   * Where `n` children of `target` go: shares on holders, best-of-K first, spilling over; for a ForkdSnapshot
   * with too few holders, the best other nodes pull it first. Reserves the slots until `release`.
   */
  async place(target: SnapshotTarget, n: number): Promise<{ shares: Share[]; release: () => void }> {
    let holders = this.holders(target);
    if (target.kind === "local" && target.askAs !== undefined && this.room(holders) < n) {
      // The directory's holders are full: a node that got the tag since its stream last reported may have room.
      const more = await this.askHolders(target.tag, target.askAs, target.nodes);
      target.nodes.push(...more);
      holders = this.holders(target);
    }
    const shares = this.share(holders, n);
    let placed = shares.reduce((sum, s) => sum + s.count, 0);
    if (placed < n && target.kind === "cluster") {
      const others = this.usable().filter((node) => !shares.some((s) => s.node === node.name));
      for (const extra of this.share(others, n - placed)) {
        await this.pull(extra.node, target.snapshot);
        shares.push(extra);
        placed += extra.count;
        if (placed >= n) break;
      }
    }
    if (placed < n) {
      const usable = this.usable();
      const why =
        usable.length === 0
          ? "no node takes work now (none is ready with a live Lease)"
          : target.kind === "local"
            ? `snapshot ${target.tag} is only on ${target.nodes.join(", ")}, with room for ${placed}`
            : `the cluster has room for ${placed} more sandbox${placed === 1 ? "" : "es"} now`;
      throw new ForkdError("unavailable", `cannot place ${n} sandbox${n === 1 ? "" : "es"}: ${why}`);
    }
    for (const share of shares)
      this.placing.set(share.node, (this.placing.get(share.node) ?? 0) + share.count);
    let released = false;
    return {
      shares,
      release: () => {
        if (released) return;
        released = true;
        for (const share of shares) {
          const left = (this.placing.get(share.node) ?? 0) - share.count;
          if (left > 0) this.placing.set(share.node, left);
          else this.placing.delete(share.node);
        }
      },
    };
  }

  /** Best-of-K picks until `n` are placed or no candidate has room. */
  private share(candidates: NodeView[], n: number): Share[] {
    const left = new Map(candidates.map((c) => [c.name, this.slots(c)]));
    const shares: Share[] = [];
    let remaining = n;
    while (remaining > 0) {
      const open = candidates.filter(
        (c) => (left.get(c.name) ?? 0) > 0 && !shares.some((s) => s.node === c.name),
      );
      if (open.length === 0) break;
      const best = bestOf(open, this.k, (c) => left.get(c.name) ?? 0);
      const count = Math.min(remaining, left.get(best.name) ?? 0);
      shares.push({ node: best.name, count });
      remaining -= count;
    }
    return shares;
  }

  /** Has `node` pull `snapshot` (one pull per node and digest at a time from this gateway). */
  async pull(node: string, snapshot: SnapshotView): Promise<void> {
    const key = `${node}\0${snapshot.digest}`;
    let pulling = this.pulls.get(key);
    if (!pulling) {
      const body: PullBody = {
        reference: snapshot.reference,
        digest: snapshot.digest,
        tag: snapshot.name,
        aliases: snapshot.aliases,
        ...(this.options.insecureRegistry ? { insecure: true } : {}),
      };
      pulling = this.calls
        .json<PullAnswer>(
          node,
          { method: "POST", path: NODE_ROUTES.pull, json: body, deadlineMs: PULL_DEADLINE_MS },
          null,
        )
        .then(() => {})
        .finally(() => this.pulls.delete(key));
      this.pulls.set(key, pulling);
    }
    await pulling;
  }
}

/** Of `k` candidates drawn at random (all when there are fewer), the one scoring highest. */
export function bestOf<T>(candidates: readonly T[], k: number, score: (c: T) => number): T {
  const pool = [...candidates];
  const drawn: T[] = [];
  while (drawn.length < k && pool.length > 0) drawn.push(pool.splice(randomInt(pool.length), 1)[0] as T);
  return drawn.reduce((best, c) => (score(c) > score(best) ? c : best));
}
