/**
 * The daemon's API tokens, matched in constant time: sha256 digests compared with timingSafeEqual against every
 * configured token without an early exit, so the time taken says nothing about which token (or which prefix)
 * matched. Shared by every surface that takes a daemon token (bearer on the forkd API, X-API-Key on the E2B API).
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { readFile, stat } from "node:fs/promises";
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

/** More would only be a mistake (a binary or a key file given as the token file). */
const MAX_TOKEN_FILE_BYTES = 64 * 1024;

/**
 * Reads a token file: one token per line, optionally followed by ` tenant=<name>` (a tenant's token; without it
 * an admin token); blank lines and `#` comments skipped. The file must be private (checkTokenFileAccess): a
 * token readable or replaceable by another local user hands that user the daemon.
 */
export async function loadTokenFile(file: string): Promise<Token[]> {
  const info = await stat(file).catch((err: NodeJS.ErrnoException) => {
    throw new ForkdError("invalid_argument", `cannot read token file ${file}: ${err.code ?? err.message}`);
  });
  if (!info.isFile()) throw new ForkdError("invalid_argument", `token file ${file} is not a regular file`);
  if (info.size > MAX_TOKEN_FILE_BYTES) {
    throw new ForkdError(
      "invalid_argument",
      `token file ${file} is larger than ${MAX_TOKEN_FILE_BYTES} bytes`,
    );
  }
  checkTokenFileAccess(file, info);
  const text = await readFile(file, "utf8");
  const tokens: Token[] = [];
  for (const [i, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    tokens.push(tokenLine(line, `token on line ${i + 1} of ${file}`));
  }
  if (tokens.length === 0) throw new ForkdError("invalid_argument", `token file ${file} holds no token`);
  // One token listed for two tenants would make its scope depend on line order.
  const tenantOf = new Map<string, string | null>();
  for (const token of tokens) {
    const digest = token.digest.toString("hex");
    const earlier = tenantOf.get(digest);
    if (earlier !== undefined && earlier !== token.tenant) {
      throw new ForkdError(
        "invalid_argument",
        `token file ${file} lists one token (${token.id.split(":").slice(0, 2).join(":")}) with two different scopes`,
      );
    }
    tenantOf.set(digest, token.tenant);
  }
  return tokens;
}

/**
 * Who may read or replace a token file, as its owner and mode say. It is private when it is the reader's own
 * with no group or other bits. A process that is not root may also read one that root owns and its own group
 * may only read (no write bit but root's, no other bit): what a kubelet-mounted Secret is with the pod's
 * fsGroup (root, mode 0440, the fsGroup's gid), since no other user can write that file and only the pod's own
 * processes hold that group. A root process (the node daemon) takes only its own private files.
 */
export function checkTokenFileAccess(
  file: string,
  info: { uid: number; gid: number; mode: number },
  reader: { uid?: number; groups?: readonly number[] } = {
    uid: process.getuid?.(),
    groups: [...new Set([process.getgid?.(), ...(process.getgroups?.() ?? [])])].filter(
      (g): g is number => g !== undefined,
    ),
  },
): void {
  const uid = reader.uid;
  if (uid === undefined) return;
  const mode = info.mode & 0o777;
  const groupReadable = (mode & 0o070) !== 0;
  const fsGroupSecret =
    uid !== 0 &&
    info.uid === 0 &&
    (mode & 0o037) === 0 &&
    groupReadable &&
    (reader.groups ?? []).includes(info.gid);
  if (fsGroupSecret) return;
  if (info.uid !== uid) {
    throw new ForkdError(
      "invalid_argument",
      `token file ${file} is owned by uid ${info.uid}, not by the daemon's user (uid ${uid}): chown it`,
    );
  }
  if (mode & 0o077) {
    const what = mode & 0o022 ? "writable" : "readable";
    throw new ForkdError(
      "invalid_argument",
      `token file ${file} is ${what} by other users (mode ${mode.toString(8)}): chmod 600 it`,
    );
  }
}

/** `<token>` or `<token> tenant=<name>`; anything else on the line is refused, never ignored. */
function tokenLine(line: string, what: string): Token {
  const [secret, ...rest] = line.split(/[ \t]+/);
  if (rest.length === 0) return tokenFromString(secret as string, what);
  const tenant = rest.length === 1 ? /^tenant=(.*)$/.exec(rest[0] as string)?.[1] : undefined;
  if (tenant === undefined) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: expected "<token>" or "<token> tenant=<name>" (after the token: ${JSON.stringify(rest.join(" ").slice(0, 80))})`,
    );
  }
  return tokenFromString(secret as string, what, tenant);
}
