/**
 * Stand-ins for the gateway's unit tests, named as such: a node daemon is played by a small real HTTP server on
 * loopback that speaks the node's cluster protocol as far as the gateway uses it (src/cluster/protocol.ts: the
 * event stream, snapshot and sandbox records, spawns), and the API server's lists by plain arrays handed to the
 * gateway as its ClusterReads. No VM, no API server; the gateway itself (startGateway, its directory, links,
 * placement and relay) is the real one, over real sockets.
 *
 * A stand-in node streams only what a test tells it to (`emit`): its "poll" is the test's, so a node that holds
 * something its stream has not reported yet is a state a test sets up exactly, with no sleeps.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import pino from "pino";
import { FORKD_API } from "../../src/cluster/api-group.js";
import { CLUSTER_HEADERS, NODE_ROUTES, type NodeEvent, type SandboxRef } from "../../src/cluster/protocol.js";
import type { DurablePause, ForkdNode, ForkdSnapshot, HandedOver } from "../../src/cluster/schemas.js";
import { tokenFromString } from "../../src/common/tokens.js";
import type { ClusterReads } from "../../src/gateway/cluster-view.js";
import { type RunningGateway, startGateway } from "../../src/gateway/server.js";
import type { V1Lease } from "../../src/kube/leases.js";

export const NODE_TOKEN = "node-token-0123456789abcdef0123456789";
export const ADMIN_TOKEN = "admin-token-0123456789abcdef01234567";
export const TENANT_TOKEN = "tenant-a-token-0123456789abcdef012345";

/** What a stand-in node saw of one request. */
export interface SeenRequest {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

export interface StandInSnapshot {
  tag: string;
  owner: string | null;
  digest: string | null;
}

/** A node daemon's stand-in: its sandboxes and snapshots are what the test puts there. */
export class StandInNode {
  readonly sandboxes = new Map<string, SandboxRef>();
  readonly snapshots = new Map<string, StandInSnapshot>();
  readonly seen: SeenRequest[] = [];
  /** Free slots its ForkdNode status reports. */
  freeSandboxes = 10;
  /** >0: its answer to a sandbox list declares this many bytes (a node answering more than the gateway reads). */
  oversizedAnswer = 0;
  /** Its ForkdNode's spec.epoch (the controller raises it to fence the node); it runs under 1. */
  specEpoch = 1;
  /** The epoch it runs under (its stream's and its ForkdNode's status.observedEpoch). */
  runEpoch = 1;
  /** Its ForkdNode's status.durablePauses and spec.handedOver (what a fenced node's durable pauses say). */
  durablePauses: DurablePause[] = [];
  handedOver: HandedOver[] = [];
  /**
   * How it answers POST /v1/cluster/durable-pauses/<id> (making a pause durable): undefined, as a node with a
   * cluster registry does (200 and the push's figures); else this status and forkd error body.
   */
  durableRefusal: { status: number; error: string; code: string } | undefined;
  private readonly streams = new Set<http.ServerResponse>();
  private readonly server = http.createServer((req, res) => this.handle(req, res));
  private nextId = 0;
  url = "";

  constructor(
    readonly name: string,
    private readonly idPrefix: string,
  ) {}

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    for (const res of this.streams) res.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Tells every open event stream `event` (what the node's own poll would stream). */
  emit(event: NodeEvent): void {
    for (const res of this.streams) res.write(`${JSON.stringify(event)}\n`);
  }

  /** How many event streams (gateways) follow this node now. */
  get followers(): number {
    return this.streams.size;
  }

  /** The requests to `path` (without the query) this node answered. */
  calls(method: string, path: string): SeenRequest[] {
    return this.seen.filter((r) => r.method === method && r.url.split("?")[0] === path);
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      this.seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      if (req.headers[CLUSTER_HEADERS.token] !== NODE_TOKEN) {
        answer(res, 401, { error: "not the cluster credential", code: "unauthorized" });
      }
      this.route(req, res, body);
    });
  }

  private route(req: http.IncomingMessage, res: http.ServerResponse, body: string): void {
    const path = (req.url ?? "/").split("?")[0] as string;
    const tenant = (req.headers[CLUSTER_HEADERS.tenant] as string | undefined) ?? null;
    if (req.method === "GET" && path === NODE_ROUTES.events) {
      this.follow(res);
      return;
    }
    const snapshot = /^\/v1\/snapshots\/([^/]+)$/.exec(path);
    if (req.method === "GET" && snapshot) {
      const held = this.snapshots.get(decodeURIComponent(snapshot[1] as string));
      if (!held || (tenant !== null && held.owner !== null && held.owner !== tenant)) {
        answer(res, 404, { error: "snapshot not found", code: "not_found" });
        return;
      }
      answer(res, 200, { ...held, dir: "/srv/host/path" });
      return;
    }
    const sandbox = /^\/v1\/sandboxes\/([^/]+)$/.exec(path);
    if (req.method === "GET" && sandbox) {
      const ref = this.sandboxes.get(sandbox[1] as string);
      if (!ref || (tenant !== null && ref.owner !== tenant)) {
        answer(res, 404, { error: "sandbox not found", code: "not_found" });
        return;
      }
      answer(res, 200, ref);
      return;
    }
    if (req.method === "POST" && path === "/v1/sandboxes") {
      this.spawn(res, body, tenant);
      return;
    }
    if (req.method === "GET" && path === "/v1/sandboxes") {
      this.list(res, tenant);
      return;
    }
    if (req.method === "POST" && this.pause(res, path, tenant)) return;
    if (req.method === "POST" && path === NODE_ROUTES.pull) {
      const pull = JSON.parse(body) as { tag: string; digest: string };
      this.snapshots.set(pull.tag, { tag: pull.tag, owner: null, digest: pull.digest });
      answer(res, 200, { tag: pull.tag, digest: pull.digest, installed: [], pulled: true, ms: 1 });
      return;
    }
    // Anything else: what the relay delivered, for the test to read (a guest's own Server-Timing on ?timing).
    if (req.url?.includes("timing=1")) res.setHeader("server-timing", "app;dur=5");
    answer(res, 200, { node: this.name, method: req.method, url: req.url, headers: req.headers, body });
  }

  /**
   * The pause routes as a node answers them: forkd's (`/v1/sandboxes/<id>/pause`: the paused record), E2B's
   * (`/sandboxes/<id>/pause`: 204, 409 when it is paused already), and making a paused sandbox durable. False:
   * not one of them.
   */
  private pause(res: http.ServerResponse, path: string, tenant: string | null): boolean {
    const durable = new RegExp(`^${NODE_ROUTES.durablePauses}/([^/]+)$`).exec(path);
    const pause = /^(\/v1)?\/sandboxes\/([^/]+)\/pause$/.exec(path);
    const id = durable?.[1] ?? pause?.[2];
    if (id === undefined) return false;
    const ref = this.sandboxes.get(id);
    const e2b = pause !== null && pause[1] === undefined;
    const refuse = (status: number, error: string, code: string) =>
      answer(res, status, e2b ? { code: status, message: error } : { error, code });
    if (!ref || (tenant !== null && ref.owner !== tenant))
      refuse(404, `sandbox ${id} not found`, "not_found");
    else if (durable && this.durableRefusal) {
      const { status, error, code } = this.durableRefusal;
      refuse(status, error, code);
    } else if (durable) {
      const digest = `sha256:${"d".repeat(64)}`;
      const reference = `registry.test/forkd/paused/${id}:p1`;
      answer(res, 200, { id, reference, digest, uploaded_bytes: 512, push_ms: 3, status_ms: 1 });
    } else if (ref.status === "paused") refuse(409, `sandbox ${id} is already paused`, "conflict");
    else {
      ref.status = "paused";
      if (e2b) {
        res.writeHead(204);
        res.end();
      } else answer(res, 200, { id, status: "paused", pause_ms: 1 });
    }
    return true;
  }

  private list(res: http.ServerResponse, tenant: string | null): void {
    if (this.oversizedAnswer > 0) {
      res.writeHead(200, { "content-type": "application/json", "content-length": this.oversizedAnswer });
      res.end("[");
      return;
    }
    answer(
      res,
      200,
      [...this.sandboxes.values()].filter((s) => tenant === null || s.owner === tenant),
    );
  }

  private follow(res: http.ServerResponse): void {
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    this.streams.add(res);
    res.on("close", () => this.streams.delete(res));
    const state: NodeEvent = {
      type: "state",
      node: this.name,
      epoch: this.runEpoch,
      sandboxes: [...this.sandboxes.values()],
      snapshots: [...this.snapshots.values()],
    };
    res.write(`${JSON.stringify(state)}\n`);
  }

  private spawn(res: http.ServerResponse, body: string, tenant: string | null): void {
    const request = JSON.parse(body) as { snapshot_tag: string; n?: number };
    if (!this.snapshots.has(request.snapshot_tag)) {
      answer(res, 404, { error: `snapshot ${request.snapshot_tag} not found`, code: "not_found" });
      return;
    }
    const made: SandboxRef[] = [];
    for (let i = 0; i < (request.n ?? 1); i++) {
      const id = `sb-${this.idPrefix}${(this.nextId++).toString(16).padStart(12 - this.idPrefix.length, "0")}`;
      const ref = {
        id,
        status: "running",
        owner: tenant,
        snapshot_tag: request.snapshot_tag,
        created_at_unix: 1,
      };
      this.sandboxes.set(id, ref);
      made.push(ref);
    }
    answer(res, 201, made);
  }

  /** The node's ForkdNode as the API server would list it (epoch 1, Ready, its free slots). */
  forkdNode(digests: string[] = []): ForkdNode {
    const free = { sandboxes: this.freeSandboxes, memoryMiB: 1 << 20, vcpus: 8, diskMiB: 1 << 20 };
    return {
      apiVersion: FORKD_API,
      kind: "ForkdNode",
      metadata: { name: this.name },
      spec: {
        url: this.url,
        epoch: this.specEpoch,
        unschedulable: false,
        ...(this.handedOver.length > 0 ? { handedOver: this.handedOver } : {}),
      },
      status: {
        observedEpoch: this.runEpoch,
        ...(this.durablePauses.length > 0 ? { durablePauses: this.durablePauses } : {}),
        capacity: free,
        available: free,
        snapshots: digests.map((digest) => ({ digest })),
        conditions: [
          {
            type: "Ready",
            status: "True",
            reason: "Up",
            message: "",
            lastTransitionTime: new Date().toISOString(),
          },
        ],
      },
    } as ForkdNode;
  }
}

function answer(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

/** A Lease renewed just now (held for 15 s by this process's clock). */
export function heldLease(name: string): V1Lease {
  return {
    metadata: { name },
    spec: { holderIdentity: name, leaseDurationSeconds: 15, renewTime: new Date() as never },
  };
}

/**
 * The API server's lists as the test publishes them: `publish` takes the stand-in nodes' ForkdNodes (with the
 * digests in `digestsOf`) and `snapshotObjects` as they are now, and the gateway sees them at its next read
 * (`gateway.context.view.read()` reads at once). Leases are renewed at each read unless the node is in `expired`.
 */
export class StandInCluster implements ClusterReads {
  readonly snapshotObjects: ForkdSnapshot[] = [];
  readonly digestsOf = new Map<string, string[]>();
  readonly expired = new Set<string>();
  private readonly renewed = new Map<string, V1Lease>();
  private published: { nodes: ForkdNode[]; snapshots: ForkdSnapshot[] } = { nodes: [], snapshots: [] };

  constructor(readonly standIns: StandInNode[]) {}

  publish(): void {
    this.published = {
      nodes: this.standIns.map((n) => n.forkdNode(this.digestsOf.get(n.name))),
      snapshots: structuredClone(this.snapshotObjects),
    };
  }

  async nodes(): Promise<ForkdNode[]> {
    return structuredClone(this.published.nodes);
  }

  async leases(): Promise<V1Lease[]> {
    return this.standIns.map((n) => {
      // An expired node's Lease stops being renewed (its renewTime stays).
      if (!this.expired.has(n.name)) this.renewed.set(n.name, heldLease(n.name));
      return this.renewed.get(n.name) as V1Lease;
    });
  }

  async snapshots(): Promise<ForkdSnapshot[]> {
    return structuredClone(this.published.snapshots);
  }
}

export interface Harness {
  gateway: RunningGateway;
  nodes: StandInNode[];
  cluster: StandInCluster;
  /** Stops the gateway and starts a new one over the same stand-ins (a gateway process restarted). */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

/** The real gateway in front of `count` stand-in nodes (node-0, node-1, ...) and the stand-in lists. */
export async function gatewayOver(
  count: number,
  options: {
    e2bDomain?: string;
    durablePause?: boolean;
    prepare?: (nodes: StandInNode[], cluster: StandInCluster) => void;
  } = {},
): Promise<Harness> {
  const nodes = Array.from({ length: count }, (_, i) => new StandInNode(`node-${i}`, `${i}`));
  for (const node of nodes) await node.start();
  const cluster = new StandInCluster(nodes);
  options.prepare?.(nodes, cluster);
  cluster.publish();
  const start = () =>
    startGateway({
      listen: { host: "127.0.0.1", port: 0 },
      namespace: "forkd-system",
      cluster,
      nodeToken: NODE_TOKEN,
      tokens: [tokenFromString(ADMIN_TOKEN), tokenFromString(TENANT_TOKEN, "tenant token", "tenant-a")],
      e2bDomain: options.e2bDomain,
      durablePause: options.durablePause,
      defaultSnapshot: "base",
      logger: pino({ level: "silent" }),
    });
  const harness: Harness = {
    gateway: await start(),
    nodes,
    cluster,
    restart: async () => {
      await harness.gateway.stop();
      harness.gateway = await start();
    },
    stop: async () => {
      await harness.gateway.stop();
      for (const node of nodes) await node.stop();
    },
  };
  return harness;
}

/** Until every stand-in node is followed by the gateway's event stream (its directory has their state). */
export async function linksUp(harness: Harness): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!harness.nodes.every((n) => harness.gateway.context.links.isUp(n.name))) {
    if (Date.now() > deadline) throw new Error("the gateway's links to the stand-in nodes did not come up");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
