/**
 * The page's copy of the daemon's state, kept current by the feed (server-sent events, GET /console/api/events):
 * a full state first, then patches. Entities that did not change keep their object identity, so the tree only
 * re-renders the rows that changed.
 */
import { useEffect, useState } from "preact/hooks";
import {
  CONSOLE_API,
  type EntityChanges,
  FEED_EVENTS,
  type FeedPatch,
  type FeedState,
  type HistoryPoint,
  type HostPanel,
  type SandboxWire,
  type SnapshotWire,
  type UsageWire,
} from "../../src/console/protocol.js";

export interface ConsoleState {
  snapshots: ReadonlyMap<string, SnapshotWire>;
  sandboxes: ReadonlyMap<string, SandboxWire>;
  usage: ReadonlyMap<string, UsageWire>;
  panel: HostPanel | null;
  history: readonly HistoryPoint[];
  /** The feed is open and has delivered a state. */
  live: boolean;
  /** Why the feed is not live, if it failed. */
  feedError: string | null;
}

const MAX_HISTORY = 2000;

let state: ConsoleState = {
  snapshots: new Map(),
  sandboxes: new Map(),
  usage: new Map(),
  panel: null,
  history: [],
  live: false,
  feedError: null,
};
const listeners = new Set<() => void>();

function set(next: Partial<ConsoleState>): void {
  state = { ...state, ...next };
  for (const listener of listeners) listener();
}

export function useConsoleState(): ConsoleState {
  const [, rerender] = useState(0);
  useEffect(() => {
    const listener = () => rerender((n) => n + 1);
    listeners.add(listener);
    return () => {
      listeners.delete(listener);
    };
  }, []);
  return state;
}

function keyed<T>(values: readonly T[], key: (v: T) => string): Map<string, T> {
  return new Map(values.map((v) => [key(v), v]));
}

function applied<T>(
  current: ReadonlyMap<string, T>,
  changes: EntityChanges<T> | undefined,
  key: (v: T) => string,
) {
  if (!changes) return current;
  const next = new Map(current);
  for (const k of changes.remove) next.delete(k);
  for (const v of changes.upsert) next.set(key(v), v);
  return next;
}

const byId = (v: { id: string }) => v.id;
const byTag = (v: { tag: string }) => v.tag;

function onState(full: FeedState): void {
  set({
    snapshots: keyed(full.snapshots, byTag),
    sandboxes: keyed(full.sandboxes, byId),
    usage: keyed(full.usage, byId),
    panel: full.panel,
    history: full.history,
    live: true,
    feedError: null,
  });
}

function onPatch(patch: FeedPatch): void {
  set({
    snapshots: applied(state.snapshots, patch.snapshots, byTag),
    sandboxes: applied(state.sandboxes, patch.sandboxes, byId),
    usage: applied(state.usage, patch.usage, byId),
    panel: patch.panel ?? state.panel,
    history: patch.history ? [...state.history, ...patch.history].slice(-MAX_HISTORY) : state.history,
  });
}

let source: EventSource | null = null;

/** Opens the feed (again); `onEnded` runs when the daemon refuses it (the session may have ended). */
export function connectFeed(onEnded: () => void): void {
  source?.close();
  const events = new EventSource(`${CONSOLE_API}/events`);
  source = events;
  events.addEventListener(FEED_EVENTS.state, (e) => onState(JSON.parse((e as MessageEvent<string>).data)));
  events.addEventListener(FEED_EVENTS.patch, (e) => onPatch(JSON.parse((e as MessageEvent<string>).data)));
  events.onerror = () => {
    // EventSource retries by itself after a dropped connection; CLOSED means the daemon answered with an error.
    if (events.readyState === EventSource.CLOSED) {
      set({ live: false, feedError: "the daemon closed the live feed" });
      onEnded();
    } else set({ live: false, feedError: "reconnecting to the daemon…" });
  };
}

export function disconnectFeed(): void {
  source?.close();
  source = null;
  set({ live: false });
}
