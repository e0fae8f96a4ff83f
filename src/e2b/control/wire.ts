/** forkd's sandbox records in E2B's shapes, and the cursor of E2B's paginated lists. */
import type { Static } from "@sinclair/typebox";
import { invalidArgument } from "../../common/errors.js";
import type { AccessTokens, SandboxInfo, SandboxMetrics } from "../../controller/sandbox-service.js";
import { ENVD_VERSION } from "../envd/version.js";
import { networkToE2b } from "./network.js";
import type { ListedSandbox, Sandbox, SandboxDetail, SandboxMetric } from "./schemas.js";
import type { MachineFacts } from "./template-facts.js";

/** E2B's deprecated clientID field is required; forkd has one client. */
export const CLIENT_ID = "forkd";
/** endAt of a sandbox without a lifetime limit (created through the forkd API with timeout 0). */
const NO_END = "2999-12-31T23:59:59.000Z";

export function sandboxToWire(
  info: SandboxInfo,
  tokens: AccessTokens,
  domain: string | null,
): Static<typeof Sandbox> {
  return {
    sandboxID: info.id,
    templateID: info.snapshot_tag,
    ...(info.template_alias !== null ? { alias: info.template_alias } : {}),
    clientID: CLIENT_ID,
    envdVersion: ENVD_VERSION,
    envdAccessToken: tokens.envd,
    trafficAccessToken: tokens.traffic,
    domain,
  };
}

export function listedToWire(info: SandboxInfo, facts: MachineFacts): Static<typeof ListedSandbox> {
  return {
    sandboxID: info.id,
    templateID: info.snapshot_tag,
    ...(info.template_alias !== null ? { alias: info.template_alias } : {}),
    clientID: CLIENT_ID,
    startedAt: new Date(info.created_at_unix * 1000).toISOString(),
    endAt: info.expires_at_unix_ms === null ? NO_END : new Date(info.expires_at_unix_ms).toISOString(),
    cpuCount: facts.cpuCount,
    memoryMB: facts.memoryMB,
    diskSizeMB: facts.diskSizeMB,
    envdVersion: ENVD_VERSION,
    metadata: info.metadata,
    state: "running",
    volumeMounts: [],
  };
}

export function detailToWire(
  info: SandboxInfo,
  facts: MachineFacts,
  tokens: AccessTokens,
  domain: string | null,
): Static<typeof SandboxDetail> {
  return {
    ...listedToWire(info, facts),
    envdAccessToken: tokens.envd,
    domain,
    ...networkToE2b(info),
    lifecycle: { onTimeout: "kill", autoResume: false },
  };
}

export function metricToWire(m: SandboxMetrics): Static<typeof SandboxMetric> {
  return {
    timestamp: new Date(m.timestamp_unix_ms).toISOString(),
    timestampUnix: Math.floor(m.timestamp_unix_ms / 1000),
    cpuCount: m.cpu_count,
    cpuUsedPct: m.cpu_used_pct,
    memUsed: m.mem_used_bytes,
    memTotal: m.mem_total_bytes,
    memCache: m.mem_cache_bytes,
    diskUsed: m.disk_used_bytes,
    diskTotal: m.disk_total_bytes,
  };
}

/**
 * Cursor pagination: the token names the last item of the page (its sort key), so a list that changes between
 * pages neither repeats nor skips what was there throughout.
 */
export interface Page<T> {
  items: T[];
  nextToken: string | undefined;
}

export function paginate<T>(
  sorted: T[],
  keyOf: (item: T) => string,
  limit: number,
  nextToken: string | undefined,
): Page<T> {
  let start = 0;
  if (nextToken !== undefined) {
    const after = decodeCursor(nextToken);
    start = sorted.findIndex((item) => keyOf(item) === after) + 1;
    if (start === 0) start = sorted.findIndex((item) => keyOf(item) > after);
    if (start === -1) start = sorted.length;
  }
  const items = sorted.slice(start, start + limit);
  const last = items.at(-1);
  const more = start + limit < sorted.length;
  return { items, nextToken: more && last !== undefined ? encodeCursor(keyOf(last)) : undefined };
}

function encodeCursor(key: string): string {
  return Buffer.from(JSON.stringify({ after: key })).toString("base64url");
}

function decodeCursor(token: string): string {
  try {
    const value = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as { after?: unknown };
    if (typeof value.after === "string") return value.after;
  } catch {
    // fall through
  }
  throw invalidArgument(
    `invalid nextToken ${JSON.stringify(token.slice(0, 40))}: not a token this server gave`,
  );
}

/**
 * E2B's metadata filter: the SDK URL-encodes each key and value, joins them as a query string and sends that as
 * one parameter (`metadata=user%3Dabc%26app%3Dprod`).
 */
export function parseMetadataFilter(query: string | undefined): Record<string, string> {
  if (query === undefined || query === "") return {};
  const out: Record<string, string> = {};
  try {
    for (const [key, value] of new URLSearchParams(query)) {
      out[decodeURIComponent(key)] = decodeURIComponent(value);
    }
  } catch {
    throw invalidArgument(
      `invalid metadata filter ${JSON.stringify(query.slice(0, 80))}: bad percent-encoding`,
    );
  }
  return out;
}

export function matchesMetadata(metadata: Record<string, string>, filter: Record<string, string>): boolean {
  return Object.entries(filter).every(([key, value]) => metadata[key] === value);
}
