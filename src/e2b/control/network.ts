/**
 * E2B's network options (create's `allow_internet_access` and `network`, the update route's body) in forkd's
 * terms: an egress policy for the controller (src/net/policy.ts checks its entries) and the sandbox's inbound
 * settings. E2B's semantics, as its API documents and enforces them, under one rule of forkd's: a client asks
 * only to narrow the operator's default or for named destinations, never for "the whole internet", because
 * older Python SDKs send `allow_internet_access: true` on every create whether the caller said so or not:
 *   - no egress field at all, or only `allow_internet_access: true`: the sandbox gets its template's default,
 *     else the daemon's (`forkd daemon --egress`), as if nothing were said (on an `allow` daemon that is E2B's
 *     "internet"; on a `deny` daemon the operator's deny stands);
 *   - `allow_internet_access: false` or ALL_TRAFFIC ("0.0.0.0/0") in `denyOut`: everything denied but
 *     `allowOut`; otherwise the default's `egress` with the given lists; allow entries win over deny entries;
 *   - `allowOut` naming a domain needs everything else denied (else it would allow nothing new: E2B's 400);
 *   - an update replaces the whole egress configuration (a field left out is cleared).
 * What forkd cannot honour is refused by name (501): header transforms of outbound HTTPS (`rules`), a SOCKS5
 * egress proxy (`egressProxy`).
 */
import { isIPv4 } from "node:net";
import type { Static } from "@sinclair/typebox";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { ALL_TRAFFIC } from "../../common/limits.js";
import type {
  EgressPolicy,
  EgressPolicyInput,
  InboundSettings,
  SandboxInfo,
} from "../../controller/sandbox-service.js";
import { ENVD_PORT, INTERPRETER_PORT } from "../routing.js";
import type { NetworkConfig, NetworkInfo } from "./schemas.js";

/** The egress fields E2B's create and update requests share. */
interface E2bEgress {
  allow_internet_access?: boolean;
  allowOut?: string[];
  denyOut?: string[];
  rules?: Record<string, unknown[]>;
  egressProxy?: unknown;
  dnsServers?: string[];
}

/**
 * The egress policy an E2B request asks for; undefined when it says nothing that changes the default (a create
 * then gets the template's or the daemon's default, and so does an update: `{}` puts the sandbox back where a
 * plain create starts). `missingLists`: what a list the request leaves out becomes: `"cleared"` (an update
 * replaces the whole configuration, as E2B's) or `"default"` (a create keeps the template's lists).
 */
export function egressFromE2b(
  request: E2bEgress,
  missingLists: "cleared" | "default" = "cleared",
): EgressPolicyInput | undefined {
  refuseUnhonourable(request);
  const { allow_internet_access: internet, allowOut, denyOut } = request;
  if ((internet === undefined || internet === true) && allowOut === undefined && denyOut === undefined) {
    return undefined;
  }
  const denyAll = internet === false || (denyOut ?? []).includes(ALL_TRAFFIC);
  const domain = (allowOut ?? []).find((entry) => !/^[0-9./]+$/.test(entry.trim()));
  if (domain !== undefined && !denyAll) {
    throw invalidArgument(
      `network.allowOut names the domain ${JSON.stringify(domain)}, which allows nothing new while all other ` +
        `traffic is allowed: add ALL_TRAFFIC ("${ALL_TRAFFIC}") to network.denyOut, or set allowInternetAccess: false`,
    );
  }
  const list = (entries: string[] | undefined) =>
    entries !== undefined ? entries : missingLists === "cleared" ? [] : undefined;
  // E2B: "when allowOut contains a domain, the servers in dnsServers are also allowed".
  const dns = domain !== undefined ? checkedDnsServers(request.dnsServers) : [];
  const lists = {
    allowOut: list(allowOut === undefined ? undefined : [...allowOut, ...dns]),
    denyOut: list(denyOut),
  };
  return {
    // Only ever "deny": an "allow" would widen an operator's `--egress deny` (see the rule above).
    ...(denyAll ? { default: "deny" as const } : {}),
    ...(lists.allowOut !== undefined ? { allowOut: lists.allowOut } : {}),
    ...(lists.denyOut !== undefined ? { denyOut: lists.denyOut } : {}),
  };
}

/**
 * Create's whole network request: egress and inbound. On a daemon that serves no public sandbox traffic
 * (`privateTraffic`), every sandbox needs its traffic token and asking for public traffic is refused.
 */
export function networkFromE2b(
  internet: boolean | undefined,
  network: Static<typeof NetworkConfig> | undefined,
  privateTraffic = false,
): { egress: EgressPolicyInput | undefined; inbound: Partial<InboundSettings> } {
  if (privateTraffic && network?.allowPublicTraffic === true) {
    throw new ForkdError(
      "forbidden",
      "network.allowPublicTraffic: this daemon serves no public sandbox traffic (--e2b-private-traffic): " +
        "requests to a sandbox's ports carry its trafficAccessToken as E2B-Traffic-Access-Token",
    );
  }
  const egress = egressFromE2b({ ...network, allow_internet_access: internet }, "default");
  const httpsPorts = network?.httpsPorts ?? [];
  const served = httpsPorts.find((port) => port === ENVD_PORT || port === INTERPRETER_PORT);
  if (served !== undefined) {
    throw invalidArgument(
      `network.httpsPorts: port ${served} is served by the daemon itself (envd or the code interpreter), not by the sandbox`,
    );
  }
  return {
    egress,
    inbound: {
      requireTrafficToken: privateTraffic || network?.allowPublicTraffic === false,
      hostHeader: network?.maskRequestHost ?? null,
      httpsPorts,
    },
  };
}

/** The sandbox's network as E2B's SandboxDetail reports it. */
export function networkToE2b(info: SandboxInfo): {
  allowInternetAccess: boolean;
  network: Static<typeof NetworkInfo>;
} {
  const policy: EgressPolicy | null = info.network.kind === "netns" ? info.network.policy : null;
  const denyAll = policy === null || policy.default === "deny";
  const { inbound } = info;
  return {
    allowInternetAccess: !denyAll,
    network: {
      allowOut: policy?.allowOut ?? [],
      denyOut: [...(denyAll ? [ALL_TRAFFIC] : []), ...(policy?.denyOut ?? [])],
      allowPublicTraffic: !inbound.requireTrafficToken,
      ...(inbound.hostHeader !== null ? { maskRequestHost: inbound.hostHeader } : {}),
      ...(inbound.httpsPorts.length > 0 ? { httpsPorts: inbound.httpsPorts } : {}),
    },
  };
}

/** network.dnsServers: IPv4 addresses only, as E2B takes them. */
function checkedDnsServers(servers: string[] | undefined): string[] {
  for (const server of servers ?? []) {
    if (!isIPv4(server)) {
      throw invalidArgument(`network.dnsServers: ${JSON.stringify(server)} is not an IPv4 address`);
    }
  }
  return servers ?? [];
}

function refuseUnhonourable(request: E2bEgress): void {
  if (request.rules !== undefined && Object.keys(request.rules).length > 0) {
    throw new ForkdError(
      "not_implemented",
      "network.rules: forkd does not rewrite outbound HTTPS requests (that needs TLS interception); " +
        "send the headers from the sandbox itself",
    );
  }
  if (request.egressProxy !== undefined && request.egressProxy !== null) {
    throw new ForkdError(
      "not_implemented",
      "network.egressProxy: forkd sandboxes do not tunnel egress through a SOCKS5 proxy; omit it",
    );
  }
}
