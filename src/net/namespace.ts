/**
 * One sandbox's network: a named network namespace with the tap QEMU's NIC is attached to (the gateway, same
 * address and MAC in every namespace), a veth to the host bridge with the namespace's own address, and the
 * namespace's rules (nft.ts). Removing it removes all of that: the rules and the tap live in the namespace,
 * and deleting the veth's host end deletes its peer.
 *
 * Two ways to do it, the same objects either way: the daemon's long-running helper forkd-netd (netlink, and one
 * nft process per rule transaction; the default), or the ip and nft tools (FORKD_NET_BACKEND=tools: three
 * processes per create, two per remove), kept so bench/network can measure both side by side.
 */

import { access } from "node:fs/promises";
import { crashPoint } from "../common/crash-points.js";
import { ForkdError } from "../common/errors.js";
import {
  GATEWAY_IP,
  GATEWAY_MAC,
  GUEST_IP,
  GUEST_MAC,
  GUEST_PREFIX_LENGTH,
} from "../common/guest-network.js";
import { ipBatch, nftInNamespace, runTool } from "./commands.js";
import type { HostNetworkConfig } from "./config.js";
import { isIPv4 } from "./ipv4.js";
import { netnsPath, type SandboxNetNames, sandboxNetNames, TAP_IFNAME, UPLINK_IFNAME } from "./names.js";
import { netd } from "./netd-client.js";
import { dnsAllowRules, egressRules, namespaceRules } from "./nft.js";
import type { CompiledPolicy } from "./policy.js";

/** Settings of every sandbox namespace: it routes, and it speaks no IPv6 (nothing would route it). */
export const NAMESPACE_SYSCTLS: Readonly<Record<string, number>> = {
  "net.ipv4.ip_forward": 1,
  "net.ipv6.conf.all.disable_ipv6": 1,
  "net.ipv6.conf.default.disable_ipv6": 1,
};

export interface SandboxNetworkSpec {
  sandboxId: string;
  /** The namespace's address on the bridge (allocated and recorded by the caller). */
  address: string;
  config: HostNetworkConfig;
  policy: CompiledPolicy;
  generation: number;
}

/** Creates everything (see the module comment). On failure, what was created is removed again. */
export async function createSandboxNetwork(spec: SandboxNetworkSpec): Promise<SandboxNetNames> {
  const names = sandboxNetNames(spec.sandboxId);
  if (!isIPv4(spec.address)) throw new ForkdError("internal", `bad namespace address ${spec.address}`);
  try {
    if (backend() === "netd") await createWithHelper(spec, names);
    else await createWithTools(spec, names);
    return names;
  } catch (err) {
    await removeSandboxNetwork(spec.sandboxId).catch(() => {});
    throw err;
  }
}

/** Which way networks are made: `FORKD_NET_BACKEND`, read at each call ("netd", the default, or "tools"). */
export function backend(env: NodeJS.ProcessEnv = process.env): "netd" | "tools" {
  const value = env.FORKD_NET_BACKEND ?? "netd";
  if (value !== "netd" && value !== "tools")
    throw new ForkdError("invalid_argument", `FORKD_NET_BACKEND=${value}: expected netd or tools`);
  return value;
}

async function createWithHelper(spec: SandboxNetworkSpec, names: SandboxNetNames): Promise<void> {
  const { config } = spec;
  const helper = netd();
  await helper.request({
    op: "link",
    netns: names.netns,
    veth: names.veth,
    peer: UPLINK_IFNAME,
    bridge: config.bridge,
  });
  crashPoint("net.linked");
  await helper.request({
    op: "configure",
    netns: names.netns,
    sysctls: sysctlPairs(NAMESPACE_SYSCTLS),
    tap: TAP_IFNAME,
    tapMac: GATEWAY_MAC,
    tapAddress: `${GATEWAY_IP}/${GUEST_PREFIX_LENGTH}`,
    guestIp: GUEST_IP,
    guestMac: GUEST_MAC,
    uplink: UPLINK_IFNAME,
    uplinkAddress: `${spec.address}/${config.subnet.prefix}`,
    defaultGateway: config.bridgeAddress,
  });
  crashPoint("net.configured");
  await helper.request({ op: "rules", netns: names.netns, script: namespaceRules(spec) });
}

async function createWithTools(spec: SandboxNetworkSpec, names: SandboxNetNames): Promise<void> {
  const { config } = spec;
  await ipBatch([
    `netns add ${names.netns}`,
    `link add ${names.veth} type veth peer name ${UPLINK_IFNAME} netns ${names.netns}`,
    `link set dev ${names.veth} addrgenmode none master ${config.bridge}`,
    `link set dev ${names.veth} type bridge_slave isolated on`,
    `link set dev ${names.veth} up`,
  ]);
  crashPoint("net.linked");
  await ipBatch(
    [
      "link set dev lo up",
      `tuntap add dev ${TAP_IFNAME} mode tap`,
      `link set dev ${TAP_IFNAME} address ${GATEWAY_MAC} addrgenmode none`,
      `address add ${GATEWAY_IP}/${GUEST_PREFIX_LENGTH} dev ${TAP_IFNAME}`,
      `link set dev ${TAP_IFNAME} up`,
      `neighbour replace ${GUEST_IP} lladdr ${GUEST_MAC} dev ${TAP_IFNAME} nud permanent`,
      `link set dev ${UPLINK_IFNAME} addrgenmode none`,
      `address add ${spec.address}/${config.subnet.prefix} dev ${UPLINK_IFNAME}`,
      `link set dev ${UPLINK_IFNAME} up`,
      `route add default via ${config.bridgeAddress} dev ${UPLINK_IFNAME}`,
    ],
    names.netns,
  );
  crashPoint("net.configured");
  await nftInNamespace(names.netns, namespaceRules(spec), NAMESPACE_SYSCTLS);
}

/** Applies an nft script inside the sandbox's namespace (one transaction), the configured way. */
function nftIn(netns: string, script: string): Promise<unknown> {
  return backend() === "netd"
    ? netd().request({ op: "rules", netns, script })
    : nftInNamespace(netns, script);
}

function sysctlPairs(sysctls: Readonly<Record<string, string | number>>): [string, string][] {
  return Object.entries(sysctls).map(([k, v]) => [k, String(v)]);
}

/** Replaces the sandbox's egress policy; connections it no longer allows stop at their next packet. */
export async function applyEgressPolicy(spec: SandboxNetworkSpec): Promise<void> {
  await nftIn(sandboxNetNames(spec.sandboxId).netns, egressRules(spec));
}

/** Makes `addresses` reachable from the sandbox for `seconds` (what its DNS forwarder answered). */
export async function allowResolvedAddresses(
  sandboxId: string,
  addresses: readonly string[],
  seconds: number,
): Promise<void> {
  if (addresses.length === 0) return;
  if (!addresses.every(isIPv4)) throw new ForkdError("internal", "allowResolvedAddresses: not IPv4");
  await nftIn(sandboxNetNames(sandboxId).netns, dnsAllowRules(addresses, seconds));
}

/** Removes the namespace and the veth. Idempotent: what is already gone is skipped, so a retry is safe. */
export async function removeSandboxNetwork(sandboxId: string): Promise<void> {
  const names = sandboxNetNames(sandboxId);
  if (backend() === "netd") {
    await netd().request({ op: "remove", netns: names.netns, veth: names.veth });
    return;
  }
  if (await exists(`/sys/class/net/${names.veth}`)) {
    await runTool("ip", ["link", "del", "dev", names.veth]).catch(ignoreMissing);
  }
  if (await exists(netnsPath(names.netns))) {
    await runTool("ip", ["netns", "del", names.netns]).catch(ignoreMissing);
  }
}

/** Whether any of the sandbox's network objects still exist on the host (for reconciliation and tests). */
export async function sandboxNetworkExists(sandboxId: string): Promise<boolean> {
  const names = sandboxNetNames(sandboxId);
  return (await exists(`/sys/class/net/${names.veth}`)) || (await exists(netnsPath(names.netns)));
}

/** Whether the namespace and its veth both exist (a sandbox paused across a host reboot has neither). */
export async function sandboxNetworkComplete(sandboxId: string): Promise<boolean> {
  const names = sandboxNetNames(sandboxId);
  return (await exists(`/sys/class/net/${names.veth}`)) && (await exists(netnsPath(names.netns)));
}

function ignoreMissing(err: unknown): void {
  if (!/Cannot find device|No such file|does not exist|Invalid argument/.test((err as Error).message))
    throw err;
}

function exists(file: string): Promise<boolean> {
  return access(file).then(
    () => true,
    () => false,
  );
}
