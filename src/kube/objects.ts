/**
 * forkd's kinds through the API server, sent and read as raw JSON (CustomObjectsApi): the typed models of the
 * client would drop fields they do not know by name. Every call has a deadline (a partitioned API server must
 * not hang a node's renewals or the gateway's reads), and writes of status go to the status subresource as JSON
 * merge patches, so a node and the controller never overwrite each other's fields.
 */
import {
  type ConfigurationOptions,
  CustomObjectsApi,
  type KubeConfig,
  type ObservableMiddleware,
  PatchStrategy,
  setHeaderMiddleware,
} from "@kubernetes/client-node";
import {
  FORKD_API,
  FORKD_API_GROUP,
  FORKD_API_VERSION,
  FORKD_NODE,
  FORKD_SNAPSHOT,
  FORKD_WARM_POOL,
  type KindNames,
} from "../cluster/api-group.js";
import type {
  ForkdNode,
  ForkdNodeSpec,
  ForkdNodeStatus,
  ForkdObject,
  ForkdSnapshot,
  ForkdSnapshotStatus,
  ForkdWarmPool,
  ForkdWarmPoolSpec,
  ForkdWarmPoolStatus,
} from "../cluster/schemas.js";
import { FORKD_VERSION } from "../common/version.js";

/** One API call's deadline. */
export const KUBE_CALL_TIMEOUT_MS = 10_000;

/**
 * Per-call options: a deadline (the client sends no timeout of its own) and forkd's user agent, plus a
 * Content-Type for patches.
 */
export function callOptions(
  timeoutMs = KUBE_CALL_TIMEOUT_MS,
  contentType?: string,
): ConfigurationOptions<ObservableMiddleware> {
  const agent = setHeaderMiddleware("User-Agent", `forkd/${FORKD_VERSION}`);
  const middleware: ObservableMiddleware[] = [
    {
      pre: (request) => {
        request.setSignal(AbortSignal.timeout(timeoutMs));
        return agent.pre(request);
      },
      post: (response) => agent.post(response),
    },
  ];
  if (contentType !== undefined) middleware.push(setHeaderMiddleware("Content-Type", contentType));
  return { middleware, middlewareMergeStrategy: "append" };
}

interface ListOf<T> {
  items: T[];
  metadata?: { resourceVersion?: string };
}

/** One of forkd's kinds in one namespace. */
export class KindClient<Kind extends string, Spec, Status> {
  private readonly api: CustomObjectsApi;
  private readonly at: { group: string; version: string; namespace: string; plural: string };

  constructor(
    config: KubeConfig,
    readonly namespace: string,
    readonly names: KindNames,
  ) {
    this.api = config.makeApiClient(CustomObjectsApi);
    this.at = { group: FORKD_API_GROUP, version: FORKD_API_VERSION, namespace, plural: names.plural };
  }

  async get(name: string): Promise<ForkdObject<Kind, Spec, Status>> {
    return (await this.api.getNamespacedCustomObject({ ...this.at, name }, callOptions())) as ForkdObject<
      Kind,
      Spec,
      Status
    >;
  }

  async list(): Promise<ForkdObject<Kind, Spec, Status>[]> {
    const list = (await this.api.listNamespacedCustomObject(this.at, callOptions())) as ListOf<
      ForkdObject<Kind, Spec, Status>
    >;
    return list.items;
  }

  async create(name: string, spec: Spec, labels?: Record<string, string>) {
    const body = {
      apiVersion: FORKD_API,
      kind: this.names.kind,
      metadata: { name, ...(labels ? { labels } : {}) },
      spec,
    };
    return (await this.api.createNamespacedCustomObject({ ...this.at, body }, callOptions())) as ForkdObject<
      Kind,
      Spec,
      Status
    >;
  }

  /** Replaces the whole object (its resourceVersion makes a concurrent change a 409). */
  async replace(object: ForkdObject<Kind, Spec, Status>) {
    return (await this.api.replaceNamespacedCustomObject(
      { ...this.at, name: object.metadata.name, body: object },
      callOptions(),
    )) as ForkdObject<Kind, Spec, Status>;
  }

  /** A JSON merge patch of the spec (null deletes a field). */
  async patchSpec(name: string, spec: Partial<Spec>) {
    return (await this.api.patchNamespacedCustomObject(
      { ...this.at, name, body: { spec } },
      callOptions(KUBE_CALL_TIMEOUT_MS, PatchStrategy.MergePatch),
    )) as ForkdObject<Kind, Spec, Status>;
  }

  /** A JSON merge patch of the status subresource: lists given are replaced whole. */
  async patchStatus(name: string, status: Partial<Status>) {
    return (await this.api.patchNamespacedCustomObjectStatus(
      { ...this.at, name, body: { status } },
      callOptions(KUBE_CALL_TIMEOUT_MS, PatchStrategy.MergePatch),
    )) as ForkdObject<Kind, Spec, Status>;
  }

  async delete(name: string): Promise<void> {
    await this.api.deleteNamespacedCustomObject({ ...this.at, name }, callOptions());
  }
}

/** The three kinds of one installation. */
export interface ForkdObjects {
  nodes: KindClient<"ForkdNode", ForkdNodeSpec, ForkdNodeStatus>;
  snapshots: KindClient<"ForkdSnapshot", ForkdSnapshot["spec"], ForkdSnapshotStatus>;
  pools: KindClient<"ForkdWarmPool", ForkdWarmPoolSpec, ForkdWarmPoolStatus>;
}

export function forkdObjects(config: KubeConfig, namespace: string): ForkdObjects {
  return {
    nodes: new KindClient(config, namespace, FORKD_NODE),
    snapshots: new KindClient(config, namespace, FORKD_SNAPSHOT),
    pools: new KindClient(config, namespace, FORKD_WARM_POOL),
  };
}

export type { ForkdNode, ForkdSnapshot, ForkdWarmPool };
