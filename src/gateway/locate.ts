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
    if (!entry) throw notFound(`sandbox ${JSON.stringify(id)} not found`);
    if (tenant !== undefined && tenant !== null && entry.owner !== tenant) {
      throw notFound(`sandbox ${JSON.stringify(id)} not found`);
    }
    const lost = this.view.isLost(entry.node, entry.epoch);
    if (lost.lost) throw lostError(id, lost.why);
    return entry;
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
