/**
 * A node's durable pauses (docs/kubernetes.md, "The durable pause"): the push of a paused sandbox's chain to
 * the cluster's registry with its sealed record in this node's status.durablePauses (at most
 * durablePausesPerNode: 507 beyond), which entries stay listed (see `listed`), and the adoption of another
 * node's entry that the controller put in this node's spec.adoptions: the entry read from that node's
 * ForkdNode under the epoch it was paused in, its record unsealed with the node token (altered, moved or
 * invalid: refused for good), the chain pulled by digest, the sandbox inserted as paused under its id. The
 * adoptions it is done with are listed in its status (status.adopted) for the controller to remove; the pushed
 * artifacts that can no longer be used are deleted from the registry (artifact-deletes.ts).
 */
import { readFile } from "node:fs/promises";
import type { Logger } from "pino";
import { type DurableRecord, RecordError, sealRecord, unsealRecord } from "../cluster/durable-record.js";
import type { DurablePauseAnswer } from "../cluster/protocol.js";
import { CLUSTER_LIMITS, type DurablePause, type ForkdNode, type HandedOver } from "../cluster/schemas.js";
import { replaceFile } from "../common/durable-fs.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { IMAGE_REFERENCE } from "../common/names.js";
import type { Services } from "../controller/tenancy/tenant-view.js";
import type { ForkdObjects } from "../kube/objects.js";
import type { ArtifactDeletes } from "./artifact-deletes.js";
import type { HeldDigests } from "./digests.js";
import { registryFailure } from "./registry-errors.js";

export interface DurablePauseSettings {
  /** host[:port] of the cluster's registry (--cluster-registry); undefined: durable pauses are refused. */
  registry: string | undefined;
  insecure: boolean;
  /** The node token: the record's seal. */
  credential: string;
  /** The node tokens before a rotation, tried after `credential` to unseal (none: only `credential`). */
  previousCredentials?: () => Promise<string[]>;
}

/** The artifact of sandbox `id`'s durable pause, by digest, in `registry` (where every node pushes them). */
export const artifactOf = (registry: string, id: string, digest: string) =>
  `${registry}/forkd/paused/${id}@${digest}`;

/**
 * The handed-over ids of node `me` that its adopters are done with: an adopter that lists the id in
 * status.adopted, or whose spec.adoptions no longer names it from `me` (the controller removed it: done), or
 * whose ForkdNode is gone. Only those leave `me`'s status: an entry dropped before its adopter read it would
 * lose the sandbox.
 */
export function releasedHandOvers(me: string, handed: readonly HandedOver[], nodes: readonly ForkdNode[]) {
  const released = new Set<string>();
  for (const h of handed) {
    const adopter = nodes.find((n) => n.metadata.name === h.toNode);
    const pending = adopter?.spec.adoptions?.some((a) => a.id === h.id && a.fromNode === me) ?? false;
    if (!pending || adopter?.status?.adopted?.includes(h.id)) released.add(h.id);
  }
  return released;
}

/** How often an adoption that failed is tried again. */
const ADOPT_RETRY_MS = 5_000;
/** Adoptions remembered as done (a sandbox adopted, then killed, must not be adopted again). */
const MAX_DONE = 1024;
const adoptionKey = (a: { id: string; fromNode: string; fromEpoch: number }) =>
  `${a.id}@${a.fromNode}@${a.fromEpoch}`;

export class DurablePauses {
  private readonly entries = new Map<string, DurablePause>();
  private readonly adopting = new Map<string, number>();
  private done: string[] = [];

  constructor(
    private readonly settings: DurablePauseSettings,
    private readonly objects: ForkdObjects,
    private readonly digests: HeldDigests,
    private readonly logger: Logger,
    /** Where done adoptions are kept across restarts (a JSON list, replaced atomically). */
    private readonly doneFile: string,
    /** The registry deletes of pushed artifacts that can no longer be used. */
    private readonly deletes: ArtifactDeletes,
  ) {}

  /** Reads the adoptions done before a restart. */
  async load(): Promise<void> {
    const text = await readFile(this.doneFile, "utf8").catch(() => "[]");
    try {
      const list = JSON.parse(text) as unknown;
      if (Array.isArray(list))
        this.done = list.filter((k): k is string => typeof k === "string").slice(-MAX_DONE);
    } catch {
      this.done = [];
    }
  }

  private async markDone(key: string): Promise<void> {
    this.done = [...this.done.filter((k) => k !== key), key].slice(-MAX_DONE);
    await replaceFile(this.doneFile, JSON.stringify(this.done));
  }

  /** The entries this node listed before a restart (its ForkdNode's status). */
  restore(node: ForkdNode): void {
    for (const entry of node.status?.durablePauses ?? []) this.entries.set(entry.id, entry);
  }

  /**
   * What status.durablePauses says now: an entry of the current epoch while its sandbox is still paused here;
   * an entry of an older epoch (this node was fenced since) until the controller handed it over and its
   * adopter is done with it (`released`: releasedHandOvers).
   */
  listed(
    node: ForkdNode | undefined,
    epoch: number,
    paused: ReadonlySet<string>,
    fencing = false,
    released: ReadonlySet<string> = new Set(),
  ): DurablePause[] {
    // While fencing, sandboxes are being killed under the old epoch: nothing is dropped (or deleted) then.
    if (!fencing) this.drop(node, epoch, paused, released);
    return [...this.entries.values()].sort((a, b) => a.id.localeCompare(b.id));
  }

  private drop(
    node: ForkdNode | undefined,
    epoch: number,
    paused: ReadonlySet<string>,
    released: ReadonlySet<string>,
  ): void {
    const handed = new Set((node?.spec.handedOver ?? []).map((h) => h.id));
    for (const [id, entry] of this.entries) {
      if (entry.epoch < epoch) {
        // Handed over and adopted: the artifact is the adopter's now (it deletes it once it is used).
        if (handed.has(id) && released.has(id)) this.entries.delete(id);
      } else if (!paused.has(id)) {
        // Resumed, killed or timed out here: nobody can use the artifact any more.
        this.entries.delete(id);
        const registry = this.settings.registry;
        if (registry) this.deletes.enqueue(artifactOf(registry, id, entry.digest));
      }
    }
    this.deletes.sweep(paused);
  }

  /** The ids of `node`'s spec.adoptions this node is done with (its status.adopted). */
  adoptedIds(node: ForkdNode | undefined): string[] {
    return (node?.spec.adoptions ?? [])
      .filter((a) => this.done.includes(adoptionKey(a)))
      .map((a) => a.id)
      .sort();
  }

  /** Tries the registry deletes that failed before again. */
  retryDeletes(): Promise<void> {
    return this.deletes.flush();
  }

  /** Pushes paused sandbox `id` and adds its entry; `publish` writes the status (resolves once accepted). */
  async push(
    services: Services,
    id: string,
    epoch: number,
    publish: () => Promise<void>,
  ): Promise<DurablePauseAnswer> {
    const { registry, insecure, credential } = this.settings;
    if (!registry) {
      throw new ForkdError(
        "conflict",
        "this node has no cluster registry (--cluster-registry): no durable pauses",
      );
    }
    if (!this.entries.has(id) && this.entries.size >= CLUSTER_LIMITS.durablePausesPerNode) {
      throw new ForkdError(
        "insufficient_storage",
        `this node lists ${this.entries.size} durable pauses, the most it may: resume or kill one first`,
      );
    }
    const record = recordOf(services, id);
    const reference = `${registry}/forkd/paused/${id}:${record.pause_tag}`;
    const started = performance.now();
    let pushed: Awaited<ReturnType<Services["snapshots"]["push"]>>;
    try {
      // Without the guest image: the adopter holds the parent chain, and so the image (chooseAdopter).
      pushed = await services.snapshots.push({
        tag: record.pause_tag,
        reference,
        insecure,
        withoutImage: true,
      });
    } catch (err) {
      throw registryFailure(reference, err);
    }
    const pushMs = Math.round(performance.now() - started);
    const parent = await services.snapshots.get(record.snapshot_tag).catch(() => undefined);
    const parentDigest = parent ? this.digests.of(parent.tag, parent.created_at_unix)?.digest : undefined;
    const earlier = this.entries.get(id);
    if (earlier && earlier.digest !== pushed.digest)
      this.deletes.enqueue(artifactOf(registry, id, earlier.digest));
    this.entries.set(id, {
      id,
      ...(record.owner === null ? {} : { owner: record.owner }),
      reference: pushed.reference,
      digest: pushed.digest,
      ...(parentDigest === undefined ? {} : { parentDigest }),
      epoch,
      pausedAt: new Date(record.paused_at_unix_ms).toISOString(),
      record: sealRecord(record, pushed.digest, credential),
    });
    const written = performance.now();
    await publish();
    const statusMs = Math.round(performance.now() - written);
    return {
      id,
      reference: pushed.reference,
      digest: pushed.digest,
      uploaded_bytes: pushed.uploaded_bytes,
      push_ms: pushMs,
      status_ms: statusMs,
    };
  }

  /** Starts the adoptions `node` (this node's ForkdNode) lists that are not here yet (each retried until done). */
  adoptListed(services: Services, node: ForkdNode): void {
    for (const adoption of node.spec.adoptions ?? []) {
      if (this.done.includes(adoptionKey(adoption))) continue;
      if (services.sandboxes.list().some((s) => s.id === adoption.id)) continue;
      if (Date.now() < (this.adopting.get(adoption.id) ?? 0)) continue;
      this.adopting.set(adoption.id, Number.POSITIVE_INFINITY);
      void this.adopt(services, adoption.id, adoption.fromNode, adoption.fromEpoch)
        .then(() => this.markDone(adoptionKey(adoption)))
        .then(() => this.adopting.delete(adoption.id))
        .catch(async (err: unknown) => {
          const log = { id: adoption.id, from: adoption.fromNode, err: errorMessage(err) };
          if (err instanceof RecordError) {
            // Not sealed by a node of this cluster, or altered: no retry makes it verify.
            this.logger.error(
              log,
              "adoption refused: the durable pause's record does not verify; not retried",
            );
            this.adopting.delete(adoption.id);
            await this.markDone(adoptionKey(adoption)).catch((e: unknown) =>
              this.logger.warn({ err: errorMessage(e) }, "could not record a refused adoption"),
            );
            return;
          }
          this.adopting.set(adoption.id, Date.now() + ADOPT_RETRY_MS);
          this.logger.warn(log, "adoption failed; tried again in a few seconds");
        });
    }
  }

  private unseal(entry: DurablePause, id: string): Promise<DurableRecord> {
    const { credential, previousCredentials } = this.settings;
    return unsealAny(entry, id, credential, previousCredentials ?? (async () => []));
  }

  private async adopt(services: Services, id: string, fromNode: string, fromEpoch: number): Promise<void> {
    const from = (await this.objects.nodes.get(fromNode)) as ForkdNode;
    const entry = from.status?.durablePauses?.find((e) => e.id === id && e.epoch === fromEpoch);
    if (!entry) throw new Error(`node ${fromNode} lists no durable pause of ${id} under epoch ${fromEpoch}`);
    if (!IMAGE_REFERENCE.test(entry.reference))
      throw new RecordError(`the reference of ${id} is not a reference`);
    const record = await this.unseal(entry, id);
    const adopt = services.sandboxes.adoptPaused;
    if (!adopt) throw new Error("this daemon's sandboxes cannot be adopted into");
    const held = await services.snapshots.get(record.pause_tag).catch(() => undefined);
    if (!held) {
      try {
        await services.snapshots.pull({
          reference: entry.reference,
          digest: entry.digest,
          tag: record.pause_tag,
          insecure: this.settings.insecure,
          owner: record.owner,
        });
      } catch (err) {
        throw registryFailure(entry.reference, err);
      }
    }
    await adopt.call(services.sandboxes, record);
    const registry = this.settings.registry;
    if (registry) this.deletes.watch(id, artifactOf(registry, id, entry.digest));
    this.logger.warn({ id, from: fromNode }, "adopted a durable pause of a fenced node: paused here now");
  }
}

/** Unseals with the node token, then with each token before a rotation; the node token's refusal otherwise. */
async function unsealAny(
  entry: DurablePause,
  id: string,
  credential: string,
  previous: () => Promise<string[]>,
): Promise<DurableRecord> {
  try {
    return unsealRecord(entry.record, id, entry.digest, credential);
  } catch (err) {
    if (!(err instanceof RecordError)) throw err;
    for (const other of await previous()) {
      try {
        return unsealRecord(entry.record, id, entry.digest, other);
      } catch {
        // the next one
      }
    }
    throw err;
  }
}

function recordOf(services: Services, id: string): DurableRecord {
  const read = services.sandboxes.pausedRecord;
  if (!read) throw new ForkdError("not_implemented", "this daemon cannot make durable pauses");
  return read.call(services.sandboxes, id) as DurableRecord;
}
