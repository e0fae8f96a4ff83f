/**
 * Which `Host` and `Origin` a TCP listener answers. A root daemon on loopback is reachable by every web page the
 * host's browser opens: by DNS rebinding (a page's own name re-pointed at 127.0.0.1) it sends requests whose
 * `Host` is the attacker's name, and cross-site requests carry the page's `Origin`. So a request is served only
 * when its `Host` names this listener (its bind address, `localhost` for a loopback bind, or a configured
 * `--allowed-host`) and, when it has an `Origin` (browsers send one on cross-origin and on every
 * state-changing request), that origin is this listener's own or a configured `--allowed-origin`.
 */
import { isIP } from "node:net";
import { ForkdError, invalidArgument } from "../common/errors.js";

export interface OriginPolicy {
  /** Lower-case host names (no port) whose requests are served, e.g. "127.0.0.1", "localhost". */
  hosts: ReadonlySet<string>;
  /** Suffixes (".sandbox.example") under which any name is served: `*.sandbox.example` in --allowed-host. */
  hostSuffixes: readonly string[];
  /** Exact origins ("https://console.example:8443") allowed besides the listener's own. */
  origins: ReadonlySet<string>;
  /** The port the listener is bound to; a Host with another port is refused. */
  port: number;
}

const HOST_NAME = /^(?:\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

/** Validates one `--allowed-host` value: a host name, an IP address, or `*.domain`. */
export function parseAllowedHost(value: string): string {
  const host = value.trim().toLowerCase();
  const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
  if (isIP(bare) !== 0) return bare;
  if (!HOST_NAME.test(host) || host.length > 253) {
    throw invalidArgument(
      `invalid --allowed-host ${JSON.stringify(value)}: expected a host name, an IP address or *.domain (no port)`,
    );
  }
  return host;
}

/** Validates one `--allowed-origin` value: scheme://host[:port], as browsers send it. */
export function parseAllowedOrigin(value: string): string {
  let url: URL;
  try {
    url = new URL(value.trim());
  } catch {
    throw invalidArgument(`invalid --allowed-origin ${JSON.stringify(value)}: expected scheme://host[:port]`);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.pathname !== "/" || url.search) {
    throw invalidArgument(
      `invalid --allowed-origin ${JSON.stringify(value)}: expected http(s)://host[:port] without a path`,
    );
  }
  return url.origin;
}

/**
 * The policy of a listener bound to `bindHost:port`: its own address, `localhost` and both loopback addresses
 * when it listens on loopback, every address when it listens on a wildcard (then configure --allowed-host for
 * the names clients use), plus the configured extras.
 */
export function originPolicyFor(
  bindHost: string,
  port: number,
  extra: { hosts?: readonly string[]; origins?: readonly string[] } = {},
): OriginPolicy {
  const hosts = new Set<string>([bindHost.toLowerCase()]);
  if (isLoopback(bindHost)) for (const h of ["localhost", "127.0.0.1", "::1"]) hosts.add(h);
  const hostSuffixes: string[] = [];
  for (const value of extra.hosts ?? []) {
    const host = parseAllowedHost(value);
    if (host.startsWith("*.")) hostSuffixes.push(host.slice(1));
    else hosts.add(host);
  }
  const origins = new Set((extra.origins ?? []).map(parseAllowedOrigin));
  return { hosts, hostSuffixes, origins, port };
}

/** Throws `forbidden` unless the request's Host and Origin are this listener's (see the module comment). */
export function checkHostAndOrigin(
  policy: OriginPolicy,
  headers: { host?: string; origin?: string },
  scheme: "http" | "https",
): void {
  const host = parseHostHeader(headers.host);
  if (host === null) {
    throw new ForkdError("forbidden", "missing or malformed Host header");
  }
  if (!hostAllowed(policy, host.name) || (host.port !== null && host.port !== policy.port)) {
    throw new ForkdError(
      "forbidden",
      `Host ${JSON.stringify(headers.host)} is not a name of this listener ` +
        "(a DNS-rebinding page would send one like it); start the daemon with --allowed-host to serve it",
    );
  }
  const origin = headers.origin;
  if (origin === undefined) return;
  if (policy.origins.has(origin)) return;
  const own = parseOrigin(origin);
  if (
    own &&
    own.scheme === scheme &&
    hostAllowed(policy, own.name) &&
    (own.port ?? defaultPort(scheme)) === policy.port
  ) {
    return;
  }
  throw new ForkdError(
    "forbidden",
    `cross-origin request from ${JSON.stringify(origin.slice(0, 200))} refused; start the daemon with ` +
      "--allowed-origin to allow it",
  );
}

function hostAllowed(policy: OriginPolicy, name: string): boolean {
  if (policy.hosts.has(name)) return true;
  if (isIP(name) === 0 && policy.hostSuffixes.some((suffix) => name.endsWith(suffix))) return true;
  // A wildcard bind serves whatever address a client reached it on; names still need --allowed-host.
  return (policy.hosts.has("0.0.0.0") || policy.hosts.has("::")) && isIP(name) !== 0;
}

interface HostPort {
  name: string;
  port: number | null;
}

function parseHostHeader(value: string | undefined): HostPort | null {
  if (value === undefined || value.length === 0 || value.length > 300) return null;
  const match = /^(?:\[([0-9a-f:.]+)\]|([^:[\]]+))(?::(\d{1,5}))?$/i.exec(value);
  if (!match) return null;
  const name = (match[1] ?? match[2] ?? "").toLowerCase().replace(/\.$/, "");
  if (match[1] !== undefined && isIP(name) !== 6) return null;
  const port = match[3] === undefined ? null : Number(match[3]);
  if (port !== null && port > 65535) return null;
  return { name, port };
}

function parseOrigin(value: string): (HostPort & { scheme: string }) | null {
  try {
    const url = new URL(value);
    const scheme = url.protocol.replace(/:$/, "");
    const name = url.hostname.replace(/^\[|\]$/g, "").toLowerCase();
    return { scheme, name, port: url.port === "" ? null : Number(url.port) };
  } catch {
    return null;
  }
}

function defaultPort(scheme: string): number {
  return scheme === "https" ? 443 : 80;
}

function isLoopback(host: string): boolean {
  if (host === "localhost") return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  return host === "::1";
}
