/**
 * What the gateway (and the cluster controller) and a node daemon say to each other, declared once for both ends:
 * the headers every cluster call carries, the node's cluster routes and their bodies, and the node's event
 * stream. A node in cluster mode takes calls only with the cluster credential (the node token, never a user's),
 * and only under the fencing epoch it runs under (docs/kubernetes.md, "Failures").
 */

/** Headers of every call the gateway or the controller makes to a node; the node removes them once checked. */
export const CLUSTER_HEADERS = {
  /** The node token (the `node-token` key of the tokens Secret). */
  token: "forkd-cluster-token",
  /**
   * The caller's view of the node's ForkdNode spec.epoch. A node refuses a call under any other epoch than the
   * one it runs under: an older one comes from a stale view, a newer one means the node was fenced.
   */
  epoch: "forkd-cluster-epoch",
  /** The tenant the call acts for (absent: an admin). The node applies that tenant's view, as for its token. */
  tenant: "forkd-cluster-tenant",
} as const;

/** The routes a node daemon serves in cluster mode (hidden from its OpenAPI document: only forkd calls them). */
export const NODE_ROUTES = {
  /** GET: the node's event stream (NDJSON NodeEvent lines): its whole state first, then every change. */
  events: "/v1/cluster/events",
  /** POST PullBody: pull a snapshot chain from the registry (one pull per digest at a time). */
  pull: "/v1/cluster/pull",
  /** POST PushBody: push a snapshot chain to the registry. */
  push: "/v1/cluster/push",
  /** PUT /v1/cluster/pools/:tag PoolBody: keep that many VMs of a snapshot warm (0 drains it). */
  pools: "/v1/cluster/pools",
  /**
   * POST /v1/cluster/durable-pauses/:id (no body): push paused sandbox id's chain to the cluster's registry and
   * list it, sealed, in the node's ForkdNode status (DurablePauseAnswer once both are accepted).
   */
  durablePauses: "/v1/cluster/durable-pauses",
} as const;

/** A sandbox as the node's event stream names it: enough for the gateway's directory and its admission. */
export interface SandboxRef {
  id: string;
  status: string;
  /** The tenant that owns it; null: an admin's. */
  owner: string | null;
  snapshot_tag: string;
  created_at_unix: number;
}

/** A snapshot as the event stream names it (the gateway places spawns of local snapshots where they are). */
export interface SnapshotRef {
  tag: string;
  owner: string | null;
  /** The registry digest it was pulled from or pushed as, when there is one. */
  digest: string | null;
}

/** One line of the event stream. */
export type NodeEvent =
  | {
      type: "state";
      node: string;
      epoch: number;
      sandboxes: SandboxRef[];
      snapshots: SnapshotRef[];
    }
  | { type: "sandbox"; sandbox: SandboxRef }
  | { type: "sandbox-gone"; id: string }
  | { type: "snapshot"; snapshot: SnapshotRef }
  | { type: "snapshot-gone"; tag: string }
  /** Sent on a quiet stream so both ends notice a dead connection. */
  | { type: "heartbeat"; epoch: number };

/** How often the node sends a heartbeat on a quiet event stream; a gateway that hears nothing for 3x drops it. */
export const EVENT_HEARTBEAT_MS = 2_000;
/** How often the node looks for changes to stream (its sandbox list is in memory: cheap). */
export const EVENT_POLL_MS = 200;

export interface PullBody {
  /** host[:port]/name[:tag][@digest] (a ForkdSnapshot's spec.reference). */
  reference: string;
  /** The manifest digest the pull must find (a ForkdSnapshot's spec.digest); another is refused. */
  digest: string;
  /** The tag the head gets on the node (the ForkdSnapshot's name). */
  tag: string;
  /** Template aliases to point at it on the node (the ForkdSnapshot's aliases). */
  aliases?: string[];
  /** Plain HTTP or unverified TLS to a registry not on loopback. */
  insecure?: boolean;
  /**
   * The tenant the pulled snapshot belongs to (a fork's branch of a tenant's sandbox); absent: an admin's,
   * which every tenant may spawn from (a shared template).
   */
  owner?: string | null;
}

export interface PullAnswer {
  tag: string;
  digest: string;
  /** Layers this pull wrote; empty when the node already held the chain. */
  installed: string[];
  /** false: another pull of the same digest was running, and this call waited for it. */
  pulled: boolean;
  ms: number;
}

export interface PushBody {
  tag: string;
  reference: string;
  insecure?: boolean;
  /** Leave the guest image out (pull then needs it cached: nodes that already hold the parent chain). */
  without_image?: boolean;
}

export interface PushAnswer {
  tag: string;
  reference: string;
  digest: string;
  /** Bytes the registry did not have yet. */
  uploaded_bytes: number;
  ms: number;
}

export interface DurablePauseAnswer {
  id: string;
  reference: string;
  digest: string;
  /** Bytes the registry did not have yet (the pause layer, on a chain it holds). */
  uploaded_bytes: number;
  push_ms: number;
  /** The ForkdNode status write. */
  status_ms: number;
}

export interface PoolBody {
  /** Warm VMs wanted here (0 drains the pool). */
  size: number;
}
