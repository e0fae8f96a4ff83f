/**
 * nftables rule sets, rendered from validated values only (addresses from ipv4.ts, interface names from
 * names.ts/config.ts, integers), never from caller text. Each script is applied with `nft -f -` as one
 * transaction: it either takes effect whole or not at all.
 *
 * Where things are enforced:
 *   host (table inet forkd_<bridge>): sandboxes reach no host address but the DNS forwarder, nothing from
 *     outside reaches the bridge except replies, bridge-to-bridge routing is dropped (siblings), local non-root
 *     users cannot send to sandbox addresses, and sandbox traffic is masqueraded out of whatever interface the
 *     host routes it to.
 *   each sandbox's namespace (tables netdev forkd_guest and inet forkd, gone with the namespace): only the
 *     guest's own MAC and IPv4 address leave the tap (anti-spoofing), DNS goes to the daemon's forwarder, the
 *     guest's traffic leaves SNATed to the namespace's address, and the egress policy decides every new
 *     connection (and re-decides established ones after a policy change).
 */
import { GATEWAY_IP, GUEST_IP, GUEST_MAC, GUEST_PREFIX_LENGTH } from "../common/guest-network.js";
import type { HostNetworkConfig } from "./config.js";
import { type Cidr, formatCidr } from "./ipv4.js";
import { TAP_IFNAME, UPLINK_IFNAME } from "./names.js";
import type { CompiledPolicy } from "./policy.js";

export const NS_TABLE = "forkd";
export const NS_GUEST_TABLE = "forkd_guest";

/** Destinations no policy can open: the sandbox networks themselves, loopback, link-local, multicast, reserved. */
export const ALWAYS_DENIED = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"];

/** Shortest time an address answered for an allowed name stays reachable (the connect follows the answer). */
export const MIN_DNS_ALLOW_SECONDS = 30;
/** Longest (an answer may carry a TTL of days; the guest asks again long before). */
export const MAX_DNS_ALLOW_SECONDS = 24 * 3600;

export function hostTableName(config: HostNetworkConfig): string {
  return `forkd_${config.bridge}`;
}

/** The host's rules for one bridge; replaces the previous version of the table in one transaction. */
export function hostRules(config: HostNetworkConfig): string {
  const table = hostTableName(config);
  const br = quote(config.bridge);
  const subnet = formatCidr(config.subnet);
  const dns = `ip daddr ${config.bridgeAddress} meta l4proto { tcp, udp } th dport ${config.dnsPort}`;
  return `table inet ${table} {}
delete table inet ${table}
table inet ${table} {
  chain input {
    type filter hook input priority filter - 10; policy accept;
    iifname ${br} ct state established,related accept
    iifname ${br} ${dns} accept
    iifname ${br} counter reject with icmpx type admin-prohibited
  }
  chain forward {
    type filter hook forward priority filter - 10; policy accept;
    iifname ${br} oifname ${br} counter drop
    iifname ${br} tcp flags syn / syn,rst tcp option maxseg size set rt mtu
    oifname ${br} tcp flags syn / syn,rst tcp option maxseg size set rt mtu
    oifname ${br} ct state established,related accept
    oifname ${br} counter drop
    iifname ${br} ip saddr != ${subnet} counter drop
    iifname ${br} ip daddr { ${ALWAYS_DENIED.join(", ")} } counter drop
    iifname ${br} meta nfproto ipv6 counter drop
  }
  chain output {
    type filter hook output priority filter - 10; policy accept;
    oifname ${br} meta skuid != 0 counter reject with icmpx type admin-prohibited
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr ${subnet} oifname != ${br} masquerade
  }
}
`;
}

export function deleteHostRules(config: HostNetworkConfig): string {
  const table = hostTableName(config);
  return `table inet ${table} {}\ndelete table inet ${table}\n`;
}

export interface NamespaceRuleInput {
  config: HostNetworkConfig;
  /** This namespace's address on the bridge. */
  address: string;
  policy: CompiledPolicy;
  /** Bumped at every policy change; connections accepted under an older one are decided again. */
  generation: number;
}

/** The whole rule set of a new sandbox namespace. */
export function namespaceRules(input: NamespaceRuleInput): string {
  const { config, address } = input;
  const tap = quote(TAP_IFNAME);
  const up = quote(UPLINK_IFNAME);
  const guestNet = `${GATEWAY_IP.replace(/\.\d+$/, ".0")}/${GUEST_PREFIX_LENGTH}`;
  return `table netdev ${NS_GUEST_TABLE} {
  chain from_guest {
    type filter hook ingress device ${tap} priority -500; policy drop;
    ether saddr ${GUEST_MAC} ether type ip ip saddr ${GUEST_IP} accept
    ether saddr ${GUEST_MAC} ether type arp arp htype 1 arp ptype ip arp saddr ether ${GUEST_MAC} arp saddr ip ${GUEST_IP} accept
  }
}
table inet ${NS_TABLE} {
  set always_denied {
    type ipv4_addr; flags interval; auto-merge;
    elements = { ${[...ALWAYS_DENIED, formatCidr(config.subnet), guestNet].join(", ")} }
  }
  set allow_nets { type ipv4_addr; flags interval; auto-merge; }
  set deny_nets { type ipv4_addr; flags interval; auto-merge; }
  set allow_dns { type ipv4_addr; flags timeout; }
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname ${tap} ip daddr ${GATEWAY_IP} meta l4proto { tcp, udp } th dport 53 dnat ip to ${config.bridgeAddress}:${config.dnsPort}
    iifname ${up} ip saddr ${config.bridgeAddress} ip daddr ${address} meta l4proto tcp dnat ip to ${GUEST_IP}
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname ${up} snat ip to ${address}
  }
  chain input {
    type filter hook input priority filter; policy drop;
    iifname "lo" accept
    ct state established,related accept
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    iifname ${tap} oifname ${up} jump egress
    iifname ${up} oifname ${tap} ct state established,related accept
    iifname ${up} oifname ${tap} ct state new ct status dnat ip saddr ${config.bridgeAddress} accept
  }
  chain egress {
  }
}
${egressRules(input)}`;
}

/** Replaces the egress decision (sets and chain) of a running namespace; one transaction. */
export function egressRules(input: NamespaceRuleInput): string {
  const { config, policy, generation } = input;
  const t = `inet ${NS_TABLE}`;
  const mark = generation >>> 0;
  const verdict = `ct mark set ${mark} accept`;
  const reject = "reject with icmp type admin-prohibited";
  const lines = [
    `flush set ${t} allow_nets`,
    `flush set ${t} deny_nets`,
    `flush set ${t} allow_dns`,
    ...elements(`${t} allow_nets`, policy.allowNets),
    ...elements(`${t} deny_nets`, policy.denyNets),
    `flush chain ${t} egress`,
    // Replies on connections the daemon opened into the guest (its port proxy) are not egress.
    `add rule ${t} egress ct direction reply accept`,
    `add rule ${t} egress ct state established,related ct mark ${mark} accept`,
    `add rule ${t} egress ip daddr ${config.bridgeAddress} meta l4proto { tcp, udp } th dport ${config.dnsPort} ${verdict}`,
    `add rule ${t} egress ip daddr @always_denied counter ${reject}`,
    `add rule ${t} egress ip daddr @allow_nets ${verdict}`,
    `add rule ${t} egress ip daddr @allow_dns ${verdict}`,
    `add rule ${t} egress ip daddr @deny_nets counter ${reject}`,
    policy.default === "allow" ? `add rule ${t} egress ${verdict}` : `add rule ${t} egress counter ${reject}`,
  ];
  return `${lines.join("\n")}\n`;
}

/** Makes `addresses` reachable for `seconds` (refreshing the timeout of those already in the set). */
export function dnsAllowRules(addresses: readonly string[], seconds: number): string {
  const t = `inet ${NS_TABLE}`;
  const timeout = Math.min(MAX_DNS_ALLOW_SECONDS, Math.max(MIN_DNS_ALLOW_SECONDS, Math.round(seconds)));
  const list = addresses.join(", ");
  // add (a no-op if present) + delete + add: the element ends up with the new timeout whether or not it was
  // there, without the transaction failing on either case.
  return `add element ${t} allow_dns { ${list} }\ndelete element ${t} allow_dns { ${list} }\nadd element ${t} allow_dns { ${addresses
    .map((a) => `${a} timeout ${timeout}s`)
    .join(", ")} }\n`;
}

function elements(set: string, nets: readonly Cidr[]): string[] {
  return nets.length === 0 ? [] : [`add element ${set} { ${nets.map(formatCidr).join(", ")} }`];
}

function quote(ifname: string): string {
  return `"${ifname}"`;
}
