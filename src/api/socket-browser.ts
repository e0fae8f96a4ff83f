/**
 * The Unix socket's rule for browsers. The socket's file permissions are its access control, so whoever puts a
 * forwarder in front of it (docs/console.md says not to) hands its admin API to a browser, and every page that
 * browser opens could try it. A request that looks like a browser's (an Origin, a Cookie, Sec-Fetch headers) must
 * name a host no other site can make resolve to the forwarder (an IP address, localhost, *.localhost) and come
 * from that host's own origin (no DNS rebinding, no cross-site request); it may not open a sandbox's port route
 * (the guest's page would share the origin of everything else on the socket: `forkd port` gives it its own);
 * and its state-changing requests carry the listener's CSRF token (the console's page gets it from its session
 * route; with `--no-console` no page has it, so a browser changes nothing).
 *
 * Part of the API's own checks (app.ts), on every request and every upgrade, whether the console is mounted or
 * not: the console only adds its paths to what counts as a browser's.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { isIP } from "node:net";
import { ForkdError } from "../common/errors.js";
import { PORT_PROXY_HEADER } from "../common/proxied-path.js";

/**
 * The header a browser's state-changing request carries its CSRF token in; the console's page sends it
 * (src/console/protocol.ts declares the same name for the front end, which may not import this file;
 * test/console/access.test.ts checks they agree).
 */
export const SOCKET_CSRF_HEADER = "x-forkd-csrf";

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);
const PORT_PATH = /^\/v1\/sandboxes\/[^/?#]+\/ports\/[^/?#]+(?:[/?#]|$)/;

export interface BrowserRequest {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
}

/** A new CSRF token for one socket listener (one per daemon start). */
export function newSocketCsrf(): string {
  return randomBytes(24).toString("base64url");
}

/** Whether `presented` is `expected`, in constant time. */
export function csrfMatches(presented: string | undefined, expected: string): boolean {
  if (presented === undefined) return false;
  const a = createHash("sha256").update(presented).digest();
  const b = createHash("sha256").update(expected).digest();
  return timingSafeEqual(a, b);
}

export function looksLikeBrowser(headers: IncomingHttpHeaders): boolean {
  return (
    headers.origin !== undefined ||
    headers.cookie !== undefined ||
    headers["sec-fetch-site"] !== undefined ||
    headers["sec-fetch-mode"] !== undefined
  );
}

/**
 * Refuses a browser's request through the socket that breaks the rule (module comment). `browser` forces the
 * rule for a request that shows no browser headers (the console's own paths); `upgrade`: an HTTP upgrade (its
 * CSRF token, when it needs one, is the upgrade handler's to check).
 */
export function screenSocketBrowser(
  request: BrowserRequest,
  csrf: string,
  options: { browser?: boolean; upgrade?: boolean } = {},
): void {
  if (!options.browser && !looksLikeBrowser(request.headers)) return;
  checkSocketBrowserOrigin(request.headers);
  if (PORT_PATH.test(request.url) && request.headers[PORT_PROXY_HEADER] === undefined) {
    throw new ForkdError(
      "forbidden",
      "a browser opening a sandbox's port through the Unix socket would share the console's origin: " +
        "use `forkd port <id> <port>`, which gives the sandbox's pages an origin of their own",
    );
  }
  if (options.upgrade || SAFE_METHODS.has(request.method)) return;
  const presented = request.headers[SOCKET_CSRF_HEADER];
  if (!csrfMatches(typeof presented === "string" ? presented : undefined, csrf)) {
    throw new ForkdError(
      "forbidden",
      `a browser's state-changing request through the Unix socket needs the console's ${SOCKET_CSRF_HEADER} header`,
    );
  }
}

/**
 * Through a forwarder to the socket, a browser's request must name a host no other site can make resolve to the
 * forwarder (an IP address, localhost, *.localhost) and come from that host's own origin.
 */
function checkSocketBrowserOrigin(headers: IncomingHttpHeaders): void {
  const host = (headers.host ?? "").toLowerCase();
  const name = hostName(host);
  const rebindable =
    name === null || !(isIP(name) !== 0 || name === "localhost" || name.endsWith(".localhost"));
  if (rebindable) {
    throw new ForkdError(
      "forbidden",
      `Host ${JSON.stringify(host.slice(0, 200))} refused: through a proxy to the Unix socket a browser must use an ` +
        "IP address or localhost (another name could be a DNS-rebinding page)",
    );
  }
  const origin = headers.origin;
  if (origin !== undefined && origin !== `http://${host}` && origin !== `https://${host}`) {
    throw new ForkdError(
      "forbidden",
      `cross-origin request from ${JSON.stringify(origin.slice(0, 200))} refused (the page must come from ${host})`,
    );
  }
}

function hostName(host: string): string | null {
  const match = /^(?:\[([0-9a-f:.]+)\]|([^:[\]]+))(?::\d{1,5})?$/.exec(host);
  if (!match) return null;
  return (match[1] ?? match[2] ?? "").replace(/\.$/, "");
}
