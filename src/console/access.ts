/**
 * Who may use the console, on which listener, and how a browser's requests are told apart from a forged one.
 *
 * TCP (token-guarded): a login trades a daemon token for a session whose id lives in an HttpOnly,
 * SameSite=Strict cookie (Secure and `__Host-` prefixed under TLS). The cookie counts only on the console's own
 * routes and on the REST calls the console makes (protocol.ts, CONSOLE_API_CALLS); anywhere else the API still
 * wants its bearer token. A state-changing request authenticated by the cookie must also carry an Origin (which
 * the listener has already checked is its own) and the session's CSRF token in a header (or, for the terminal
 * WebSocket, a subprotocol), so neither a cross-site form nor a page that only knows the cookie exists can act.
 *
 * Unix socket: its file permissions are the access control. The API applies the socket's browser rule to every
 * request and upgrade (src/api/socket-browser.ts); the console adds its own paths to what counts as a browser's,
 * gives its page the listener's CSRF token, and checks that token on the terminal's upgrade.
 */
import type { IncomingHttpHeaders } from "node:http";
import { parseCookie, stringifySetCookie } from "cookie";
import type { FastifyRequest } from "fastify";
import { authenticate } from "../api/auth.js";
import { CONSOLE_SESSION_CALLER, type ListenerInfo } from "../api/extensions.js";
import { csrfMatches, looksLikeBrowser, screenSocketBrowser } from "../api/socket-browser.js";
import { ForkdError } from "../common/errors.js";
import { CONSOLE_COOKIE, CONSOLE_COOKIE_TLS } from "../common/tokens.js";
import { CONSOLE_API_CALLS, CONSOLE_PATH, CSRF_HEADER, CSRF_PROTOCOL_PREFIX } from "./protocol.js";
import { type Session, type SessionLimits, SessionStore } from "./sessions.js";

/** How a console route is reached: without any credential (the page, login), or with a session. */
export type ConsoleRouteAccess = "public" | "session";

declare module "fastify" {
  interface FastifyContextConfig {
    /** A console route (src/console): its access rule. */
    console?: ConsoleRouteAccess;
  }
}

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);
const COOKIE_CALLS = new Set(CONSOLE_API_CALLS.map(([method, route]) => `${method} ${route}`));

export interface RequestFacts {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  /** The matched route's pattern, when routing has run. */
  routeOptions?: { url?: string };
}

export class ConsoleAccess {
  readonly sessions: SessionStore;

  constructor(limits: SessionLimits = {}) {
    this.sessions = new SessionStore(limits);
  }

  /** The session cookie's name: `__Host-` under TLS binds it to this exact origin and path `/`. */
  cookieName(listener: ListenerInfo): string {
    return listener.tls ? CONSOLE_COOKIE_TLS : CONSOLE_COOKIE;
  }

  setCookie(listener: ListenerInfo, id: string): string {
    return stringifySetCookie({
      name: this.cookieName(listener),
      value: id,
      httpOnly: true,
      sameSite: "strict",
      secure: listener.tls,
      // The console's routes and the API calls it makes live under different prefixes.
      path: "/",
      maxAge: this.sessions.lifetimeSeconds,
    });
  }

  clearCookie(listener: ListenerInfo): string {
    return stringifySetCookie({
      name: this.cookieName(listener),
      value: "",
      httpOnly: true,
      sameSite: "strict",
      secure: listener.tls,
      path: "/",
      maxAge: 0,
    });
  }

  /** The session id the request's cookie carries, if any. */
  cookieValue(headers: IncomingHttpHeaders, listener: ListenerInfo): string | undefined {
    const header = headers.cookie;
    if (header === undefined || header.length > 8192) return undefined;
    return parseCookie(header)[this.cookieName(listener)];
  }

  sessionOf(headers: IncomingHttpHeaders, listener: ListenerInfo): Session | undefined {
    return this.sessions.lookup(this.cookieValue(headers, listener));
  }

  /** The socket's browser rule for the console's own paths, which a browser may open without browser headers. */
  screen(request: RequestFacts, listener: ListenerInfo): void {
    if (listener.transport !== "unix" || !isConsolePath(request.url)) return;
    screenSocketBrowser(request, listener.socketCsrf, { browser: true });
  }

  /**
   * The caller of a request without a bearer token on a token-guarded listener: anyone on the console's public
   * routes, the session's token on routes that take the cookie, otherwise undefined (the token is required).
   */
  identify(request: FastifyRequest, listener: ListenerInfo): string | undefined {
    const access = request.routeOptions.config.console;
    if (access === "public") return `${listener.transport}:${request.ip}`;
    const route = request.routeOptions.url;
    const takesCookie =
      access === "session" || (route !== undefined && COOKIE_CALLS.has(`${request.method} ${route}`));
    const id = this.cookieValue(request.headers, listener);
    if (!takesCookie || id === undefined) return undefined;
    const session = this.sessions.lookup(id);
    if (!session) {
      throw new ForkdError(
        "unauthorized",
        "the console session has ended (logged out or expired): log in again",
      );
    }
    if (!SAFE_METHODS.has(request.method))
      checkCsrf(request.headers, header(request.headers, CSRF_HEADER), session);
    return `${CONSOLE_SESSION_CALLER}${session.tokenId}`;
  }

  /**
   * Authorizes the terminal WebSocket's upgrade request and returns the caller: a bearer token, or the session
   * cookie with the CSRF token among the offered subprotocols (TCP); the socket's browser rule (Unix).
   */
  authorizeUpgrade(req: RequestFacts, listener: ListenerInfo): string {
    const presentedCsrf = offeredProtocols(req.headers)
      .find((p) => p.startsWith(CSRF_PROTOCOL_PREFIX))
      ?.slice(CSRF_PROTOCOL_PREFIX.length);
    if (listener.transport === "unix") {
      // The API has applied the socket's browser rule to the upgrade; a browser's terminal also shows the token.
      if (looksLikeBrowser(req.headers) || isConsolePath(req.url)) {
        screenSocketBrowser(req, listener.socketCsrf, { browser: true, upgrade: true });
        if (req.headers.origin !== undefined && !csrfMatches(presentedCsrf, listener.socketCsrf)) {
          throw new ForkdError("forbidden", "the terminal's CSRF token is missing or wrong");
        }
      }
      return "unix";
    }
    if (listener.transport !== "tcp" || listener.tokens.length === 0) return listener.transport;
    if (req.headers.authorization !== undefined) {
      const token = authenticate(req.headers.authorization, listener.tokens);
      // A terminal can open any sandbox: an admin's, like the console itself.
      if (token.tenant !== null) throw new ForkdError("forbidden", "console terminals are for admin tokens");
      return token.id;
    }
    const session = this.sessionOf(req.headers, listener);
    if (!session) {
      throw new ForkdError(
        "unauthorized",
        "missing credentials: log in to the console (session cookie) or send Authorization: Bearer <token>",
      );
    }
    checkCsrf(req.headers, presentedCsrf, session);
    return `${CONSOLE_SESSION_CALLER}${session.tokenId}`;
  }
}

function checkCsrf(headers: IncomingHttpHeaders, presented: string | undefined, session: Session): void {
  // The listener refused any Origin but its own; a cookie-authenticated write must show one (browsers always do).
  if (headers.origin === undefined) {
    throw new ForkdError(
      "forbidden",
      "a state-changing request authenticated by the console's session cookie must carry an Origin header",
    );
  }
  if (!csrfMatches(presented, session.csrf)) {
    throw new ForkdError("forbidden", `missing or wrong ${CSRF_HEADER} (the console session's CSRF token)`);
  }
}

function isConsolePath(url: string): boolean {
  return url === CONSOLE_PATH || url.startsWith(`${CONSOLE_PATH}/`) || url.startsWith(`${CONSOLE_PATH}?`);
}

function offeredProtocols(headers: IncomingHttpHeaders): string[] {
  const value = headers["sec-websocket-protocol"];
  if (typeof value !== "string") return [];
  return value
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p.length > 0);
}

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return typeof value === "string" ? value : undefined;
}
