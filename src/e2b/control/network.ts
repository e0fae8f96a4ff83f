/**
 * E2B's network options (create's `allow_internet_access` and `network`, the update route's body) in forkd's
 * terms: an egress policy for the controller (src/net/policy.ts checks its entries) and the sandbox's inbound
 * settings. E2B's semantics, as its API documents and enforces them:
 *   - no egress field at all: the sandbox gets the daemon's default (`forkd daemon --egress`);
 *   - otherwise the internet is reachable unless `allow_internet_access` is false or `denyOut` holds
 *     ALL_TRAFFIC ("0.0.0.0/0"); allow entries win over deny entries;
 *   - `allowOut` naming a domain needs everything else denied (else it would allow nothing new: E2B's 400);
 *   - an update replaces the whole egress configuration (a field left out is cleared).
 * What forkd cannot honour is refused by name (501): header transforms of outbound HTTPS (`rules`), a SOCKS5
 * egress proxy (`egressProxy`).
 */
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
}

/**
 * The egress policy an E2B request asks for; undefined when it says nothing about egress (a create then gets
 * the daemon's default, and so does an update: `{}` puts the sandbox back where a plain create starts).
 */
export function egressFromE2b(request: E2bEgress): EgressPolicyInput | undefined {
  refuseUnhonourable(request);
  const { allow_internet_access: internet, allowOut, denyOut } = request;
  if (internet === undefined && allowOut === undefined && denyOut === undefined) return undefined;
  const denyAll = internet === false || (denyOut ?? []).includes(ALL_TRAFFIC);
  const domain = (allowOut ?? []).find((entry) => !/^[0-9./]+$/.test(entry.trim()));
  if (domain !== undefined && !denyAll) {
    throw invalidArgument(
      `network.allowOut names the domain ${JSON.stringify(domain)}, which allows nothing new while all other ` +
        `traffic is allowed: add ALL_TRAFFIC ("${ALL_TRAFFIC}") to network.denyOut, or set allowInternetAccess: false`,
    );
  }
  return { default: denyAll ? "deny" : "allow", allowOut: allowOut ?? [], denyOut: denyOut ?? [] };
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
  const egress = egressFromE2b({ ...network, allow_internet_access: internet });
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
