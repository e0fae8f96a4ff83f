/**
 * The daemon's API tokens, matched in constant time: sha256 digests compared with timingSafeEqual against every
 * configured token without an early exit, so the time taken says nothing about which token (or which prefix)
 * matched. Shared by every surface that takes a daemon token (bearer on the forkd API, X-API-Key on the E2B API).
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { ForkdError } from "./errors.js";
import { MIN_TOKEN_BYTES } from "./limits.js";

export { MIN_TOKEN_BYTES };

/** Tenant names: they appear in audit lines and the state database, never in a path. */
const TENANT_PATTERN = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export interface Token {
  /** sha256 of the token; compared in constant time against the presented token's digest. */
  digest: Buffer;
  /** What the audit log calls this token (with its tenant, if any). */
  id: string;
  /**
   * The tenant whose sandboxes and snapshots the token sees and touches (src/controller/tenancy); null: an
   * admin token, which sees everything (every token of a file written before tenants existed).
   */
  tenant: string | null;
}

/**
 * New API tokens are shaped like E2B's API keys, `e2b_` and 40 lower-case hex digits (160 random bits), so every
 * E2B client takes them: some versions of E2B's Python SDK refuse, before sending anything, a key that does not
 * match `^e2b_[0-9a-f]+$`. The daemon itself takes any token of at least MIN_TOKEN_BYTES.
 */
export const API_KEY_PREFIX = "e2b_";
const API_KEY_RANDOM_BYTES = 20;
export const API_KEY_PATTERN = /^e2b_[0-9a-f]+$/;

export function newApiKey(): string {
  return `${API_KEY_PREFIX}${randomBytes(API_KEY_RANDOM_BYTES).toString("hex")}`;
}

export function isValidTenant(name: unknown): name is string {
  return typeof name === "string" && TENANT_PATTERN.test(name);
}

export function tokenFromString(token: string, what = "token", tenant: string | null = null): Token {
  if (Buffer.byteLength(token) < MIN_TOKEN_BYTES) {
    throw new ForkdError("invalid_argument", `${what} is shorter than ${MIN_TOKEN_BYTES} bytes`);
  }
  if (/\s/.test(token)) throw new ForkdError("invalid_argument", `${what} contains whitespace`);
  if (tenant !== null && !isValidTenant(tenant)) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: invalid tenant ${JSON.stringify(String(tenant).slice(0, 80))}: must match ${TENANT_PATTERN.source}`,
    );
  }
  const digest = createHash("sha256").update(token).digest();
  const id = `token:${digest.toString("hex").slice(0, 8)}`;
  return { digest, id: tenant === null ? id : `${id}:${tenant}`, tenant };
}

/** The configured token `presented` is, or undefined. */
export function matchToken(presented: string, tokens: readonly Token[]): Token | undefined {
  const digest = createHash("sha256").update(presented).digest();
  let found: Token | undefined;
  for (const token of tokens) {
    if (timingSafeEqual(digest, token.digest) && !found) found = token;
  }
  return found;
}

/**
 * Removes the headers of a request that carry one of the daemon's tokens (`Authorization: Bearer`, and
 * `X-API-Key` as E2B clients send it) before the request is passed on to a sandbox: a daemon credential must
 * never reach a guest. Headers with other values are the guest's business and stay.
 */
export function stripDaemonTokens(headers: IncomingHttpHeaders, tokens: readonly Token[]): void {
  const bearer = /^Bearer[ ]+(\S+)[ ]*$/i.exec(headers.authorization ?? "");
  if (bearer && matchToken(bearer[1] as string, tokens)) delete headers.authorization;
  const key = headers["x-api-key"];
  if (typeof key === "string" && matchToken(key, tokens)) delete headers["x-api-key"];
}

/** The web console's session cookie, on plain HTTP and under TLS (src/console/access.ts names it by these). */
export const CONSOLE_COOKIE = "forkd-console";
export const CONSOLE_COOKIE_TLS = "__Host-forkd-console";
/** Headers a sandbox's own credentials travel in: E2B's envd access token and its traffic token. */
const SANDBOX_CREDENTIAL_HEADERS = ["x-access-token", "e2b-traffic-access-token"] as const;

/**
 * Makes a request's headers fit to pass on to a guest's port, in every proxy (the forkd port route, E2B's
 * sandbox hosts): the daemon's tokens (stripDaemonTokens), the console's session cookie (browsers send it to
 * every port of the console's host, and a session id is enough to act as the console) and the sandbox
 * credentials of E2B's headers are removed; every other header and cookie is the guest's business and stays.
 */
export function stripCredentialsForGuest(headers: IncomingHttpHeaders, tokens: readonly Token[]): void {
  stripDaemonTokens(headers, tokens);
  for (const name of SANDBOX_CREDENTIAL_HEADERS) delete headers[name];
  const cookie = headers.cookie;
  if (typeof cookie !== "string") return;
  const kept = cookie
    .split(";")
    .map((part) => part.trim())
    .filter((part) => {
      const name = part.split("=", 1)[0]?.trim();
      return part !== "" && name !== CONSOLE_COOKIE && name !== CONSOLE_COOKIE_TLS;
    });
  if (kept.length === 0) delete headers.cookie;
  else headers.cookie = kept.join("; ");
}
