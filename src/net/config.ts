/**
 * The host side of sandbox networking, per daemon: one bridge, one subnet on it (the bridge has the first
 * address, each sandbox's namespace one of the others), the DNS forwarder's port on the bridge address, and
 * the resolvers it forwards to. Defaults suit one daemon per host; every value can be changed (daemon flags
 * or FORKD_NET_* variables), e.g. to run a second daemon with its own bridge.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { invalidArgument } from "../common/errors.js";
import { GATEWAY_IP, GUEST_PREFIX_LENGTH } from "../common/guest-network.js";
import { type Cidr, cidrsOverlap, formatCidr, fromUint32, isIPv4, parseCidr, toUint32 } from "./ipv4.js";

export const DEFAULT_HOME = "/var/lib/forkd";
export const DEFAULT_BRIDGE = "forkd0";
export const DEFAULT_SUBNET = "10.43.0.0/16";
export const DEFAULT_DNS_PORT = 53;
/** Large enough for any host's sandboxes, small enough to leave room for other networks. */
const MIN_PREFIX = 8;
const MAX_PREFIX = 28;
const BRIDGE_NAME = /^[a-z][a-z0-9]{0,14}$/;

export interface DnsUpstream {
  address: string;
  port: number;
}

export interface HostNetworkConfig {
  bridge: string;
  subnet: Cidr;
  /** The bridge's own address (the subnet's first), the sandboxes' next hop and the DNS forwarder's address. */
  bridgeAddress: string;
  dnsPort: number;
  /** Where the forwarder sends allowed queries: the host's resolvers unless configured. */
  dnsUpstreams: DnsUpstream[];
}

export interface NetworkConfigInput {
  bridge?: string;
  subnet?: string;
  dnsPort?: number;
  /** "ip[:port]" entries. */
  dnsUpstreams?: string[];
}

/**
 * The default bridge and subnet of a forkd home: forkd0 and 10.43.0.0/16 for the default home; for any other
 * home (tests, benchmarks, a second daemon) a bridge and a /20 in 10.64.0.0/10 derived from its path, so homes
 * never share a bridge (an overlap with an existing route is refused at setup, not guessed around).
 */
export function homeNetworkDefaults(home: string): { bridge: string; subnet: string } {
  if (home === DEFAULT_HOME) return { bridge: DEFAULT_BRIDGE, subnet: DEFAULT_SUBNET };
  const digest = createHash("sha256").update(`forkd-home:${home}`).digest();
  const bridge = `fk${digest.subarray(0, 4).toString("hex")}`;
  return {
    bridge,
    subnet: `10.${64 + ((digest[4] as number) % 64)}.${((digest[5] as number) % 16) * 16}.0/20`,
  };
}

/** Flags win over FORKD_NET_BRIDGE / FORKD_NET_SUBNET / FORKD_DNS_PORT / FORKD_DNS_UPSTREAM, which win over defaults. */
export function resolveNetworkConfig(
  input: NetworkConfigInput = {},
  env: NodeJS.ProcessEnv = process.env,
  home = DEFAULT_HOME,
): HostNetworkConfig {
  const defaults = homeNetworkDefaults(home);
  const bridge = input.bridge ?? env.FORKD_NET_BRIDGE ?? defaults.bridge;
  if (!BRIDGE_NAME.test(bridge)) {
    throw invalidArgument(`bridge name ${JSON.stringify(bridge)} must match [a-z][a-z0-9]{0,14}`);
  }
  const subnetText = input.subnet ?? env.FORKD_NET_SUBNET ?? defaults.subnet;
  const subnet = parseCidr(subnetText);
  if (!subnet || !subnetText.includes("/") || subnet.prefix < MIN_PREFIX || subnet.prefix > MAX_PREFIX) {
    throw invalidArgument(
      `sandbox subnet ${JSON.stringify(subnetText)} must be an IPv4 CIDR block /${MIN_PREFIX}../${MAX_PREFIX}`,
    );
  }
  const guestNet = { address: GATEWAY_IP.replace(/\.\d+$/, ".0"), prefix: GUEST_PREFIX_LENGTH };
  if (cidrsOverlap(subnet, guestNet)) {
    throw invalidArgument(
      `sandbox subnet ${formatCidr(subnet)} overlaps the guests' own network ${formatCidr(guestNet)}`,
    );
  }
  const dnsPort = input.dnsPort ?? (env.FORKD_DNS_PORT ? Number(env.FORKD_DNS_PORT) : DEFAULT_DNS_PORT);
  if (!Number.isInteger(dnsPort) || dnsPort < 1 || dnsPort > 65535) {
    throw invalidArgument(`DNS forwarder port ${dnsPort} must be an integer in 1..65535`);
  }
  const upstreamTexts =
    input.dnsUpstreams ??
    env.FORKD_DNS_UPSTREAM?.split(",").filter((s) => s.trim() !== "") ??
    hostResolvers();
  return {
    bridge,
    subnet,
    bridgeAddress: fromUint32(toUint32(subnet.address) + 1),
    dnsPort,
    dnsUpstreams: upstreamTexts.map((text) => parseUpstream(text.trim())),
  };
}

/** The IPv4 `nameserver` lines of /etc/resolv.conf (the daemon runs in the host namespace, so a loopback stub resolver is reachable too). */
export function hostResolvers(file = "/etc/resolv.conf"): string[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return [];
  }
  return text
    .split("\n")
    .map((line) => /^\s*nameserver\s+(\S+)/.exec(line)?.[1])
    .filter((addr): addr is string => addr !== undefined && isIPv4(addr));
}

function parseUpstream(text: string): DnsUpstream {
  const [address, portText] = text.split(":");
  const port = portText === undefined ? 53 : Number(portText);
  if (address === undefined || !isIPv4(address) || !Number.isInteger(port) || port < 1 || port > 65535) {
    throw invalidArgument(
      `DNS upstream ${JSON.stringify(text)} must be an IPv4 address with an optional :port`,
    );
  }
  return { address, port };
}

/** The namespace address with index `i` (1 is the bridge; sandboxes get 2 .. size-2). */
export function subnetAddress(config: HostNetworkConfig, index: number): string {
  return fromUint32(toUint32(config.subnet.address) + index);
}

export function subnetHostCount(config: HostNetworkConfig): number {
  return 2 ** (32 - config.subnet.prefix);
}
