/**
 * What the leader does, every RECONCILE_MS, from a fresh read of the cluster (never on a request's path: a
 * controller that stops delays this, not a single call):
 *
 * - tokens: fills the tokens Secret's empty keys (node-token, admin-token) once with random tokens;
 * - fencing: a node whose Lease has expired and that still runs under its spec.epoch gets its epoch raised
 *   (once per loss): the cluster gives up its sandboxes, the gateway stops routing to them, and the node kills
 *   them when it comes back, before it takes work again;
 * - hand-over (hand-over.ts): each durable pause of a fenced node goes to one live node's spec.adoptions (one
 *   holding its parent snapshot, which is pulled first when none does), then is marked in the fenced node's
 *   spec.handedOver; both lists are pruned once done;
 * - prepull: a ForkdSnapshot with `prepull: N` is pulled by nodes until N live nodes hold it (those with the
 *   most free disk first, one pull per node at a time); its status says how many hold it;
 * - pools: a ForkdWarmPool's replicas are spread over the live nodes holding its snapshot (evenly, at most
 *   `maxPerNode` each, over at least `minNodes`, which are made to pull it), each node told its share; a lost
 *   node's share moves to the others on the next round; its status says what is ready where.
 */
import { randomBytes } from "node:crypto";
import { type CoreV1Api, PatchStrategy, type V1Secret } from "@kubernetes/client-node";
import type { Logger } from "pino";
import { TOKEN_KEYS } from "../cluster/api-group.js";
import { CLUSTER_HEADERS, NODE_ROUTES, type PoolBody, type PullBody } from "../cluster/protocol.js";
import type { Condition, ForkdNode, ForkdSnapshot, ForkdWarmPool } from "../cluster/schemas.js";
import { errorMessage } from "../common/errors.js";
import { describeKubeError } from "../kube/errors.js";
import { LeaseObserver, type Leases } from "../kube/leases.js";
import { callOptions, type ForkdObjects } from "../kube/objects.js";
import { Controller } from "../sdk/index.js";
import { HandOver } from "./hand-over.js";

export const RECONCILE_MS = 1_000;
const POOL_RETRY_MS = 30_000;
/** A pull the controller started may take this long (a whole chain with its image). */
const PULL_DEADLINE_MS = 30 * 60_000;

export interface ReconcilerOptions {
  objects: ForkdObjects;
  leases: Leases;
  core: CoreV1Api;
  namespace: string;
  tokensSecret: string;
  insecureRegistry: boolean;
  logger: Logger;
}

interface LiveNode {
  node: ForkdNode;
  name: string;
  live: boolean;
}

export class Reconciler {
  private readonly observer = new LeaseObserver();
  private nodeToken: string | undefined;
  private readonly pulling = new Set<string>();
  private readonly fenced = new Map<string, number>();
  private readonly poolTargets = new Map<string, number>();
  private readonly clients = new Map<string, { url: string; client: Controller }>();
  /** Pool targets a node refused (it keeps no pools): asked again after POOL_RETRY_MS. */
  private readonly poolRefused = new Map<string, number>();
  private readonly written = new Map<string, string>();
  private handOverValue: HandOver | undefined;

  constructor(private readonly options: ReconcilerOptions) {}

  /** One round. Errors of one part are logged; the others still run. */
  async round(): Promise<void> {
    const { objects, leases, logger } = this.options;
    await this.ensureTokens().catch((err: unknown) =>
      logger.warn({ err: describeKubeError("filling the tokens Secret", err) }, "tokens"),
    );
    let nodes: ForkdNode[];
    let snapshots: ForkdSnapshot[];
    let pools: ForkdWarmPool[];
    try {
      const [n, l, s, p] = await Promise.all([
        objects.nodes.list(),
        leases.list(),
        objects.snapshots.list(),
        objects.pools.list(),
      ]);
      this.observer.observe(l);
      nodes = n as ForkdNode[];
      snapshots = s as ForkdSnapshot[];
      pools = p as ForkdWarmPool[];
    } catch (err) {
      logger.warn({ err: describeKubeError("reading the cluster", err) }, "reconcile read failed");
      return;
    }
    const live: LiveNode[] = nodes.map((node) => ({
      node,
      name: node.metadata.name,
      live:
        !this.observer.expired(node.metadata.name) &&
        (node.status?.observedEpoch ?? 0) === node.spec.epoch &&
        (node.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false),
    }));
    await this.fence(nodes);
    this.handOverValue ??= new HandOver(objects, logger);
    await this.handOverValue.round(live, {
      snapshots,
      pull: (node, snapshot) => this.startPull(node, snapshot),
    });
    for (const snapshot of snapshots) {
      await this.prepull(snapshot, live).catch((err: unknown) =>
        logger.warn({ snapshot: snapshot.metadata.name, err: errorMessage(err) }, "prepull"),
      );
    }
    for (const pool of pools) {
      await this.pool(pool, snapshots, live).catch((err: unknown) =>
        logger.warn({ pool: pool.metadata.name, err: errorMessage(err) }, "pool"),
      );
    }
  }

  /** Fills the Secret's empty keys once (never replaces a token someone set). */
  private async ensureTokens(): Promise<void> {
    const { core, namespace, tokensSecret } = this.options;
    const secret: V1Secret = await core.readNamespacedSecret(
      { name: tokensSecret, namespace },
      callOptions(),
    );
    const data = { ...(secret.data ?? {}) };
    let changed = false;
    for (const key of Object.values(TOKEN_KEYS)) {
      if (!data[key]) {
        data[key] = Buffer.from(randomBytes(32).toString("base64url")).toString("base64");
        changed = true;
      }
    }
    if (changed) {
      await core.patchNamespacedSecret(
        { name: tokensSecret, namespace, body: { data } },
        callOptions(undefined, PatchStrategy.MergePatch),
      );
      this.options.logger.info({ secret: tokensSecret }, "filled the tokens Secret");
    }
    const token = data[TOKEN_KEYS.node];
    this.nodeToken = token ? Buffer.from(token, "base64").toString("utf8").trim() : undefined;
  }

  /** Raises the epoch of each node lost under its current epoch (once: it then runs under an older one). */
  private async fence(nodes: ForkdNode[]): Promise<void> {
    for (const node of nodes) {
      const name = node.metadata.name;
      const observed = node.status?.observedEpoch ?? 0;
      if (!this.observer.expired(name) || observed < node.spec.epoch) continue;
      if ((this.fenced.get(name) ?? -1) >= node.spec.epoch + 1) continue;
      try {
        await this.options.objects.nodes.patchSpec(name, { epoch: node.spec.epoch + 1 });
        this.fenced.set(name, node.spec.epoch + 1);
        this.options.logger.warn(
          { node: name, epoch: node.spec.epoch + 1 },
          "fenced a node whose Lease expired: its sandboxes are given up",
        );
      } catch (err) {
        this.options.logger.warn({ node: name, err: describeKubeError("fencing", err) }, "fence failed");
      }
    }
  }

  private async prepull(snapshot: ForkdSnapshot, nodes: LiveNode[]): Promise<void> {
    const digest = snapshot.spec.digest;
    const holders = nodes.filter((n) => n.live && holds(n.node, digest));
    const want = Math.min(snapshot.spec.prepull ?? 0, nodes.filter((n) => n.live).length);
    if (holders.length < want) {
      const candidates = nodes
        .filter((n) => n.live && !holds(n.node, digest) && !this.pulling.has(`${n.name}\0${digest}`))
        .sort((a, b) => (b.node.status?.available?.diskMiB ?? 0) - (a.node.status?.available?.diskMiB ?? 0));
      for (const candidate of candidates.slice(0, want - holders.length))
        this.startPull(candidate.node, snapshot);
    }
    const ready = holders.length >= (snapshot.spec.prepull ?? 0);
    await this.writeStatus("snapshots", snapshot.metadata.name, {
      observedGeneration: snapshot.metadata.generation,
      holders: holders.length,
      conditions: [
        condition(
          snapshot.status?.conditions,
          "Ready",
          ready,
          ready ? "Held" : "Pulling",
          `${holders.length} node${holders.length === 1 ? "" : "s"} hold it, ${snapshot.spec.prepull ?? 0} wanted`,
        ),
      ],
    });
  }

  /** A pull in the background (one per node and digest at a time). */
  private startPull(node: ForkdNode, snapshot: ForkdSnapshot): void {
    const key = `${node.metadata.name}\0${snapshot.spec.digest}`;
    if (this.pulling.has(key)) return;
    this.pulling.add(key);
    const body: PullBody = {
      reference: snapshot.spec.reference,
      digest: snapshot.spec.digest,
      tag: snapshot.metadata.name,
      aliases: snapshot.spec.aliases ?? [],
      ...(this.options.insecureRegistry ? { insecure: true } : {}),
    };
    this.options.logger.info({ node: node.metadata.name, snapshot: snapshot.metadata.name }, "prepull");
    void this.call(node, { method: "POST", path: NODE_ROUTES.pull, json: body, deadlineMs: PULL_DEADLINE_MS })
      .catch((err: unknown) =>
        this.options.logger.warn(
          { node: node.metadata.name, snapshot: snapshot.metadata.name, err: errorMessage(err) },
          "prepull failed",
        ),
      )
      .finally(() => this.pulling.delete(key));
  }

  private async pool(pool: ForkdWarmPool, snapshots: ForkdSnapshot[], nodes: LiveNode[]): Promise<void> {
    const name = pool.metadata.name;
    const snapshot = snapshots.find((s) => s.metadata.name === pool.spec.snapshot);
    if (!snapshot) {
      await this.writeStatus("pools", name, {
        observedGeneration: pool.metadata.generation,
        replicas: 0,
        conditions: [
          condition(
            pool.status?.conditions,
            "Ready",
            false,
            "NoSnapshot",
            `no ForkdSnapshot ${pool.spec.snapshot}`,
          ),
        ],
      });
      return;
    }
    const digest = snapshot.spec.digest;
    const live = nodes.filter((n) => n.live);
    const holders = live.filter((n) => holds(n.node, digest));
    const minNodes = Math.min(pool.spec.spread?.minNodes ?? 1, live.length);
    if (pool.spec.replicas > 0 && holders.length < minNodes) {
      for (const n of live.filter((n) => !holds(n.node, digest)).slice(0, minNodes - holders.length)) {
        this.startPull(n.node, snapshot);
      }
    }
    const shares = spread(
      pool.spec.replicas,
      holders.map((h) => h.name),
      pool.spec.spread?.maxPerNode,
    );
    for (const node of nodes) await this.setPoolShare(pool, snapshot, node, shares);
    await this.writePoolStatus(pool, digest, live, shares);
  }

  /** Tells `node` its share of `pool` when it differs from what the node reports (retried after a refusal). */
  private async setPoolShare(
    pool: ForkdWarmPool,
    snapshot: ForkdSnapshot,
    node: LiveNode,
    shares: Map<string, number>,
  ): Promise<void> {
    const digest = snapshot.spec.digest;
    const want = node.live ? (shares.get(node.name) ?? 0) : 0;
    const key = `${node.name}\0${snapshot.metadata.name}`;
    const reported = node.node.status?.pools?.find((p) => p.digest === digest)?.target ?? 0;
    if (!node.live) {
      this.poolTargets.delete(key);
      return;
    }
    if (reported === want && this.poolTargets.get(key) === want) return;
    if (want === 0 && reported === 0 && !this.poolTargets.has(key)) return;
    if (Date.now() - (this.poolRefused.get(key) ?? 0) < POOL_RETRY_MS) return;
    const body: PoolBody = { size: want };
    try {
      await this.call(node.node, {
        method: "PUT",
        path: `${NODE_ROUTES.pools}/${encodeURIComponent(snapshot.metadata.name)}`,
        json: body,
      });
      this.poolTargets.set(key, want);
      this.poolRefused.delete(key);
    } catch (err) {
      this.poolRefused.set(key, Date.now());
      this.options.logger.warn(
        { node: node.name, pool: pool.metadata.name, err: errorMessage(err) },
        "could not set a pool",
      );
    }
  }

  /** The pool's status: warm sandboxes ready per live node, against its replicas. */
  private async writePoolStatus(
    pool: ForkdWarmPool,
    digest: string,
    live: LiveNode[],
    shares: Map<string, number>,
  ): Promise<void> {
    const perNode = live
      .map((n) => ({
        name: n.name,
        ready: n.node.status?.pools?.find((p) => p.digest === digest)?.ready ?? 0,
      }))
      .filter((n) => n.ready > 0 || (shares.get(n.name) ?? 0) > 0);
    const ready = perNode.reduce((sum, n) => sum + n.ready, 0);
    const full = ready >= pool.spec.replicas;
    await this.writeStatus("pools", pool.metadata.name, {
      observedGeneration: pool.metadata.generation,
      replicas: ready,
      nodes: perNode,
      conditions: [
        condition(
          pool.status?.conditions,
          "Ready",
          full,
          full ? "Filled" : "Filling",
          `${ready} of ${pool.spec.replicas} warm over ${perNode.length} node${perNode.length === 1 ? "" : "s"}`,
        ),
      ],
    });
  }

  /** Patches a status when it differs from what this controller last wrote there. */
  private async writeStatus(kind: "snapshots" | "pools", name: string, status: Record<string, unknown>) {
    const key = `${kind}/${name}`;
    const json = JSON.stringify(status);
    if (this.written.get(key) === json) return;
    const client = this.options.objects[kind] as {
      patchStatus(name: string, status: object): Promise<unknown>;
    };
    await client.patchStatus(name, status);
    this.written.set(key, json);
  }

  /** A call to `node` with the node token under its current epoch. */
  private async call(
    node: ForkdNode,
    request: { method: "POST" | "PUT"; path: string; json: unknown; deadlineMs?: number },
  ): Promise<unknown> {
    if (!this.nodeToken) throw new Error("the node token is not known yet");
    let entry = this.clients.get(node.metadata.name);
    if (!entry || entry.url !== node.spec.url) {
      entry = {
        url: node.spec.url,
        client: new Controller({
          url: node.spec.url,
          env: {},
          headers: { [CLUSTER_HEADERS.token]: this.nodeToken },
        }),
      };
      this.clients.set(node.metadata.name, entry);
    }
    return entry.client.json(
      {
        method: request.method,
        path: request.path,
        json: request.json,
        ...(request.deadlineMs ? { deadlineMs: request.deadlineMs } : {}),
      },
      { headers: { [CLUSTER_HEADERS.epoch]: String(node.spec.epoch) } },
    );
  }
}

function holds(node: ForkdNode, digest: string): boolean {
  return node.status?.snapshots?.some((s) => s.digest === digest) ?? false;
}

/**
 * `replicas` spread evenly over `nodes` (in order), at most `maxPerNode` each: what cannot be placed under
 * the cap stays unplaced (the pool reports fewer ready).
 */
export function spread(replicas: number, nodes: string[], maxPerNode?: number): Map<string, number> {
  const shares = new Map<string, number>();
  if (nodes.length === 0) return shares;
  const cap = maxPerNode ?? Number.POSITIVE_INFINITY;
  let left = replicas;
  while (left > 0) {
    let placed = 0;
    for (const node of [...nodes].sort()) {
      if (left === 0) break;
      const now = shares.get(node) ?? 0;
      if (now >= cap) continue;
      shares.set(node, now + 1);
      left--;
      placed++;
    }
    if (placed === 0) break;
  }
  return shares;
}

/** A condition, keeping its transition time while its status stays. */
function condition(
  before: Condition[] | undefined,
  type: string,
  ok: boolean,
  reason: string,
  message: string,
): Condition {
  const status = ok ? "True" : "False";
  const previous = before?.find((c) => c.type === type);
  const lastTransitionTime =
    previous?.status === status ? previous.lastTransitionTime : new Date().toISOString();
  return { type, status, reason, message, lastTransitionTime };
}
