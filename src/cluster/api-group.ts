/**
 * Names forkd's cluster objects share with every component that reads or writes them (node daemons, the
 * gateway, its controller, the deployment files and the tests): the API group, the kinds, the labels, the
 * Lease naming and the well-known objects of an installation. Declared once here.
 */

/** forkd's Kubernetes API group and its one served version (alpha: fields may still change). */
export const FORKD_API_GROUP = "forkd.dev";
export const FORKD_API_VERSION = "v1alpha1";
export const FORKD_API = `${FORKD_API_GROUP}/${FORKD_API_VERSION}` as const;

export interface KindNames {
  kind: string;
  listKind: string;
  plural: string;
  singular: string;
  shortNames: string[];
}

function kindNames(kind: string, shortName: string): KindNames {
  const singular = kind.toLowerCase();
  return { kind, listKind: `${kind}List`, plural: `${singular}s`, singular, shortNames: [shortName] };
}

/** The kinds, all namespaced in the installation's namespace (so each component's rights are a Role there). */
export const FORKD_NODE = kindNames("ForkdNode", "fdn");
export const FORKD_SNAPSHOT = kindNames("ForkdSnapshot", "fds");
export const FORKD_WARM_POOL = kindNames("ForkdWarmPool", "fdwp");
export const FORKD_KINDS = [FORKD_NODE, FORKD_SNAPSHOT, FORKD_WARM_POOL] as const;

/** `kubectl get forkd` lists every forkd object. */
export const FORKD_CATEGORY = "forkd";

/** The namespace the deployment files install into unless told otherwise. */
export const DEFAULT_NAMESPACE = "forkd";

/** Kubernetes nodes carrying this label (value "true") run the node daemon. */
export const NODE_SELECTOR_LABEL = "forkd.dev/node";

/** The three components, each with a ServiceAccount of its own (deploy/, docs/kubernetes.md). */
export const COMPONENTS = ["node", "gateway", "controller"] as const;
export type Component = (typeof COMPONENTS)[number];
export const serviceAccountName = (component: Component) => `forkd-${component}`;

/** The Secret holding the credentials the components share (the key names are in `TOKEN_KEYS`). */
export const TOKENS_SECRET_NAME = "forkd-tokens";
export const TOKEN_KEYS = {
  /** The gateway's credential towards node daemons: nodes take cluster calls only with it. */
  node: "node-token",
  /** The operator's admin token at the gateway (also its E2B API key). */
  admin: "admin-token",
} as const;

/**
 * A node daemon's Lease (coordination.k8s.io/v1) has its node's name, in the installation's namespace; the
 * controller's leader-election Lease has this name, which no node may take (the node admission policy).
 */
export const CONTROLLER_LEASE_NAME = "forkd-controller";

/** How long a node's Lease holds without renewal, and how often the node renews it. */
export const NODE_LEASE_DURATION_SECONDS = 15;
export const NODE_LEASE_RENEW_INTERVAL_MS = 5_000;

/** The least interval between two writes of a ForkdNode's status (written on change, at most this often). */
export const NODE_STATUS_MIN_INTERVAL_MS = 3_000;

/** Kubernetes' own recommended labels, which the deployment files put on every object they make. */
export const APP_LABELS = {
  name: "app.kubernetes.io/name",
  instance: "app.kubernetes.io/instance",
  component: "app.kubernetes.io/component",
  partOf: "app.kubernetes.io/part-of",
  version: "app.kubernetes.io/version",
} as const;
