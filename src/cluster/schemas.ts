/**
 * The fields of forkd's cluster objects, declared once as TypeBox schemas: the TypeScript types below come
 * from them, and so do the CRDs' OpenAPI validation (crds.ts), so a field the code writes is a field the API
 * server accepts. The schemas use only what a CRD's structural schema allows (every node typed, no `const`,
 * no `additionalProperties` beside `properties`); rules the API server checks with CEL are named `rules` here.
 *
 * Nothing here is per sandbox: these objects describe nodes, snapshots and pools, and change at most every few
 * seconds (docs/kubernetes.md).
 */
import { type Static, type TSchema, Type } from "@sinclair/typebox";
import { SANDBOX_ID_PATTERN, TAG_PATTERN } from "../common/limits.js";
import { IMAGE_REFERENCE } from "../common/names.js";
import type { FORKD_API } from "./api-group.js";

/** A CEL rule the API server evaluates on writes (x-kubernetes-validations). */
interface CelRule {
  rule: string;
  message: string;
}
const rules = (...list: CelRule[]) => ({ "x-kubernetes-validations": list });

/** Every bounded number and list, named (the API server also bounds CEL's cost by them). */
export const CLUSTER_LIMITS = {
  snapshotsPerNode: 4096,
  poolsPerNode: 512,
  aliasesPerSnapshot: 32,
  poolNodes: 4096,
  conditions: 16,
  urlChars: 2048,
  referenceChars: 1024,
  versionChars: 64,
  replicas: 100_000,
  /** A DNS subdomain (RFC 1123), as Kubernetes names objects and nodes. */
  objectNameChars: 253,
  /** Durable pauses one node lists (a pause beyond answers 507): each entry carries its sealed record. */
  durablePausesPerNode: 32,
  /** A sealed sandbox record (durable-record.ts), base64: 32 of them keep a ForkdNode far below etcd's limit. */
  sealedRecordChars: 12_288,
  /**
   * Adoptions handed to one node, and entries handed over from one, at once (the controller removes each once
   * done or moot: hand-over.ts; a node with this many pending adoptions is not chosen).
   */
  handOversPerNode: 64,
  sandboxIdChars: 64,
} as const;

const TENANT_PATTERN = "^[a-z0-9][a-z0-9_-]{0,62}$";
const SHA256_DIGEST = "^sha256:[0-9a-f]{64}$";
const DNS_SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/** A sandbox id as daemons make them (it becomes a path on the adopting node: never trusted as is). */
const sandboxId = (description: string) =>
  Type.String({ pattern: SANDBOX_ID_PATTERN, maxLength: CLUSTER_LIMITS.sandboxIdChars, description });

const count = (description: string, max?: number) =>
  Type.Integer({ minimum: 0, ...(max === undefined ? {} : { maximum: max }), description });
const digest = (description: string) => Type.String({ pattern: SHA256_DIGEST, description });
const objectName = (description: string) =>
  Type.String({ pattern: DNS_SUBDOMAIN, maxLength: CLUSTER_LIMITS.objectNameChars, description });
/** A string-valued enum (TypeBox's literal unions become `const`, which CRD schemas lack). */
const oneOf = <T extends string>(values: readonly T[], description: string) =>
  Type.Unsafe<T>({ type: "string", enum: [...values], description });

/** metav1.Condition, as `kubectl wait --for=condition=Ready` and every controller library read it. */
export const Condition = Type.Object({
  type: Type.String({
    maxLength: 316,
    pattern:
      "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
  }),
  status: oneOf(["True", "False", "Unknown"] as const, "True, False or Unknown"),
  observedGeneration: Type.Optional(Type.Integer({ minimum: 0 })),
  lastTransitionTime: Type.String({ format: "date-time" }),
  reason: Type.String({ minLength: 1, maxLength: 1024, pattern: "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$" }),
  message: Type.String({ maxLength: 32768 }),
});
export type Condition = Static<typeof Condition>;

const conditions = Type.Array(Condition, {
  maxItems: CLUSTER_LIMITS.conditions,
  "x-kubernetes-list-type": "map",
  "x-kubernetes-list-map-keys": ["type"],
  description: "the object's state, as standard conditions (Ready, ...)",
});

/** A list whose items merge by `key` (server-side apply) and are unique by it. */
const listMap = <T extends TSchema>(item: T, key: string, maxItems: number, description: string) =>
  Type.Array(item, {
    maxItems,
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": [key],
    description,
  });

// ---- ForkdNode: one per Kubernetes node running the daemon, named after that node ----

/** A paused sandbox whose layers are in the registry and whose sealed record is here (docs/kubernetes.md). */
export const DurablePause = Type.Object({
  id: sandboxId("the sandbox's id (kept on the node that adopts it)"),
  owner: Type.Optional(
    Type.String({ pattern: TENANT_PATTERN, description: "its tenant (absent: an admin's)" }),
  ),
  reference: Type.String({
    pattern: IMAGE_REFERENCE.source,
    maxLength: CLUSTER_LIMITS.referenceChars,
    description: "the pushed pause chain: host[:port]/name:tag",
  }),
  digest: digest("the pushed chain's manifest digest"),
  parentDigest: Type.Optional(digest("the digest of the snapshot it was spawned from, when it has one")),
  epoch: count("the node's epoch when it paused"),
  pausedAt: Type.String({ format: "date-time", description: "when it was paused" }),
  record: Type.String({
    maxLength: CLUSTER_LIMITS.sealedRecordChars,
    pattern: "^v1\\.[A-Za-z0-9_-]+$",
    description: "the sandbox's record, sealed with a key of the cluster credential (AES-256-GCM)",
  }),
});
export type DurablePause = Static<typeof DurablePause>;

/** A durable pause of a fenced node handed to this node by the controller. */
export const Adoption = Type.Object({
  id: sandboxId("the sandbox's id"),
  fromNode: objectName("the fenced node it was paused on"),
  fromEpoch: count("that node's epoch when it paused (its entry is looked up under it)"),
});
export type Adoption = Static<typeof Adoption>;

/** A durable pause of this (fenced) node that the controller handed to another node. */
export const HandedOver = Type.Object({
  id: sandboxId("the sandbox's id"),
  toNode: objectName("the node that adopts it"),
});
export type HandedOver = Static<typeof HandedOver>;

export const ForkdNodeSpec = Type.Object(
  {
    url: Type.String({
      pattern: "^https?://[^\\s/?#]+(/[^\\s?#]*)?$",
      maxLength: CLUSTER_LIMITS.urlChars,
      description: "where the gateway reaches this node's daemon (its cluster listener)",
    }),
    epoch: Type.Integer({
      minimum: 0,
      default: 0,
      description:
        "set by the controller, never lowered: raised each time the node is fenced; a node whose status.observedEpoch is below it kills what it no longer owns before it takes work",
    }),
    unschedulable: Type.Boolean({ default: false, description: "no new sandboxes are placed here (cordon)" }),
    adoptions: Type.Optional(
      listMap(
        Adoption,
        "id",
        CLUSTER_LIMITS.handOversPerNode,
        "durable pauses of fenced nodes the controller handed to this node: it pulls and inserts each",
      ),
    ),
    handedOver: Type.Optional(
      listMap(
        HandedOver,
        "id",
        CLUSTER_LIMITS.handOversPerNode,
        "durable pauses of this node the controller handed to another once it fenced this one: they are not this node's any more",
      ),
    ),
  },
  rules({ rule: "self.epoch >= oldSelf.epoch", message: "spec.epoch may only be raised" }),
);
export type ForkdNodeSpec = Static<typeof ForkdNodeSpec>;

export const NodeCapacity = Type.Object({
  sandboxes: count("sandboxes this node admits at once"),
  memoryMiB: count("memory for guests, MiB"),
  vcpus: count("guest vCPUs"),
  diskMiB: count("local disk for snapshots and sandboxes, MiB"),
});
export type NodeCapacity = Static<typeof NodeCapacity>;

export const HeldSnapshot = Type.Object({
  digest: digest("the snapshot's manifest digest"),
  reference: Type.Optional(
    Type.String({ maxLength: CLUSTER_LIMITS.referenceChars, description: "where it was pulled from" }),
  ),
  sizeMiB: Type.Optional(count("disk it takes on this node, MiB")),
});
export type HeldSnapshot = Static<typeof HeldSnapshot>;

export const PoolLevel = Type.Object({
  digest: digest("the pooled snapshot's digest"),
  ready: count("warm VMs ready now"),
  target: count("warm VMs the controller asked this node for"),
});
export type PoolLevel = Static<typeof PoolLevel>;

export const ForkdNodeStatus = Type.Object({
  version: Type.Optional(
    Type.String({ maxLength: CLUSTER_LIMITS.versionChars, description: "forkd's version" }),
  ),
  observedEpoch: Type.Optional(count("the epoch this daemon runs under")),
  capacity: Type.Optional(NodeCapacity),
  available: Type.Optional(NodeCapacity),
  sandboxes: Type.Optional(count("sandboxes alive here now")),
  snapshots: Type.Optional(
    listMap(HeldSnapshot, "digest", CLUSTER_LIMITS.snapshotsPerNode, "snapshots held on local disk"),
  ),
  pools: Type.Optional(listMap(PoolLevel, "digest", CLUSTER_LIMITS.poolsPerNode, "warm pool levels here")),
  durablePauses: Type.Optional(
    listMap(
      DurablePause,
      "id",
      CLUSTER_LIMITS.durablePausesPerNode,
      "paused sandboxes pushed to the registry: another node can resume them once this one is fenced",
    ),
  ),
  adopted: Type.Optional(
    Type.Array(sandboxId("a sandbox id"), {
      maxItems: CLUSTER_LIMITS.handOversPerNode,
      "x-kubernetes-list-type": "set",
      description:
        "the ids of spec.adoptions this node is done with (adopted, or refused for good: its log says why); the controller then removes them from spec.adoptions",
    }),
  ),
  conditions: Type.Optional(conditions),
});
export type ForkdNodeStatus = Static<typeof ForkdNodeStatus>;

/** Rules on the whole ForkdNode (they see spec and status together). */
export const FORKD_NODE_RULES: CelRule[] = [
  {
    rule: "!has(self.status) || !has(self.status.observedEpoch) || self.status.observedEpoch <= self.spec.epoch",
    message: "status.observedEpoch cannot be ahead of spec.epoch",
  },
];

// ---- ForkdSnapshot: a snapshot the cluster knows by name, and the E2B template names it answers to ----

export const ForkdSnapshotSpec = Type.Object(
  {
    reference: Type.String({
      pattern: IMAGE_REFERENCE.source,
      maxLength: CLUSTER_LIMITS.referenceChars,
      description: "the OCI reference nodes pull it from (forkd push/pull): host[:port]/name[:tag][@digest]",
    }),
    digest: digest("the snapshot's manifest digest: what nodes hold and placement matches"),
    aliases: Type.Optional(
      Type.Array(Type.String({ pattern: TAG_PATTERN, description: "an E2B template name or id" }), {
        maxItems: CLUSTER_LIMITS.aliasesPerSnapshot,
        "x-kubernetes-list-type": "set",
        description: "names E2B callers may use as the template (besides the object's name)",
      }),
    ),
    prepull: Type.Integer({
      minimum: 0,
      maximum: CLUSTER_LIMITS.poolNodes,
      default: 0,
      description: "how many nodes should hold it before anyone asks (0: pulled on first use)",
    }),
  },
  rules({
    rule: "!self.reference.contains('@') || self.reference.endsWith('@' + self.digest)",
    message: "a reference with a digest must name spec.digest",
  }),
);
export type ForkdSnapshotSpec = Static<typeof ForkdSnapshotSpec>;

export const ForkdSnapshotStatus = Type.Object({
  observedGeneration: Type.Optional(Type.Integer({ minimum: 0 })),
  holders: Type.Optional(count("nodes holding it now")),
  conditions: Type.Optional(conditions),
});
export type ForkdSnapshotStatus = Static<typeof ForkdSnapshotStatus>;

// ---- ForkdWarmPool: VMs kept warm for a snapshot, spread over the nodes that hold it ----

export const PoolSpread = Type.Object({
  maxPerNode: Type.Optional(
    Type.Integer({
      minimum: 1,
      maximum: CLUSTER_LIMITS.replicas,
      description: "at most this many on one node",
    }),
  ),
  minNodes: Type.Optional(
    Type.Integer({
      minimum: 1,
      maximum: CLUSTER_LIMITS.poolNodes,
      description: "over at least this many nodes",
    }),
  ),
});
export type PoolSpread = Static<typeof PoolSpread>;

export const ForkdWarmPoolSpec = Type.Object(
  {
    snapshot: objectName("the ForkdSnapshot (same namespace) whose VMs are kept warm"),
    replicas: Type.Integer({
      minimum: 0,
      maximum: CLUSTER_LIMITS.replicas,
      default: 0,
      description: "warm VMs wanted across the cluster (the /scale subresource sets it)",
    }),
    spread: Type.Optional(PoolSpread),
  },
  rules(
    {
      rule: "!has(self.spread) || !has(self.spread.minNodes) || self.replicas == 0 || self.spread.minNodes <= self.replicas",
      message: "spread.minNodes cannot exceed replicas",
    },
    { rule: "self.snapshot == oldSelf.snapshot", message: "spec.snapshot is immutable: make a new pool" },
  ),
);
export type ForkdWarmPoolSpec = Static<typeof ForkdWarmPoolSpec>;

export const PoolNode = Type.Object({
  name: objectName("a node holding part of the pool"),
  ready: count("warm VMs ready there"),
});

export const ForkdWarmPoolStatus = Type.Object({
  observedGeneration: Type.Optional(Type.Integer({ minimum: 0 })),
  replicas: Type.Optional(count("warm VMs ready across the cluster")),
  nodes: Type.Optional(listMap(PoolNode, "name", CLUSTER_LIMITS.poolNodes, "where they are")),
  conditions: Type.Optional(conditions),
});
export type ForkdWarmPoolStatus = Static<typeof ForkdWarmPoolStatus>;

// ---- the objects as the API serves them ----

/** The metadata fields forkd reads and writes (the API server keeps the rest). */
export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface ForkdObject<Kind extends string, Spec, Status> {
  apiVersion: typeof FORKD_API;
  kind: Kind;
  metadata: ObjectMeta;
  spec: Spec;
  status?: Status;
}

export type ForkdNode = ForkdObject<"ForkdNode", ForkdNodeSpec, ForkdNodeStatus>;
export type ForkdSnapshot = ForkdObject<"ForkdSnapshot", ForkdSnapshotSpec, ForkdSnapshotStatus>;
export type ForkdWarmPool = ForkdObject<"ForkdWarmPool", ForkdWarmPoolSpec, ForkdWarmPoolStatus>;
