/**
 * One sandbox's network: a named network namespace with the tap QEMU's NIC is attached to (the gateway, same
 * address and MAC in every namespace), a veth to the host bridge with the namespace's own address, and the
 * namespace's rules (nft.ts). Removing it removes all of that: the rules and the tap live in the namespace,
 * and deleting the veth's host end deletes its peer.
 */
import { access } from "node:fs/promises";
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
  const { config } = spec;
  try {
    await ipBatch([
      `netns add ${names.netns}`,
      `link add ${names.veth} type veth peer name ${UPLINK_IFNAME} netns ${names.netns}`,
      `link set dev ${names.veth} addrgenmode none master ${config.bridge}`,
      `link set dev ${names.veth} type bridge_slave isolated on`,
      `link set dev ${names.veth} up`,
    ]);
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
    await nftInNamespace(names.netns, namespaceRules(spec), NAMESPACE_SYSCTLS);
    return names;
  } catch (err) {
    await removeSandboxNetwork(spec.sandboxId).catch(() => {});
    throw err;
  }
}

/** Replaces the sandbox's egress policy; connections it no longer allows stop at their next packet. */
export async function applyEgressPolicy(spec: SandboxNetworkSpec): Promise<void> {
  await nftInNamespace(sandboxNetNames(spec.sandboxId).netns, egressRules(spec));
}

/** Makes `addresses` reachable from the sandbox for `seconds` (what its DNS forwarder answered). */
export async function allowResolvedAddresses(
  sandboxId: string,
  addresses: readonly string[],
  seconds: number,
): Promise<void> {
  if (addresses.length === 0) return;
  if (!addresses.every(isIPv4)) throw new ForkdError("internal", "allowResolvedAddresses: not IPv4");
  await nftInNamespace(sandboxNetNames(sandboxId).netns, dnsAllowRules(addresses, seconds));
}

/** Removes the namespace and the veth. Idempotent: what is already gone is skipped, so a retry is safe. */
export async function removeSandboxNetwork(sandboxId: string): Promise<void> {
  const names = sandboxNetNames(sandboxId);
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
