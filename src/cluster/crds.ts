/**
 * The CustomResourceDefinitions of forkd's kinds, made from the schemas in schemas.ts: validation, CEL rules,
 * the status (and, for pools, scale) subresources and the columns `kubectl get` prints. The deployment files'
 * CRD manifests are written from here (`npm run deploy:write`) and a test checks they are current.
 */
import type { TSchema } from "@sinclair/typebox";
import {
  FORKD_API_GROUP,
  FORKD_API_VERSION,
  FORKD_CATEGORY,
  FORKD_NODE,
  FORKD_SNAPSHOT,
  FORKD_WARM_POOL,
  type KindNames,
} from "./api-group.js";
import {
  FORKD_NODE_RULES,
  ForkdNodeSpec,
  ForkdNodeStatus,
  ForkdSnapshotSpec,
  ForkdSnapshotStatus,
  ForkdWarmPoolSpec,
  ForkdWarmPoolStatus,
} from "./schemas.js";

export interface PrinterColumn {
  name: string;
  type: "string" | "integer" | "boolean" | "date";
  jsonPath: string;
  description?: string;
  priority?: number;
}

/** The parts of an apiextensions.k8s.io/v1 CustomResourceDefinition forkd uses. */
export interface CustomResourceDefinition {
  apiVersion: "apiextensions.k8s.io/v1";
  kind: "CustomResourceDefinition";
  metadata: { name: string; labels: Record<string, string> };
  spec: {
    group: string;
    names: KindNames & { categories: string[] };
    scope: "Namespaced";
    versions: {
      name: string;
      served: true;
      storage: true;
      schema: { openAPIV3Schema: Record<string, unknown> };
      subresources: { status: Record<string, never>; scale?: Record<string, string> };
      additionalPrinterColumns: PrinterColumn[];
    }[];
  };
}

interface KindDefinition {
  names: KindNames;
  description: string;
  spec: TSchema;
  status: TSchema;
  rules?: { rule: string; message: string }[];
  columns: PrinterColumn[];
  scale?: { specReplicasPath: string; statusReplicasPath: string };
}

const AGE: PrinterColumn = { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" };
const READY_CONDITION = '.status.conditions[?(@.type=="Ready")].status';

const DEFINITIONS: KindDefinition[] = [
  {
    names: FORKD_NODE,
    description:
      "A Kubernetes node running the forkd daemon, named after that node: its address and fencing epoch (spec, set at registration and by the controller) and what it holds (status, written by the node on change).",
    spec: ForkdNodeSpec,
    status: ForkdNodeStatus,
    rules: FORKD_NODE_RULES,
    columns: [
      { name: "Ready", type: "string", jsonPath: READY_CONDITION },
      { name: "Version", type: "string", jsonPath: ".status.version" },
      { name: "Epoch", type: "integer", jsonPath: ".spec.epoch" },
      { name: "Sandboxes", type: "integer", jsonPath: ".status.sandboxes" },
      { name: "Capacity", type: "integer", jsonPath: ".status.capacity.sandboxes" },
      { name: "Unschedulable", type: "boolean", jsonPath: ".spec.unschedulable", priority: 1 },
      { name: "URL", type: "string", jsonPath: ".spec.url", priority: 1 },
      AGE,
    ],
  },
  {
    names: FORKD_SNAPSHOT,
    description:
      "A snapshot the cluster serves by name: the OCI reference and digest nodes pull, the E2B template names it answers to, and how many nodes should hold it ahead of use.",
    spec: ForkdSnapshotSpec,
    status: ForkdSnapshotStatus,
    columns: [
      { name: "Reference", type: "string", jsonPath: ".spec.reference" },
      { name: "Prepull", type: "integer", jsonPath: ".spec.prepull" },
      { name: "Holders", type: "integer", jsonPath: ".status.holders" },
      { name: "Ready", type: "string", jsonPath: READY_CONDITION },
      { name: "Digest", type: "string", jsonPath: ".spec.digest", priority: 1 },
      AGE,
    ],
  },
  {
    names: FORKD_WARM_POOL,
    description:
      "Warm VMs of one snapshot kept ready across the nodes that hold it; replicas is scalable (/scale) by an autoscaler.",
    spec: ForkdWarmPoolSpec,
    status: ForkdWarmPoolStatus,
    columns: [
      { name: "Snapshot", type: "string", jsonPath: ".spec.snapshot" },
      { name: "Desired", type: "integer", jsonPath: ".spec.replicas" },
      { name: "Ready", type: "integer", jsonPath: ".status.replicas" },
      AGE,
    ],
    scale: { specReplicasPath: ".spec.replicas", statusReplicasPath: ".status.replicas" },
  },
];

/** TypeBox marks its schemas with symbol keys; the API server gets the plain JSON Schema. */
const plain = (schema: TSchema): Record<string, unknown> => JSON.parse(JSON.stringify(schema));

function crdOf(def: KindDefinition, labels: Record<string, string>): CustomResourceDefinition {
  const openAPIV3Schema: Record<string, unknown> = {
    type: "object",
    description: def.description,
    required: ["spec"],
    properties: {
      apiVersion: { type: "string" },
      kind: { type: "string" },
      metadata: { type: "object" },
      spec: plain(def.spec),
      status: plain(def.status),
    },
    ...(def.rules ? { "x-kubernetes-validations": def.rules } : {}),
  };
  return {
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    metadata: { name: `${def.names.plural}.${FORKD_API_GROUP}`, labels },
    spec: {
      group: FORKD_API_GROUP,
      names: { ...def.names, categories: [FORKD_CATEGORY] },
      scope: "Namespaced",
      versions: [
        {
          name: FORKD_API_VERSION,
          served: true,
          storage: true,
          schema: { openAPIV3Schema },
          subresources: { status: {}, ...(def.scale ? { scale: def.scale } : {}) },
          additionalPrinterColumns: def.columns,
        },
      ],
    },
  };
}

/** The three CRDs, labelled with `labels` (the deployment files' common labels). */
export function customResourceDefinitions(labels: Record<string, string>): CustomResourceDefinition[] {
  return DEFINITIONS.map((def) => crdOf(def, labels));
}
