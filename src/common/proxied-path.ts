/**
 * What a front that proxies under a route prefix (`forkd port`: every request to its local listener becomes
 * `/v1/sandboxes/<id>/ports/<port>` + the request's own path, sent with the operator's credential) must hold
 * to: the request's path is passed on exactly as it came, and a path that could climb out of the prefix is
 * refused before anything is sent. Dot segments (`.`, `..`, also percent-encoded in any case: WHATWG URL
 * parsers decode `%2e` as a dot), encoded slashes and backslashes (`%2f`, `%5c`, `\`: a URL parser turns
 * `\` into `/` for http URLs) and request targets that are not a path are refused. The daemon refuses any
 * route but the port proxy's on a request that carries PORT_PROXY_HEADER (src/api/app.ts), so a path that
 * still got through would reach nothing else.
 */

/**
 * Set by `forkd port` on everything it proxies. The daemon serves only the port proxy's routes to a request
 * carrying it; on the Unix socket it also lets a browser's requests to the port route through (the listener is
 * the sandbox's own origin, see src/console/access.ts).
 */
export const PORT_PROXY_HEADER = "x-forkd-port-proxy";

const ENCODED_SEPARATOR = /%(?:2f|5c)/i;
const ENCODED_DOT = /%2e/gi;

/** Why `target` (a request target as received: path and query) may not be proxied under a prefix, or null. */
export function unsafeProxiedPath(target: string): string | null {
  if (!target.startsWith("/")) return "the request target must be a path (origin form, starting with /)";
  const query = target.search(/[?#]/);
  const path = query < 0 ? target : target.slice(0, query);
  if (path.includes("\\")) return "the path contains a backslash";
  if (ENCODED_SEPARATOR.test(path)) return "the path contains an encoded slash or backslash (%2f, %5c)";
  for (const segment of path.split("/")) {
    const decoded = segment.replace(ENCODED_DOT, ".");
    if (decoded === "." || decoded === "..") {
      return `the path contains the dot segment ${JSON.stringify(segment)}`;
    }
  }
  return null;
}
