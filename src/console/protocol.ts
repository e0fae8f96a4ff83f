/**
 * The console's wire protocol, declared once for both ends: the daemon side (src/console) and the browser
 * (console/src, which imports this file's types and constants; nothing here may use Node). Entities are the REST
 * API's own wire shapes (src/api/schemas.ts), so the console shows what docs/api.md documents.
 */
import type { Static } from "@sinclair/typebox";
import type {
  HostStatusWire,
  NetworkStatusWire,
  SandboxInfoWire,
  SandboxUsageWire,
  SnapshotInfoWire,
} from "../api/schemas.js";

/** Where the console's page is served. */
export const CONSOLE_PATH = "/console";
/** The console's own routes: session, login, logout, events, terminal. */
export const CONSOLE_API = "/console/api";
/** State-changing requests a browser sends with the session cookie (or through the socket) carry this header. */
export const CSRF_HEADER = "x-forkd-csrf";
/** The terminal WebSocket's subprotocol; the CSRF token travels as a second one, CSRF_PROTOCOL_PREFIX + token. */
export const TERMINAL_PROTOCOL = "forkd-terminal.v1";
export const CSRF_PROTOCOL_PREFIX = "forkd-csrf.";
/**
 * The REST calls the console makes. A session cookie is accepted on these (and the console's own routes) only;
 * everywhere else the API wants its bearer token, so a cookie cannot fetch guest files, proxy to guest ports,
 * pack snapshots or reach the E2B surfaces. Route patterns as Fastify declares them.
 */
export const CONSOLE_API_CALLS: readonly (readonly [method: string, route: string])[] = [
  ["GET", "/version"],
  ["GET", "/v1/host"],
  ["GET", "/v1/usage"],
  ["GET", "/v1/network"],
  ["GET", "/v1/snapshots"],
  ["GET", "/v1/snapshots/:tag/info"],
  ["GET", "/v1/sandboxes"],
  ["POST", "/v1/sandboxes"],
  ["GET", "/v1/sandboxes/:id"],
  ["DELETE", "/v1/sandboxes/:id"],
  ["GET", "/v1/sandboxes/:id/usage"],
  ["GET", "/v1/sandboxes/:id/files/list"],
  ["GET", "/v1/sandboxes/:id/files"],
  ["POST", "/v1/sandboxes/:id/timeout"],
  ["POST", "/v1/sandboxes/:id/eval"],
  ["POST", "/v1/sandboxes/:id/branch"],
  ["POST", "/v1/sandboxes/:id/fork"],
  // Served once the daemon has pause/resume (ConsoleSession.features.pause).
  ["POST", "/v1/sandboxes/:id/pause"],
  ["POST", "/v1/sandboxes/:id/resume"],
];

export type SandboxWire = Static<typeof SandboxInfoWire>;
export type SnapshotWire = Static<typeof SnapshotInfoWire>;
export type UsageWire = Static<typeof SandboxUsageWire>;
export type HostWire = Static<typeof HostStatusWire>;
export type NetworkWire = Static<typeof NetworkStatusWire>;

/** GET /console/api/session. */
export interface ConsoleSession {
  /**
   * How this listener authenticates the console: a login with a daemon token (TCP), the socket's permissions, or
   * nothing (a listener without credentials: tests only).
   */
  auth: "login" | "socket" | "none";
  authenticated: boolean;
  /** Send as CSRF_HEADER on every state-changing request (null until logged in). */
  csrf: string | null;
  /** When the session ends at the latest (unix ms); null on the socket. */
  expires_at_unix_ms: number | null;
  version: string;
  /** Actions this daemon offers that not every daemon has. */
  features: { pause: boolean };
}

/** POST /console/api/login. */
export interface LoginRequest {
  token: string;
}

/** One point of the host history (sampled by the daemon, newest last). */
export interface HistoryPoint {
  t: number;
  sandboxes: number;
  mem_used_bytes: number;
  mem_total_bytes: number;
  cpu_used_pct: number;
}

/** A Prometheus histogram as counts per bucket (not cumulative); the last bucket is +Inf. */
export interface Histogram {
  /** Upper bounds in seconds; the last is Infinity, sent as null. */
  le: (number | null)[];
  counts: number[];
  count: number;
  sum: number;
}

export interface HostPanel {
  host: HostWire | null;
  network: NetworkWire | null;
  /** Restore to ready, per sandbox (forkd_sandbox_ready_seconds). */
  ready: Histogram;
  /** POST /v1/sandboxes, request to response (forkd_spawn_duration_seconds). */
  spawn: Histogram;
}

/** The whole picture: sent first, and again whenever a client fell too far behind for patches. */
export interface FeedState {
  snapshots: SnapshotWire[];
  sandboxes: SandboxWire[];
  usage: UsageWire[];
  panel: HostPanel;
  history: HistoryPoint[];
}

export interface EntityChanges<T> {
  upsert: T[];
  /** Keys (snapshot tags, sandbox ids) gone since the last event. */
  remove: string[];
}

/** What changed since the previous event; several ticks' changes coalesced while a client was not reading. */
export interface FeedPatch {
  snapshots?: EntityChanges<SnapshotWire>;
  sandboxes?: EntityChanges<SandboxWire>;
  usage?: EntityChanges<UsageWire>;
  panel?: HostPanel;
  history?: HistoryPoint[];
}

/** Server-sent event names on GET /console/api/events. */
export const FEED_EVENTS = { state: "state", patch: "patch" } as const;

/** Text frames the browser sends on the terminal WebSocket (binary frames are keyboard input). */
export type TerminalClientMessage = { type: "resize"; cols: number; rows: number };

/** Text frames the daemon sends (binary frames are terminal output). */
export type TerminalServerMessage =
  | { type: "started"; pid: number }
  | { type: "exit"; exit_code: number | null; signal: string | null }
  | { type: "error"; error: string; code: string };
