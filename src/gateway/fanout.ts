/**
 * Calls that concern the whole cluster (lists, kill-all) ask every node that still counts (its Lease holds):
 * in parallel, each bounded by FANOUT_TIMEOUT_MS, so one slow or partitioned node delays an answer by at most
 * that long and never hangs it. Nodes that did not answer are named in the `x-forkd-unanswered-nodes` header:
 * the answer is then the cluster less those nodes, and says so.
 */
import type { FastifyReply } from "fastify";
import type { GatewayContext } from "./context.js";
import type { NodeCall } from "./node-calls.js";

export const FANOUT_TIMEOUT_MS = 10_000;
export const UNANSWERED_HEADER = "x-forkd-unanswered-nodes";

export interface NodeAnswer<T> {
  node: string;
  value: T;
}

export async function fanout<T>(
  context: GatewayContext,
  call: NodeCall,
  tenant: string | null,
  reply?: FastifyReply,
): Promise<NodeAnswer<T>[]> {
  const nodes = context.view
    .allNodes()
    .filter((n) => n.leaseHeld && !context.view.isLost(n.name, n.epoch).lost && context.links.client(n.name));
  const signal = AbortSignal.timeout(FANOUT_TIMEOUT_MS);
  const settled = await Promise.allSettled(
    nodes.map(async (n) => ({
      node: n.name,
      value: await context.calls.json<T>(n.name, call, tenant, signal),
    })),
  );
  const unanswered = nodes.filter((_, i) => settled[i]?.status === "rejected").map((n) => n.name);
  if (unanswered.length > 0) {
    reply?.header(UNANSWERED_HEADER, unanswered.join(","));
    context.logger.warn(
      {
        call: `${call.method} ${call.path}`,
        unanswered,
        errors: settled.flatMap((s) =>
          s.status === "rejected" ? [String((s.reason as Error)?.message)] : [],
        ),
      },
      "nodes did not answer a cluster-wide call",
    );
  }
  return settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
}
