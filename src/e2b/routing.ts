/**
 * Which E2B surface a request is for, decided before routing. The SDK reaches a sandbox either through
 * E2B_SANDBOX_URL with the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers, or through a host name
 * `<port>-<sandboxId>.<domain>`. Such requests only ever match data-plane routes (a router constraint with
 * mustMatchWhenDerived), so a request meant for a sandbox never reaches the control plane or the forkd API.
 */
import type { IncomingHttpHeaders } from "node:http";
import { hostname } from "node:os";
import { SANDBOX_ID_PATTERN } from "../common/limits.js";
import { unanchored } from "../common/names.js";

/** envd's port (processes, files) and the code interpreter's, as the SDKs address them. */
export const ENVD_PORT = 49983;
export const INTERPRETER_PORT = 49999;

export const SURFACE_CONSTRAINT = "e2bSandboxSurface";

/** envd, the code interpreter, or any other port of the sandbox (proxied to the guest: ports.ts). */
export type SandboxSurface = "envd" | "interpreter" | "port";

export interface SandboxAddress {
  sandboxId: string;
  /** NaN when the request named none or an invalid one. */
  port: number;
}

const HOST_PATTERN = new RegExp(`^(\\d{1,5})-(${unanchored(SANDBOX_ID_PATTERN)})(?:\\.|:|$)`, "i");

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The sandbox and port a request addresses, or null when it is not a data-plane request. */
export function sandboxAddressOf(headers: IncomingHttpHeaders): SandboxAddress | null {
  const id = header(headers, "e2b-sandbox-id");
  const port = header(headers, "e2b-sandbox-port");
  if (id !== undefined || port !== undefined) {
    return { sandboxId: id ?? "", port: parsePort(port) };
  }
  const host = HOST_PATTERN.exec(header(headers, "host") ?? "");
  if (host) return { sandboxId: (host[2] as string).toLowerCase(), port: parsePort(host[1]) };
  return null;
}

/**
 * Whether a browser `Origin` is a page served from a sandbox's port (`<port>-<sandboxId>.<domain>`): content
 * the guest controls. Such pages may call the data plane, as on E2B; the forkd API and the control plane
 * refuse them (src/api/app.ts), so a sandbox's web page can never drive the daemon.
 */
export function isSandboxOrigin(origin: string | undefined): boolean {
  if (origin === undefined) return false;
  try {
    return HOST_PATTERN.test(new URL(origin).hostname);
  } catch {
    return false;
  }
}

/**
 * The sandboxes' domain when the daemon has no `--e2b-domain`: its own name, so `getHost(port)` never names
 * E2B's production domain (the SDKs' fallback when the API gives none). On a loopback listener
 * `localhost:<port>`: `<port>-<id>.localhost:<port>` reaches the daemon from this machine wherever `*.localhost`
 * resolves to loopback (RFC 6761: browsers, curl, systemd-resolved); elsewhere the machine's host name. Names
 * other machines resolve need `--e2b-domain` and wildcard DNS.
 */
export function defaultSandboxDomain(tcp: { host: string; port: number } | undefined): string {
  if (tcp === undefined) return "localhost";
  const loopback = tcp.host === "localhost" || tcp.host === "::1" || tcp.host.startsWith("127.");
  const name = loopback ? "localhost" : hostname().toLowerCase();
  return `${name}:${tcp.port}`;
}

function parsePort(value: string | undefined): number {
  if (value === undefined || !/^\d{1,5}$/.test(value)) return Number.NaN;
  const port = Number(value);
  return port >= 1 && port <= 65535 ? port : Number.NaN;
}

export function surfaceOf(port: number): SandboxSurface {
  if (port === ENVD_PORT) return "envd";
  if (port === INTERPRETER_PORT) return "interpreter";
  return "port";
}

type Handler = unknown;

/**
 * The router constraint: data-plane requests derive their surface and then match only routes registered with
 * `constraints: { [SURFACE_CONSTRAINT]: surface }`; every other request derives nothing and never matches them.
 */
export const surfaceConstraint = {
  name: SURFACE_CONSTRAINT,
  mustMatchWhenDerived: true,
  storage() {
    const handlers = new Map<string, Handler>();
    return {
      get: (value: string) => (handlers.get(value) ?? null) as never,
      set: (value: string, handler: Handler) => {
        handlers.set(value, handler);
      },
    };
  },
  deriveConstraint(req: { headers: IncomingHttpHeaders }): string | undefined {
    const address = sandboxAddressOf(req.headers);
    return address === null ? undefined : surfaceOf(address.port);
  },
  validate(value: unknown) {
    if (value !== "envd" && value !== "interpreter" && value !== "port") {
      throw new Error(`unknown E2B sandbox surface ${String(value)}`);
    }
  },
};
