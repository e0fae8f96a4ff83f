/**
 * Fork of N across nodes (beyond E2B, whose fork stays on one node). When the source's node has room for all N
 * children, the node forks as a single daemon does. When it has not, the source is BRANCHed once (a diff layer
 * over the chain it was spawned from: it keeps running), that one layer is pushed to the registry next to its
 * chain (the chain's blobs are there already, so only the new layer and the small manifests part are sent),
 * and the children are placed on the nodes that hold the parent chain: the source's node restores its share
 * from the branch directly, the others pull the branch (their copy of the chain is reused as it is) and
 * restore theirs. Each child's result says on which node it runs. Children inherit the source's metadata
 * (env vars given at the source's spawn stay with the source's node, which never hands them out). The branch
 * is retired on every node: it goes once its children are gone.
 */
import type { Static } from "@sinclair/typebox";
import type { ForkBody } from "../api/schemas.js";
import {
  NODE_ROUTES,
  type PullAnswer,
  type PullBody,
  type PushAnswer,
  type PushBody,
} from "../cluster/protocol.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import type { SnapshotView } from "./cluster-view.js";
import type { GatewayContext } from "./context.js";
import type { SnapshotTarget } from "./placement.js";
import type { SpawnedSandbox } from "./spawn.js";

/** A push or pull of one diff layer; the registry is on the cluster's network. */
const TRANSFER_DEADLINE_MS = 10 * 60_000;

interface ForkAnswer {
  tag: string;
  mode: string;
  pause_ms: number;
  children: { sandbox: (SpawnedSandbox & { node?: string }) | null; error: unknown }[];
}

interface SourceInfo extends SpawnedSandbox {
  metadata: Record<string, string>;
  snapshot_tag: string;
}

interface BranchAnswer {
  tag: string;
  status: string;
  mode: string;
  pause_ms: number;
}

export async function forkAcrossNodes(
  context: GatewayContext,
  tenant: string | null,
  id: string,
  body: Static<typeof ForkBody>,
): Promise<ForkAnswer> {
  const count = body.count ?? 1;
  const source = await context.locator.locate(id, tenant);
  const sourceNode = context.view.node(source.node);
  const room = sourceNode ? context.placer.slots(sourceNode) : 0;
  if (room >= count) return forkOnOneNode(context, tenant, source.node, id, body);

  const info = await context.calls.json<SourceInfo>(
    source.node,
    { method: "GET", path: `/v1/sandboxes/${id}` },
    tenant,
  );
  const chain = sharedChainOf(context, source.node, info, room, count);
  const releaseTenant = context.admission.reserve(tenant, count);
  try {
    const branch = await branchAndPush(context, tenant, source.node, id, chain);
    const { children, pulled } = await spawnFromBranch(
      context,
      tenant,
      source.node,
      chain,
      branch,
      info,
      body,
    );
    await retire(context, pulled, branch.tag, tenant);
    return {
      tag: branch.tag,
      mode: branch.mode,
      pause_ms: branch.pause_ms,
      children: children.flatMap((child) =>
        child.value.map((sandbox) => ({ sandbox: { ...sandbox, node: child.node }, error: null })),
      ),
    };
  } finally {
    releaseTenant();
  }
}

/** The ForkdSnapshot the source was spawned from: other nodes hold it, so they can take children. */
function sharedChainOf(
  context: GatewayContext,
  node: string,
  info: SourceInfo,
  room: number,
  count: number,
): SnapshotView {
  const chain = context.view.snapshot(info.snapshot_tag);
  if (chain) return chain;
  if (room > 0) {
    throw new ForkdError(
      "unavailable",
      `node ${node} has room for ${room} of ${count} children, and the source's snapshot ` +
        `${info.snapshot_tag} is not a ForkdSnapshot other nodes could hold: fork at most ${room} here`,
    );
  }
  throw new ForkdError("unavailable", `node ${node} has no room for a fork of ${sandboxes(count)}`);
}

interface PushedBranch extends BranchAnswer {
  reference: string;
  digest: string;
}

/** BRANCHes the source once (a diff layer on its chain) and pushes that layer next to the chain. */
async function branchAndPush(
  context: GatewayContext,
  tenant: string | null,
  node: string,
  id: string,
  chain: SnapshotView,
): Promise<PushedBranch> {
  const branch = await context.calls.json<BranchAnswer>(
    node,
    {
      method: "POST",
      path: `/v1/sandboxes/${id}/branch`,
      json: { mode: "diff", wait: true },
      deadlineMs: 0,
    },
    tenant,
  );
  const reference = `${repositoryOf(chain.reference)}:${branch.tag}`;
  const pushBody: PushBody = {
    tag: branch.tag,
    reference,
    without_image: true,
    ...(context.registry.insecure ? { insecure: true } : {}),
  };
  const pushed = await context.calls.json<PushAnswer>(
    node,
    { method: "POST", path: NODE_ROUTES.push, json: pushBody, deadlineMs: TRANSFER_DEADLINE_MS },
    null,
  );
  context.logger.info(
    { source: id, branch: branch.tag, uploaded_bytes: pushed.uploaded_bytes, push_ms: pushed.ms },
    "fork across nodes: branch pushed",
  );
  return { ...branch, reference, digest: pushed.digest };
}

/**
 * The children: the branch is where the source is; elsewhere it goes to the nodes holding its parent chain,
 * each pulling the branch once before its share. Resolves with the children and the nodes that hold the branch.
 */
async function spawnFromBranch(
  context: GatewayContext,
  tenant: string | null,
  sourceNode: string,
  chain: SnapshotView,
  branch: PushedBranch,
  info: SourceInfo,
  body: Static<typeof ForkBody>,
) {
  const holders = context.placer
    .holders({ kind: "cluster", tag: chain.name, snapshot: chain })
    .map((n) => n.name);
  const target: SnapshotTarget = {
    kind: "local",
    tag: branch.tag,
    nodes: [...new Set([sourceNode, ...holders])],
  };
  const pulled = new Set<string>([sourceNode]);
  const children = await context.spawner.spawn(
    tenant,
    target,
    body.count ?? 1,
    async (share) => {
      if (!pulled.has(share.node)) {
        await pullBranch(context, share.node, branch, tenant);
        pulled.add(share.node);
      }
      return context.calls.json<SpawnedSandbox[]>(
        share.node,
        {
          method: "POST",
          path: "/v1/sandboxes",
          json: {
            snapshot_tag: branch.tag,
            n: share.count,
            metadata: info.metadata,
            ...(body.timeout_ms === undefined ? {} : { timeout_ms: body.timeout_ms }),
          },
          deadlineMs: 0,
        },
        tenant,
      );
    },
    (answer) => answer,
    { tenantReserved: true },
  );
  return { children, pulled: [...pulled] };
}

async function pullBranch(
  context: GatewayContext,
  node: string,
  branch: PushedBranch,
  tenant: string | null,
): Promise<void> {
  const pull: PullBody = {
    reference: branch.reference,
    digest: branch.digest,
    tag: branch.tag,
    owner: tenant,
    ...(context.registry.insecure ? { insecure: true } : {}),
  };
  await context.calls.json<PullAnswer>(
    node,
    { method: "POST", path: NODE_ROUTES.pull, json: pull, deadlineMs: TRANSFER_DEADLINE_MS },
    null,
  );
}

/** The fork as a single daemon makes it, each child saying where it runs. */
async function forkOnOneNode(
  context: GatewayContext,
  tenant: string | null,
  node: string,
  id: string,
  body: Static<typeof ForkBody>,
): Promise<ForkAnswer> {
  const release = context.admission.reserve(tenant, body.count ?? 1);
  try {
    const answer = await context.calls.json<ForkAnswer>(
      node,
      { method: "POST", path: `/v1/sandboxes/${id}/fork`, json: body, deadlineMs: 0 },
      tenant,
    );
    const epoch = context.calls.epochOf(node) ?? 0;
    for (const child of answer.children)
      if (child.sandbox) context.directory.upsert(node, epoch, child.sandbox);
    return {
      ...answer,
      children: answer.children.map((c) => (c.sandbox ? { ...c, sandbox: { ...c.sandbox, node } } : c)),
    };
  } finally {
    release();
  }
}

/** The branch goes from each node once nothing there needs it (E2B's template delete: a retire). */
async function retire(
  context: GatewayContext,
  nodes: string[],
  tag: string,
  tenant: string | null,
): Promise<void> {
  await Promise.all(
    nodes.map((node) =>
      context.calls
        .json(node, { method: "DELETE", path: `/templates/${encodeURIComponent(tag)}` }, tenant)
        .catch((err: unknown) =>
          context.logger.warn({ node, tag, err: errorMessage(err) }, "could not retire a fork's branch"),
        ),
    ),
  );
}

/** `host/name:tag@sha256:...` -> `host/name` */
export function repositoryOf(reference: string): string {
  const noDigest = reference.replace(/@sha256:[0-9a-f]{64}$/, "");
  const slash = noDigest.lastIndexOf("/");
  const tail = noDigest.slice(slash + 1).replace(/:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/, "");
  return `${noDigest.slice(0, slash + 1)}${tail}`;
}

const sandboxes = (n: number) => `${n} sandbox${n === 1 ? "" : "es"}`;
