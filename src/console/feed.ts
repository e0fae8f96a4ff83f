/**
 * The console's live view of the daemon, pushed to browsers as server-sent events. One poller per daemon reads
 * the services (sandboxes every tick, snapshots, usage and the host panel less often) while anyone watches, and
 * computes what changed; every client gets a full state first and then patches. A client that does not read
 * keeps no growing queue: its pending changes are merged into one patch (newer values replace older ones), and
 * once that patch would grow past a bound, or the socket holds too many unsent bytes, the client is marked to
 * get one full state when it catches up instead. So 500 sandboxes changing every second cost each client at most
 * one event per tick, and a stalled client costs the daemon a bounded amount of memory.
 */
import type { ServerResponse } from "node:http";
import type { DaemonServices } from "../api/context.js";
import type { DaemonMetrics } from "../api/metrics.js";
import { sandboxToWire, snapshotToWire } from "../api/wire.js";
import { errorMessage } from "../common/errors.js";
import type { HistoryRecorder } from "./history.js";
import { histogramOf } from "./history.js";
import {
  type EntityChanges,
  FEED_EVENTS,
  type FeedPatch,
  type FeedState,
  type HostPanel,
  type SandboxWire,
  type SnapshotWire,
  type UsageWire,
} from "./protocol.js";

export interface FeedOptions {
  /** How often sandboxes are read (and changes sent). */
  tickMs?: number;
  /** How often snapshots are read (a directory scan and a manifest per snapshot). */
  snapshotsEveryMs?: number;
  /** How often every running VM's memory and CPU are read (one smaps_rollup per VM). */
  usageEveryMs?: number;
  /** Clients at once; more are refused (503). */
  maxClients?: number;
  /** Unsent bytes a client's socket may hold before its patches are held back. */
  maxBufferedBytes?: number;
  /** Entities a held-back patch may collect before the client is sent a full state instead. */
  maxPendingEntities?: number;
}

export const DEFAULT_FEED_OPTIONS: Required<FeedOptions> = {
  tickMs: 1000,
  snapshotsEveryMs: 2000,
  usageEveryMs: 5000,
  maxClients: 64,
  maxBufferedBytes: 256 * 1024,
  maxPendingEntities: 2000,
};

/** Comments on an idle stream, so proxies and browsers keep it open. */
const HEARTBEAT_MS = 20_000;

interface Log {
  warn(obj: object, msg?: string): void;
}

/** The latest value of each entity, with its JSON for cheap change detection. */
class EntityTable<T> {
  private readonly byKey = new Map<string, { value: T; json: string }>();

  constructor(private readonly keyOf: (value: T) => string) {}

  values(): T[] {
    return [...this.byKey.values()].map((e) => e.value);
  }

  /** Replaces the table's contents; returns what changed (null when nothing did). */
  replace(next: readonly T[]): EntityChanges<T> | null {
    const seen = new Set<string>();
    const upsert: T[] = [];
    for (const value of next) {
      const key = this.keyOf(value);
      seen.add(key);
      const json = JSON.stringify(value);
      if (this.byKey.get(key)?.json !== json) {
        this.byKey.set(key, { value, json });
        upsert.push(value);
      }
    }
    const remove = [...this.byKey.keys()].filter((key) => !seen.has(key));
    for (const key of remove) this.byKey.delete(key);
    return upsert.length === 0 && remove.length === 0 ? null : { upsert, remove };
  }
}

/** Changes merged while a client was not reading: newest value per key, removals cancelling upserts. */
class PendingChanges<T> {
  readonly upsert = new Map<string, T>();
  readonly remove = new Set<string>();

  constructor(private readonly keyOf: (value: T) => string) {}

  get size(): number {
    return this.upsert.size + this.remove.size;
  }

  merge(changes: EntityChanges<T>): void {
    for (const value of changes.upsert) {
      const key = this.keyOf(value);
      this.remove.delete(key);
      this.upsert.set(key, value);
    }
    for (const key of changes.remove) {
      this.upsert.delete(key);
      this.remove.add(key);
    }
  }

  take(): EntityChanges<T> | undefined {
    if (this.size === 0) return undefined;
    const out = { upsert: [...this.upsert.values()], remove: [...this.remove] };
    this.upsert.clear();
    this.remove.clear();
    return out;
  }
}

const bySandboxId = (s: SandboxWire | UsageWire) => s.id;
const bySnapshotTag = (s: SnapshotWire) => s.tag;

class Client {
  readonly sandboxes = new PendingChanges<SandboxWire>(bySandboxId);
  readonly snapshots = new PendingChanges<SnapshotWire>(bySnapshotTag);
  readonly usage = new PendingChanges<UsageWire>(bySandboxId);
  panel: HostPanel | undefined;
  history: FeedState["history"] = [];
  /** Fell too far behind: the next event is a full state. */
  needsFull = true;

  constructor(readonly res: ServerResponse) {}

  get pendingSize(): number {
    return this.sandboxes.size + this.snapshots.size + this.usage.size + this.history.length;
  }

  takePatch(): FeedPatch | undefined {
    const patch: FeedPatch = {};
    const sandboxes = this.sandboxes.take();
    const snapshots = this.snapshots.take();
    const usage = this.usage.take();
    if (sandboxes) patch.sandboxes = sandboxes;
    if (snapshots) patch.snapshots = snapshots;
    if (usage) patch.usage = usage;
    if (this.panel) patch.panel = this.panel;
    if (this.history.length > 0) patch.history = this.history;
    this.panel = undefined;
    this.history = [];
    return Object.keys(patch).length === 0 ? undefined : patch;
  }

  clearPending(): void {
    this.sandboxes.take();
    this.snapshots.take();
    this.usage.take();
    this.panel = undefined;
    this.history = [];
  }
}

export class ConsoleFeed {
  private readonly options: Required<FeedOptions>;
  private readonly clients = new Set<Client>();
  private readonly sandboxes = new EntityTable<SandboxWire>(bySandboxId);
  private readonly snapshots = new EntityTable<SnapshotWire>(bySnapshotTag);
  private readonly usage = new EntityTable<UsageWire>(bySandboxId);
  private panel: HostPanel | undefined;
  private lastSnapshotsAt = 0;
  private lastUsageAt = 0;
  private loop: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly unsubscribeHistory: () => void;

  constructor(
    private readonly services: DaemonServices,
    private readonly metrics: DaemonMetrics,
    private readonly history: HistoryRecorder,
    private readonly snapshotsDir: string,
    options: FeedOptions = {},
    private readonly log: Log = { warn: () => {} },
  ) {
    this.options = { ...DEFAULT_FEED_OPTIONS, ...options };
    this.unsubscribeHistory = history.onPoint((point) => {
      for (const client of this.clients) client.history.push(point);
    });
  }

  get clientCount(): number {
    return this.clients.size;
  }

  /** Whether another client may subscribe now. */
  get full(): boolean {
    return this.clients.size >= this.options.maxClients;
  }

  /**
   * Streams the feed on `res` (headers already decided by the caller) until the client goes or the feed closes.
   * Resolves when the stream has ended.
   */
  subscribe(res: ServerResponse): Promise<void> {
    const client = new Client(res);
    this.clients.add(client);
    const ended = new Promise<void>((resolve) => {
      const done = () => {
        this.clients.delete(client);
        resolve();
      };
      res.once("close", done);
      res.once("error", done);
    });
    res.on("drain", () => this.flush(client));
    this.ensureRunning();
    if (this.panel !== undefined) this.flush(client);
    else this.wake?.();
    this.heartbeat ??= setInterval(() => {
      for (const c of this.clients) if (c.res.writableLength === 0) c.res.write(": keep-alive\n\n");
    }, HEARTBEAT_MS).unref();
    return ended;
  }

  /** Ends every stream and stops polling. */
  async close(): Promise<void> {
    this.closed = true;
    this.unsubscribeHistory();
    if (this.heartbeat) clearInterval(this.heartbeat);
    for (const client of this.clients) client.res.end();
    this.clients.clear();
    this.wake?.();
    await this.loop;
  }

  /** The whole current picture (what a new client is sent first). */
  state(): FeedState {
    return {
      snapshots: this.snapshots.values(),
      sandboxes: this.sandboxes.values(),
      usage: this.usage.values(),
      panel: this.panel ?? emptyPanel(),
      history: this.history.points(),
    };
  }

  private ensureRunning(): void {
    if (this.loop || this.closed) return;
    this.loop = this.run().finally(() => {
      this.loop = undefined;
    });
  }

  /** Polls while anyone watches; each round's changes go to every client. */
  private async run(): Promise<void> {
    while (!this.closed && this.clients.size > 0) {
      const started = Date.now();
      try {
        await this.refresh(started);
      } catch (err) {
        this.log.warn({ err: errorMessage(err) }, "console feed: reading the daemon's state failed");
      }
      for (const client of this.clients) this.flush(client);
      const wait = Math.max(0, this.options.tickMs - (Date.now() - started));
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, wait);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = undefined;
    }
  }

  private async refresh(now: number): Promise<void> {
    const { sandboxes, snapshots } = this.services;
    this.broadcast(
      (c, changes) => c.sandboxes.merge(changes),
      this.sandboxes.replace(sandboxes.list().map(sandboxToWire)),
    );
    if (this.panel === undefined || now - this.lastSnapshotsAt >= this.options.snapshotsEveryMs) {
      this.lastSnapshotsAt = now;
      const list = await snapshots.list();
      const wire = list.map((s) => snapshotToWire(s, this.snapshotsDir));
      this.broadcast((c, changes) => c.snapshots.merge(changes), this.snapshots.replace(wire));
    }
    if (this.panel === undefined || now - this.lastUsageAt >= this.options.usageEveryMs) {
      this.lastUsageAt = now;
      const usage = await sandboxes.usage();
      this.broadcast((c, changes) => c.usage.merge(changes), this.usage.replace(usage));
      const panel = await this.readPanel();
      this.panel = panel;
      for (const client of this.clients) client.panel = panel;
    }
  }

  private async readPanel(): Promise<HostPanel> {
    return {
      host: this.history.latestHost(),
      network: this.services.sandboxes.networkStatus(),
      ready: await histogramOf(this.metrics.sandboxReady),
      spawn: await histogramOf(this.metrics.spawnDuration),
    };
  }

  private broadcast<T>(
    apply: (client: Client, changes: EntityChanges<T>) => void,
    changes: EntityChanges<T> | null,
  ) {
    if (changes === null) return;
    for (const client of this.clients) if (!client.needsFull) apply(client, changes);
  }

  private flush(client: Client): void {
    if (this.panel === undefined || client.res.writableEnded) return;
    if (client.pendingSize > this.options.maxPendingEntities) {
      client.clearPending();
      client.needsFull = true;
    }
    if (client.res.writableLength > this.options.maxBufferedBytes) return;
    if (client.needsFull) {
      client.needsFull = false;
      client.clearPending();
      write(client.res, FEED_EVENTS.state, this.state());
      return;
    }
    const patch = client.takePatch();
    if (patch) write(client.res, FEED_EVENTS.patch, patch);
  }
}

function write(res: ServerResponse, event: string, data: unknown): void {
  // JSON.stringify never emits a raw newline, so the payload is one SSE data line.
  res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

function emptyPanel(): HostPanel {
  const none = { le: [], counts: [], count: 0, sum: 0 };
  return { host: null, network: null, ready: none, spawn: none };
}
