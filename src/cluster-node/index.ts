/**
 * `forkd daemon --cluster-*`: a node daemon of a cluster. What it adds to a single daemon: the front door on its
 * TCP listener (front.ts: only the gateway's credential, only under its epoch), its membership (membership.ts:
 * ForkdNode, Lease, fencing) and its cluster routes (routes.ts: the event stream, pull, push, pools). The API
 * gets the front and the routes as a TrustedFront and an API extension; nothing in src/api knows of clusters.
 */
import { access } from "node:fs/promises";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import type { ApiExtensionFactory } from "../api/extensions.js";
import type { TrustedFront } from "../api/front.js";
import { errorMessage } from "../common/errors.js";
import { loadTokenFile, type Token } from "../common/tokens.js";
import type { Services } from "../controller/tenancy/tenant-view.js";
import { loadKubeConfig } from "../kube/config.js";
import { Leases } from "../kube/leases.js";
import { forkdObjects } from "../kube/objects.js";
import { ArtifactDeletes } from "./artifact-deletes.js";
import { HeldDigests } from "./digests.js";
import { DurablePauses } from "./durable-pauses.js";
import { ClusterFront } from "./front.js";
import { NodeMembership } from "./membership.js";
import { clusterRoutesExtension } from "./routes.js";
import { type CapacityLimits, nodeStatusSource, type PoolReport } from "./status.js";

export interface ClusterNodeOptions {
  namespace: string;
  nodeName: string;
  url: string;
  /** A kubeconfig file; default: KUBECONFIG, then the pod's ServiceAccount. */
  kubeconfig?: string;
  /** FORKD_HOME: digest records go under it, free disk is measured on it. */
  home: string;
  /** The cluster credential (the node token). */
  tokens: readonly Token[];
  /** host[:port] of the cluster's registry, where durable pauses go (--cluster-registry); none: refused. */
  registry?: string;
  /** Plain HTTP or unverified TLS to that registry when it is not on loopback. */
  registryInsecure?: boolean;
  /**
   * A token file of the node token(s) before a rotation (--cluster-previous-token-file): durable pause records
   * sealed under one of them still unseal. Read at each adoption (the kubelet may add it later); absent: none.
   */
  previousTokenFile?: string;
  /** Deletes a manifest (by digest) from that registry: the durable pauses' artifacts once unusable. */
  deleteArtifact: (reference: string) => Promise<void>;
  limits: CapacityLimits;
  logger: Logger;
}

/** What the daemon's warm pools offer the cluster (SandboxManager), when it can pool at all. */
export interface NodePools {
  set(tag: string, size: number): Promise<void>;
  stats(): PoolReport[];
}

const START_RETRY_MS = 2_000;

/** The seal keys of the tokens in `file` (absent: none): as the node token's, each token's digest. */
export async function previousCredentials(file: string | undefined): Promise<string[]> {
  if (file === undefined) return [];
  try {
    await access(file);
  } catch {
    return [];
  }
  return (await loadTokenFile(file)).map((t) => t.digest.toString("hex"));
}

export class ClusterNode {
  readonly front: TrustedFront;
  private readonly membership: NodeMembership;
  private readonly durable: DurablePauses;
  private readonly deletes: ArtifactDeletes;
  private starting: Promise<void> | undefined;
  private stopped = false;

  private constructor(
    private readonly options: ClusterNodeOptions,
    private readonly digests: HeldDigests,
    private pools: NodePools | undefined,
  ) {
    const config = loadKubeConfig(options.kubeconfig);
    const objects = forkdObjects(config, options.namespace);
    const logger = options.logger.child({ component: "cluster" });
    this.deletes = new ArtifactDeletes(
      path.join(options.home, "cluster", "registry-deletes.json"),
      options.deleteArtifact,
      logger,
    );
    this.durable = new DurablePauses(
      {
        registry: options.registry,
        insecure: options.registryInsecure === true,
        // The seal's key comes from the node token as the node holds it (its digest: never written anywhere).
        credential: options.tokens[0]?.digest.toString("hex") ?? "",
        previousCredentials: () => previousCredentials(options.previousTokenFile),
      },
      objects,
      digests,
      logger,
      path.join(options.home, "cluster", "adopted.json"),
      this.deletes,
    );
    this.membership = new NodeMembership({
      objects,
      leases: new Leases(config, options.namespace),
      nodeName: options.nodeName,
      url: options.url,
      status: nodeStatusSource({
        limits: options.limits,
        home: options.home,
        digests,
        pools: () => this.pools?.stats() ?? [],
      }),
      durable: this.durable,
      logger,
    });
    this.front = new ClusterFront(options.tokens, this.membership);
  }

  static async open(options: ClusterNodeOptions): Promise<ClusterNode> {
    const digests = await HeldDigests.open(path.join(options.home, "cluster"));
    const node = new ClusterNode(options, digests, undefined);
    await node.durable.load();
    await node.deletes.load();
    return node;
  }

  /** The daemon's pools, once its services are open. */
  usePools(pools: NodePools | undefined): void {
    this.pools = pools;
  }

  /**
   * The extension that mounts the cluster routes and, once the services are open, joins the cluster (retrying
   * while the API server cannot be reached: calls are refused meanwhile).
   */
  extension(): ApiExtensionFactory {
    return (context) => {
      this.starting = this.join(context.services);
      const routes = clusterRoutesExtension({
        membership: this.membership,
        digests: this.digests,
        durable: this.durable,
        setPool: this.pools ? (tag, size) => void this.setPool(tag, size) : undefined,
      });
      return {
        ...routes,
        close: async () => {
          this.stopped = true;
          await routes.close?.();
          await this.starting?.catch(() => {});
          await this.membership.stop();
        },
      };
    };
  }

  private async setPool(tag: string, size: number): Promise<void> {
    await this.pools
      ?.set(tag, size)
      .catch((err: unknown) =>
        this.options.logger.warn({ tag, size, err: errorMessage(err) }, "could not set a warm pool"),
      );
  }

  private async join(services: Services): Promise<void> {
    for (let attempt = 1; !this.stopped; attempt++) {
      try {
        await this.membership.start(services);
        return;
      } catch (err) {
        this.options.logger.warn(
          { attempt, err: errorMessage(err) },
          "joining the cluster failed; retrying (cluster calls are refused meanwhile)",
        );
        await sleep(START_RETRY_MS);
      }
    }
  }
}
