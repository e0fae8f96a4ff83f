/**
 * Console login sessions on a token-guarded listener. A session is made by presenting a daemon token once; the
 * browser then holds only a random session id in an HttpOnly cookie. Sessions are bounded in number (the oldest
 * goes when a new one would exceed the bound), in idle time and in total lifetime, and end at logout. Only a
 * digest of each session id is kept, so the table itself holds nothing a cookie could be made from.
 */
import { createHash, randomBytes } from "node:crypto";

export const DEFAULT_MAX_SESSIONS = 64;
/** A session unused this long ends. */
export const DEFAULT_IDLE_MS = 60 * 60_000;
/** A session ends this long after login, used or not. */
export const DEFAULT_LIFETIME_MS = 12 * 60 * 60_000;

export interface Session {
  /** The token that opened it (its audit name, `token:<8 hex>`). */
  tokenId: string;
  /** Sent by the page as the CSRF header on state-changing requests. */
  csrf: string;
  createdAtMs: number;
  lastSeenMs: number;
  expiresAtMs: number;
}

export interface SessionLimits {
  maxSessions?: number;
  idleMs?: number;
  lifetimeMs?: number;
  now?: () => number;
}

export class SessionStore {
  private readonly byDigest = new Map<string, Session>();
  private readonly maxSessions: number;
  private readonly idleMs: number;
  private readonly lifetimeMs: number;
  private readonly now: () => number;

  constructor(limits: SessionLimits = {}) {
    this.maxSessions = limits.maxSessions ?? DEFAULT_MAX_SESSIONS;
    this.idleMs = limits.idleMs ?? DEFAULT_IDLE_MS;
    this.lifetimeMs = limits.lifetimeMs ?? DEFAULT_LIFETIME_MS;
    this.now = limits.now ?? Date.now;
  }

  get lifetimeSeconds(): number {
    return Math.floor(this.lifetimeMs / 1000);
  }

  get size(): number {
    this.sweep();
    return this.byDigest.size;
  }

  /** A new session for `tokenId`; returns the id the cookie carries. */
  create(tokenId: string): { id: string; session: Session } {
    this.sweep();
    while (this.byDigest.size >= this.maxSessions) {
      // Maps iterate in insertion order: the first is the oldest login.
      const oldest = this.byDigest.keys().next().value as string;
      this.byDigest.delete(oldest);
    }
    const id = randomBytes(32).toString("base64url");
    const now = this.now();
    const session: Session = {
      tokenId,
      csrf: randomBytes(24).toString("base64url"),
      createdAtMs: now,
      lastSeenMs: now,
      expiresAtMs: now + this.lifetimeMs,
    };
    this.byDigest.set(digestOf(id), session);
    return { id, session };
  }

  /** The live session the cookie value names (and marks it used), or undefined. */
  lookup(id: string | undefined): Session | undefined {
    if (id === undefined || id.length === 0 || id.length > 256) return undefined;
    const key = digestOf(id);
    const session = this.byDigest.get(key);
    if (!session) return undefined;
    const now = this.now();
    if (this.expired(session, now)) {
      this.byDigest.delete(key);
      return undefined;
    }
    session.lastSeenMs = now;
    return session;
  }

  /** Ends the session the cookie value names; true if there was one. */
  remove(id: string | undefined): boolean {
    if (id === undefined || id.length === 0 || id.length > 256) return false;
    return this.byDigest.delete(digestOf(id));
  }

  private expired(session: Session, now: number): boolean {
    return now >= session.expiresAtMs || now - session.lastSeenMs >= this.idleMs;
  }

  private sweep(): void {
    const now = this.now();
    for (const [key, session] of this.byDigest) if (this.expired(session, now)) this.byDigest.delete(key);
  }
}

function digestOf(id: string): string {
  return createHash("sha256").update(id).digest("hex");
}
