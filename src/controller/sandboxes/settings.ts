/**
 * What a caller attaches to a sandbox when spawning it: string metadata (to find it again), environment variables
 * every process and cell in it gets, and the per-sandbox secrets its data plane is opened with. Validated here,
 * once, for every API.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import {
  ENV_NAME_PATTERN,
  MAX_ENV_BYTES,
  MAX_ENV_NAME_CHARS,
  MAX_ENV_VARS,
  MAX_METADATA_ENTRIES,
  MAX_METADATA_KEY_CHARS,
  MAX_METADATA_VALUE_CHARS,
} from "../../common/limits.js";
import { unanchored } from "../../common/names.js";
import type { InboundSettings, NetworkStatus, SpawnRequest } from "../sandbox-service.js";

const ENV_NAME = new RegExp(ENV_NAME_PATTERN);

export type StringMap = Record<string, string>;

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Metadata: at most MAX_METADATA_ENTRIES string entries, keys 1..MAX_METADATA_KEY_CHARS characters, values up to MAX_METADATA_VALUE_CHARS. */
export function validateMetadata(value: unknown, what = "metadata"): StringMap {
  if (value === undefined || value === null) return {};
  if (!isPlainObject(value)) throw invalidArgument(`${what} must be an object of strings`);
  const entries = Object.entries(value);
  if (entries.length > MAX_METADATA_ENTRIES) {
    throw invalidArgument(
      `${what} has ${entries.length} entries; at most ${MAX_METADATA_ENTRIES} are allowed`,
    );
  }
  const out: StringMap = {};
  for (const [key, v] of entries) {
    if (key.length === 0 || key.length > MAX_METADATA_KEY_CHARS) {
      throw invalidArgument(`${what} key ${JSON.stringify(key.slice(0, 40))} must be 1..128 characters`);
    }
    if (typeof v !== "string") throw invalidArgument(`${what}.${key} must be a string`);
    if (v.length > MAX_METADATA_VALUE_CHARS) {
      throw invalidArgument(`${what}.${key} is longer than ${MAX_METADATA_VALUE_CHARS} characters`);
    }
    out[key] = v;
  }
  return out;
}

/** Environment variables: POSIX-style names, values without NUL, bounded in number and total size. */
export function validateEnvVars(value: unknown, what = "env"): StringMap {
  if (value === undefined || value === null) return {};
  if (!isPlainObject(value)) throw invalidArgument(`${what} must be an object of strings`);
  const entries = Object.entries(value);
  if (entries.length > MAX_ENV_VARS) {
    throw invalidArgument(`${what} has ${entries.length} variables; at most ${MAX_ENV_VARS} are allowed`);
  }
  const out: StringMap = {};
  for (const [name, v] of entries) {
    if (!ENV_NAME.test(name) || name.length > MAX_ENV_NAME_CHARS) {
      throw invalidArgument(
        `${what} name ${JSON.stringify(name.slice(0, 40))} must match ${unanchored(ENV_NAME_PATTERN)} (at most ${MAX_ENV_NAME_CHARS})`,
      );
    }
    if (typeof v !== "string" || v.includes("\0")) {
      throw invalidArgument(`${what}.${name} must be a string without NUL bytes`);
    }
    out[name] = v;
  }
  const bytes = Buffer.byteLength(JSON.stringify(out));
  if (bytes > MAX_ENV_BYTES) {
    throw invalidArgument(`${what} takes ${bytes} bytes as JSON; at most ${MAX_ENV_BYTES} are allowed`);
  }
  return out;
}

/** The sandbox's variables under the call's own (the call wins), or undefined when there are none. */
export function layerEnv(sandbox: StringMap, call: StringMap | undefined): StringMap | undefined {
  if (Object.keys(sandbox).length === 0) return call;
  return { ...sandbox, ...call };
}

/** A fresh per-sandbox secret: 192 bits, URL-safe. */
export function newAccessToken(): string {
  return randomBytes(24).toString("base64url");
}

/** Constant-time comparison of a presented token with the stored one (digests, so lengths never leak). */
export function tokenMatches(presented: string | undefined, stored: string | null): boolean {
  if (presented === undefined || presented === "" || stored === null) return false;
  const a = createHash("sha256").update(presented).digest();
  const b = createHash("sha256").update(stored).digest();
  return timingSafeEqual(a, b);
}

export function parseStringMap(json: string): StringMap {
  const value = JSON.parse(json) as unknown;
  return isPlainObject(value) ? (value as StringMap) : {};
}

/** Placeholder of a sandbox's Host header that stands for the port a request is for (E2B's maskRequestHost). */
// biome-ignore lint/suspicious/noTemplateCurlyInString: E2B's literal placeholder, not a template.
export const PORT_PLACEHOLDER = "${PORT}";
export const MAX_HTTPS_PORTS = 64;
const HOST_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
const HOST_HEADER = new RegExp(`^${HOST_LABEL}(?:\\.${HOST_LABEL})*(?::\\d{1,5})?$`);

export const PUBLIC_INBOUND: InboundSettings = Object.freeze({
  requireTrafficToken: false,
  hostHeader: null,
  httpsPorts: [],
}) as InboundSettings;

/**
 * Inbound settings from any caller, completed with the defaults (public, the request's own Host, plain HTTP).
 * The Host header becomes a header value sent to the guest: a host name or IPv4 address with an optional port,
 * `${PORT}` anywhere in it, nothing else.
 */
export function validateInbound(value: Partial<InboundSettings> | undefined): InboundSettings {
  const hostHeader = value?.hostHeader ?? null;
  if (hostHeader !== null) {
    const sample = hostHeader.split(PORT_PLACEHOLDER).join("1");
    if (typeof hostHeader !== "string" || hostHeader.length > 300 || !HOST_HEADER.test(sample)) {
      throw invalidArgument(
        `host header ${JSON.stringify(String(hostHeader).slice(0, 80))} is not a host[:port] (ASCII letters, ` +
          `digits, dots and hyphens; ${PORT_PLACEHOLDER} stands for the port)`,
      );
    }
  }
  const ports = value?.httpsPorts ?? [];
  if (!Array.isArray(ports) || ports.length > MAX_HTTPS_PORTS) {
    throw invalidArgument(`https ports must be a list of at most ${MAX_HTTPS_PORTS} ports`);
  }
  for (const port of ports) {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw invalidArgument(`https port ${JSON.stringify(port)} is not a port (an integer in 1..65535)`);
    }
  }
  return {
    requireTrafficToken: value?.requireTrafficToken === true,
    hostHeader,
    httpsPorts: [...new Set(ports)].sort((a, b) => a - b),
  };
}

/** A stored row's inbound settings (rows older than them are E2B's defaults). */
export function parseInbound(json: string): InboundSettings {
  const value = JSON.parse(json) as Partial<InboundSettings> | null;
  return validateInbound(isPlainObject(value) ? value : {});
}

/** The Host header a request for `port` is sent with, or null to keep the request's own. */
export function hostHeaderFor(inbound: InboundSettings, port: number): string | null {
  return inbound.hostHeader === null ? null : inbound.hostHeader.split(PORT_PLACEHOLDER).join(String(port));
}

/**
 * forkd v0.5's per_child_netns (SpawnRequest.ownNamespace), whichever face a spawn comes through: every sandbox
 * with a network has a namespace of its own, so true is refused only where that cannot hold (a daemon running
 * isolated sandboxes: 501) or where the request itself says otherwise (network "none": 400).
 */
export function validateOwnNamespace(
  request: Pick<SpawnRequest, "ownNamespace" | "network">,
  network: Pick<NetworkStatus, "mode" | "reason">,
): void {
  if (request.ownNamespace !== true) return;
  if (request.network === "none") {
    throw invalidArgument(
      'per_child_netns=true contradicts network "none" (a NIC with no namespace of its own)',
    );
  }
  if (network.mode !== "netns") {
    throw new ForkdError(
      "not_implemented",
      `per_child_netns=true: this daemon runs isolated sandboxes (${network.reason})`,
    );
  }
}
