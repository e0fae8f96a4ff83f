/**
 * Egress policy: what a sandbox may connect to. The one declaration of the policy types; the API, the CLI, the
 * SDK and the E2B layer all translate into `EgressPolicy` and hand it to `parseEgressPolicy`.
 *
 * Semantics (E2B's `allowInternetAccess` / `network.allowOut` / `network.denyOut`):
 *   - `default` is what happens to a destination no entry names: "allow" or "deny". E2B's
 *     `allowInternetAccess: false` and `denyOut: ["0.0.0.0/0"]` both mean default "deny".
 *   - Entries are IPv4 addresses, CIDR blocks, domain names, or `*.domain` wildcards (any name below the
 *     domain, not the domain itself).
 *   - Allow entries take precedence over deny entries (E2B: "allow rules always take precedence"): an address
 *     or name matched by both is allowed. So a deny list narrows the default and an allow list carves
 *     exceptions out of it: {default: deny, allowOut: [...]} is an allow list.
 *   - A domain rule acts through the sandbox's DNS forwarder: a name resolves only if the policy lets it, and
 *     the addresses answered for an allowed name become reachable for the answer's TTL. Connections to an
 *     address no rule allows follow the CIDR rules and the default.
 * Whatever the policy says, a sandbox never reaches other sandboxes, the host or the daemon (see nft.ts).
 */
import { invalidArgument } from "../common/errors.js";
import { ALL_TRAFFIC, MAX_POLICY_ENTRIES } from "../common/limits.js";
import { type Cidr, formatCidr, parseCidr } from "./ipv4.js";

export type EgressDefault = "allow" | "deny";

export interface EgressPolicy {
  default: EgressDefault;
  allowOut: string[];
  denyOut: string[];
}

/** What callers send: any field may be left out (`default` then comes from the daemon's --egress). */
export type EgressPolicyInput = Partial<EgressPolicy>;

/** A policy with every entry checked and sorted into what enforces it. */
export interface CompiledPolicy {
  default: EgressDefault;
  allowNets: Cidr[];
  denyNets: Cidr[];
  allowDomains: string[];
  denyDomains: string[];
}

const MAX_NAME_LENGTH = 253;
const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

export const ALLOW_ALL: EgressPolicy = Object.freeze({ default: "allow", allowOut: [], denyOut: [] });
export const DENY_ALL: EgressPolicy = Object.freeze({ default: "deny", allowOut: [], denyOut: [] });

/**
 * Checks a policy from any caller and returns it in canonical form: entries lower-cased, CIDRs with their host
 * bits cleared, duplicates dropped, "0.0.0.0/0" in denyOut turned into default "deny". Throws
 * `invalid_argument` naming the entry and the rule.
 */
export function parseEgressPolicy(input: unknown, field = "network"): EgressPolicy {
  if (typeof input !== "object" || input === null) throw invalidArgument(`${field} must be an object`);
  const raw = input as Record<string, unknown>;
  for (const key of Object.keys(raw)) {
    if (!["default", "allowOut", "denyOut"].includes(key)) {
      throw invalidArgument(
        `${field}: unknown field ${JSON.stringify(key)} (allowed: default, allowOut, denyOut)`,
      );
    }
  }
  if (raw.default !== "allow" && raw.default !== "deny") {
    throw invalidArgument(`${field}.default must be "allow" or "deny"`);
  }
  const allowOut = canonicalEntries(raw.allowOut, `${field}.allowOut`);
  let denyOut = canonicalEntries(raw.denyOut, `${field}.denyOut`);
  let defaultVerdict: EgressDefault = raw.default;
  if (denyOut.includes(ALL_TRAFFIC)) {
    defaultVerdict = "deny";
    denyOut = denyOut.filter((e) => e !== ALL_TRAFFIC);
  }
  return { default: defaultVerdict, allowOut, denyOut };
}

export function compilePolicy(policy: EgressPolicy): CompiledPolicy {
  const compiled: CompiledPolicy = {
    default: policy.default,
    allowNets: [],
    denyNets: [],
    allowDomains: [],
    denyDomains: [],
  };
  for (const [list, nets, domains] of [
    [policy.allowOut, compiled.allowNets, compiled.allowDomains],
    [policy.denyOut, compiled.denyNets, compiled.denyDomains],
  ] as const) {
    for (const entry of list) {
      const cidr = parseCidr(entry);
      if (cidr) nets.push(cidr);
      else domains.push(entry);
    }
  }
  return compiled;
}

/** True when the policy answers `name` (lower case, no trailing dot) through the DNS forwarder. */
export function nameIsAllowed(policy: CompiledPolicy, name: string): boolean {
  if (policy.allowDomains.some((pattern) => domainMatches(pattern, name))) return true;
  if (policy.denyDomains.some((pattern) => domainMatches(pattern, name))) return false;
  return policy.default === "allow";
}

/** True when an allow entry names `name` (its answers then become reachable even under default deny). */
export function nameIsExplicitlyAllowed(policy: CompiledPolicy, name: string): boolean {
  return policy.allowDomains.some((pattern) => domainMatches(pattern, name));
}

/** `example.org` matches only itself; `*.example.org` matches every name below it (not example.org). */
export function domainMatches(pattern: string, name: string): boolean {
  if (pattern.startsWith("*.")) return name.endsWith(pattern.slice(1)) && name.length > pattern.length - 1;
  return name === pattern;
}

/** Lower case, no trailing dot; null unless it is a valid DNS name. */
export function normalizeName(text: string): string | null {
  const name = text.toLowerCase().replace(/\.$/, "");
  if (name.length === 0 || name.length > MAX_NAME_LENGTH) return null;
  return name
    .split(".")
    .every((label) => LABEL.test(label) || label === "_" || /^_[a-z0-9-]{1,62}$/.test(label))
    ? name
    : null;
}

/** A list of policy entries checked and in canonical form (sorted, duplicates dropped); `field` names it in errors. */
export function canonicalEntries(value: unknown, field: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw invalidArgument(`${field} must be an array of strings`);
  if (value.length > MAX_POLICY_ENTRIES) {
    throw invalidArgument(`${field} has ${value.length} entries; at most ${MAX_POLICY_ENTRIES} are allowed`);
  }
  const out = new Set<string>();
  for (const item of value) {
    if (typeof item !== "string") throw invalidArgument(`${field} must be an array of strings`);
    out.add(canonicalEntry(item.trim(), field));
  }
  return [...out].sort();
}

function canonicalEntry(entry: string, field: string): string {
  if (entry.includes(":")) {
    throw invalidArgument(
      `${field}: ${JSON.stringify(entry)} is IPv6 (or has a port); sandboxes have IPv4 only and rules name hosts, not ports`,
    );
  }
  if (/^[0-9./]+$/.test(entry)) {
    const cidr = parseCidr(entry);
    if (!cidr) {
      throw invalidArgument(
        `${field}: ${JSON.stringify(entry)} is not an IPv4 address or CIDR block (a.b.c.d[/n])`,
      );
    }
    return formatCidr(cidr);
  }
  const wildcard = entry.startsWith("*.");
  const name = normalizeName(wildcard ? entry.slice(2) : entry);
  if (!name) {
    throw invalidArgument(
      `${field}: ${JSON.stringify(entry)} is not a domain name, "*.domain" wildcard, IPv4 address or CIDR block`,
    );
  }
  return wildcard ? `*.${name}` : name;
}
