/**
 * The gateway's link to each node daemon: an SDK client (src/sdk) that sends the cluster credential and the
 * node's current epoch on every call, and the node's event stream (NODE_ROUTES.events) feeding the directory.
 * A link is up while its stream delivers lines (the node sends a heartbeat on a quiet stream); a node whose
 * link is down gets no new work, though its sandboxes are not lost for that (the Lease decides that). Links
 * follow the cluster view: a node that appears gets one, a node whose epoch changes is reconnected under the
 * new epoch, a node that goes away is dropped.
 */
import type { Logger } from "pino";
import { CLUSTER_HEADERS, EVENT_HEARTBEAT_MS, type NodeEvent } from "../cluster/protocol.js";
import { errorMessage } from "../common/errors.js";
import { Controller, parseNdjson } from "../sdk/index.js";
import type { ClusterView, NodeView } from "./cluster-view.js";
import type { Directory } from "./directory.js";

/** A link that hears nothing for this long is dropped and made again. */
const SILENCE_MS = 3 * EVENT_HEARTBEAT_MS;
const RECONNECT_MS = 1_000;
/** One call to a node (placement, pulls have their own): the answer's headers must come within it. */
export const NODE_REQUEST_TIMEOUT_MS = 60_000;

export interface LinkState {
  node: string;
  up: boolean;
  /** The epoch its stream runs under. */
  epoch: number;
  since: number;
  error: string | null;
}

class NodeLink {
  up = false;
  since = Date.now();
  error: string | null = null;
  private abort = new AbortController();
  private closed = false;
  readonly client: Controller;

  constructor(
    readonly view: NodeView,
    nodeToken: string,
    private readonly directory: Directory,
    private readonly logger: Logger,
    private readonly onUp: () => void,
  ) {
    this.client = new Controller({
      url: view.url,
      requestTimeoutMs: NODE_REQUEST_TIMEOUT_MS,
      headers: { [CLUSTER_HEADERS.token]: nodeToken },
      env: {},
    });
    void this.run();
  }

  get epoch(): number {
    return this.view.epoch;
  }

  close(): void {
    this.closed = true;
    this.abort.abort();
  }

  private async run(): Promise<void> {
    while (!this.closed) {
      try {
        await this.follow();
      } catch (err) {
        if (this.closed) return;
        this.error = errorMessage(err);
      }
      if (this.up) this.logger.warn({ node: this.view.name, err: this.error }, "node event stream lost");
      this.setUp(false);
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
      this.abort = new AbortController();
    }
  }

  private async follow(): Promise<void> {
    const signal = this.abort.signal;
    const response = await this.client.stream(
      { method: "GET", path: "/v1/cluster/events", accept: "application/x-ndjson" },
      { signal, headers: { [CLUSTER_HEADERS.epoch]: String(this.view.epoch) }, requestTimeoutMs: 10_000 },
    );
    let silence = setTimeout(() => response.destroy(new Error("the node's stream went silent")), SILENCE_MS);
    try {
      for await (const record of parseNdjson(response)) {
        clearTimeout(silence);
        silence = setTimeout(() => response.destroy(new Error("the node's stream went silent")), SILENCE_MS);
        this.apply(record.data as NodeEvent);
      }
      this.error = "the node ended its stream";
    } finally {
      clearTimeout(silence);
    }
  }

  private apply(event: NodeEvent): void {
    const node = this.view.name;
    switch (event.type) {
      case "state":
        this.directory.applyState(node, event.epoch, event.sandboxes, event.snapshots);
        this.error = null;
        this.setUp(true);
        return;
      case "sandbox":
        this.directory.upsert(node, this.view.epoch, event.sandbox);
        return;
      case "sandbox-gone":
        this.directory.remove(node, event.id);
        return;
      case "snapshot":
        this.directory.upsertSnapshot(node, this.view.epoch, event.snapshot);
        return;
      case "snapshot-gone":
        this.directory.removeSnapshot(node, event.tag);
        return;
      case "heartbeat":
        return;
    }
  }

  private setUp(up: boolean): void {
    if (this.up === up) return;
    this.up = up;
    this.since = Date.now();
    if (up) {
      this.logger.info({ node: this.view.name, epoch: this.view.epoch }, "node event stream up");
      this.onUp();
    }
  }
}

export class NodeLinks {
  private readonly links = new Map<string, NodeLink>();
  private readonly upWaiters = new Set<() => void>();

  constructor(
    private readonly view: ClusterView,
    private readonly nodeToken: string,
    private readonly directory: Directory,
    private readonly logger: Logger,
  ) {
    view.onChange(() => this.sync());
  }

  /** Makes, remakes and drops links to match the cluster view. */
  sync(): void {
    const seen = new Set<string>();
    for (const node of this.view.allNodes()) {
      seen.add(node.name);
      const link = this.links.get(node.name);
      if (link && link.view.url === node.url && link.view.epoch === node.epoch) {
        // Same node, same epoch: keep the stream, take the newer view (status, Lease).
        Object.assign(link.view, node);
        continue;
      }
      link?.close();
      // A node whose Lease has expired gets no stream (its sandboxes are lost; it is fenced on return).
      if (!node.leaseHeld) {
        this.links.delete(node.name);
        continue;
      }
      this.links.set(
        node.name,
        new NodeLink({ ...node }, this.nodeToken, this.directory, this.logger, () => this.wakeWaiters()),
      );
    }
    for (const [name, link] of this.links) {
      if (!seen.has(name)) {
        link.close();
        this.links.delete(name);
      }
    }
  }

  close(): void {
    for (const link of this.links.values()) link.close();
    this.links.clear();
  }

  /** The SDK client of `node` and the headers a call to it carries now, or undefined without a link. */
  client(node: string): { client: Controller; epoch: number } | undefined {
    const link = this.links.get(node);
    return link ? { client: link.client, epoch: link.epoch } : undefined;
  }

  isUp(node: string): boolean {
    return this.links.get(node)?.up === true;
  }

  states(): LinkState[] {
    return [...this.links.values()].map((l) => ({
      node: l.view.name,
      up: l.up,
      epoch: l.view.epoch,
      since: l.since,
      error: l.error,
    }));
  }

  /** Resolves once every schedulable node's link is up (or after `timeoutMs`): a fresh gateway's directory. */
  async settled(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const pending = this.view.schedulable().filter((n) => !this.isUp(n.name));
      if (pending.length === 0) return;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 200);
        this.upWaiters.add(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  private wakeWaiters(): void {
    for (const wake of this.upWaiters) wake();
    this.upWaiters.clear();
  }
}
