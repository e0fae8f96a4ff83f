/**
 * Which node runs sandbox X, for a call about it: the directory's entry (lost when its node is: answered at
 * once), else a question to every node that takes calls (a sandbox another gateway replica placed a moment
 * ago, before this replica's stream told it), bounded by LOOKUP_TIMEOUT_MS; else unknown. A tenant finds only
 * its own sandboxes: another's answers exactly as an unknown one does.
 */

import type { SandboxRef } from "../cluster/protocol.js";
import { ForkdError, notFound } from "../common/errors.js";
import { SANDBOX_ID_PATTERN } from "../common/limits.js";
import type { ClusterView } from "./cluster-view.js";
import type { Directory, Placement } from "./directory.js";
import type { NodeCaller } from "./node-calls.js";
import type { NodeLinks } from "./node-links.js";

export const LOOKUP_TIMEOUT_MS = 3_000;
const SANDBOX_ID = new RegExp(SANDBOX_ID_PATTERN);

/** The error for a sandbox whose node was lost: it is gone, and stays gone (its node kills it when fenced). */
export function lostError(id: string, why: string): ForkdError {
  return new ForkdError("not_found", `sandbox ${id} was lost with its node: ${why}`, {
    detail: { lost: true },
  });
}

/** Seconds a client should wait before asking again about a sandbox being moved. */
export const MOVING_RETRY_AFTER_S = 2;

/**
 * The error for a durably paused sandbox of a lost node that is being handed to another node: retryable (503),
 * unlike `lost`; it is answered until the adopting node reports the sandbox.
 */
export function movingError(id: string, from: string, to: string | undefined): ForkdError {
  const where = to === undefined ? "a node is being chosen" : `node ${to} is adopting it`;
  return new ForkdError(
    "unavailable",
    `sandbox ${id} is being moved from node ${from} (lost; its pause is durable): ${where}; retry in a few seconds`,
    { detail: { moving: true, retryable: true, from, to: to ?? null, retry_after_s: MOVING_RETRY_AFTER_S } },
  );
}

export class SandboxLocator {
  constructor(
    private readonly view: ClusterView,
    private readonly links: NodeLinks,
    private readonly directory: Directory,
    private readonly calls: NodeCaller,
  ) {}

  /**
   * The placement of `id` as `tenant` may see it (undefined tenant: any owner, the data plane), or throws
   * not_found (unknown, another tenant's, or lost: then saying so).
   */
  async locate(id: string, tenant: string | null | undefined): Promise<Placement> {
    // A name no sandbox can have (an E2b-Sandbox-Id header is the caller's text) is unknown: no node is asked.
    if (!SANDBOX_ID.test(id)) throw notFound(`sandbox ${JSON.stringify(id.slice(0, 80))} not found`);
    let entry = this.directory.lookup(id);
    if (!entry) entry = await this.ask(id, tenant ?? null);
    if (!entry) {
      this.throwIfMoving(id, tenant, undefined);
      throw notFound(`sandbox ${JSON.stringify(id)} not found`);
    }
    if (tenant !== undefined && tenant !== null && entry.owner !== tenant) {
      throw notFound(`sandbox ${JSON.stringify(id)} not found`);
    }
    const lost = this.view.isLost(entry.node, entry.epoch);
    if (lost.lost) {
      this.throwIfMoving(id, tenant, entry.node);
      throw lostError(id, lost.why);
    }
    return entry;
  }

  /** Throws movingError when a lost node's durable pause of `id` (visible to `tenant`) is being handed over. */
  private throwIfMoving(id: string, tenant: string | null | undefined, from: string | undefined): void {
    const pause = this.view.durablePause(id);
    if (!pause || (from !== undefined && pause.from !== from)) return;
    if (tenant !== undefined && tenant !== null && pause.owner !== tenant) return;
    const node = this.view.node(pause.from);
    if (node && !this.view.isLost(pause.from, node.observedEpoch).lost && from === undefined) return;
    throw movingError(id, pause.from, pause.to);
  }

  /** Asks every node with a link up whether it has `id`; the first that does is recorded. */
  private async ask(id: string, tenant: string | null): Promise<Placement | undefined> {
    const nodes = this.view.allNodes().filter((n) => this.links.isUp(n.name));
    if (nodes.length === 0) return undefined;
    const signal = AbortSignal.timeout(LOOKUP_TIMEOUT_MS);
    const answers = nodes.map(async (node) => {
      const epoch = this.calls.epochOf(node.name) ?? node.epoch;
      const info = await this.calls.json<SandboxRef>(
        node.name,
        { method: "GET", path: `/v1/sandboxes/${id}` },
        tenant,
        signal,
      );
      return { node: node.name, epoch, info };
    });
    try {
      const found = await Promise.any(answers);
      this.directory.upsert(found.node, found.epoch, {
        id,
        status: found.info.status,
        owner: found.info.owner,
        snapshot_tag: found.info.snapshot_tag,
        created_at_unix: found.info.created_at_unix,
      });
      return this.directory.lookup(id);
    } catch {
      return undefined;
    }
  }
}
