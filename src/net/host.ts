/**
 * The host's part of sandbox networking, set up idempotently by the daemon at start: the bridge (owned by one
 * forkd home, recorded in its alias), its address, IPv4 forwarding, and the host rules (nft.ts). Nothing here is
 * per sandbox: sandboxes only add their veth to the bridge.
 */
import { createHash } from "node:crypto";
import { readdir, readFile, writeFile } from "node:fs/promises";
import { ForkdError } from "../common/errors.js";
import { ipBatch, nftHost, runTool } from "./commands.js";
import type { HostNetworkConfig } from "./config.js";
import { type Cidr, cidrsOverlap, formatCidr, parseCidr } from "./ipv4.js";
import { deleteHostRules, hostRules, hostTableName } from "./nft.js";

export interface HostNetworkState {
  bridgeExists: boolean;
  /** The forkd home that owns the bridge (its alias), if it is a forkd bridge. */
  owner: string | null;
  address: string | null;
  up: boolean;
  ipForward: boolean;
  rulesLoaded: boolean;
}

/** What identifies a daemon's bridge: a digest of its FORKD_HOME, in the bridge's alias. */
export function bridgeOwnerTag(home: string): string {
  return `forkd:${createHash("sha256").update(home).digest("hex").slice(0, 16)}`;
}

/** A fixed MAC for the bridge: without one it takes its ports' lowest MAC, which changes as sandboxes come and go. */
export function bridgeMac(config: HostNetworkConfig): string {
  const digest = createHash("sha256").update(`forkd-bridge:${config.bridge}`).digest();
  const bytes = [0x02, ...digest.subarray(0, 5)];
  return bytes.map((b) => b.toString(16).padStart(2, "0")).join(":");
}

interface IpLink {
  ifname: string;
  flags?: string[];
  /** From /sys/class/net/<name>/ifalias ("" when unset). */
  alias: string;
  /** Bridge ports (/sys/class/net/<name>/brif). */
  ports: string[];
  linkinfo?: { info_kind?: string };
  addr_info?: { family: string; local: string; prefixlen: number }[];
}

async function showLink(name: string): Promise<IpLink | null> {
  let link: Omit<IpLink, "alias" | "ports"> | undefined;
  try {
    const out = await runTool("ip", ["-j", "-d", "address", "show", "dev", name]);
    link = (JSON.parse(out) as IpLink[])[0];
  } catch (err) {
    if (/does not exist|Cannot find device/.test((err as Error).message)) return null;
    throw err;
  }
  if (!link) return null;
  const alias = (await readFile(`/sys/class/net/${name}/ifalias`, "utf8").catch(() => "")).trim();
  const ports = await readdir(`/sys/class/net/${name}/brif`).catch(() => [] as string[]);
  return { ...link, alias, ports };
}

export async function hostNetworkState(config: HostNetworkConfig): Promise<HostNetworkState> {
  const link = await showLink(config.bridge);
  const inet = link?.addr_info?.find((a) => a.family === "inet");
  const rules = await runTool("nft", ["list", "table", "inet", hostTableName(config)]).then(
    () => true,
    () => false,
  );
  return {
    bridgeExists: link !== null,
    owner: link?.alias || null,
    address: inet ? `${inet.local}/${inet.prefixlen}` : null,
    up: link?.flags?.includes("UP") ?? false,
    ipForward: (await readFile("/proc/sys/net/ipv4/ip_forward", "utf8").catch(() => "0")).trim() === "1",
    rulesLoaded: rules,
  };
}

/**
 * Makes the host ready for sandboxes of the daemon whose home is `home`. Safe to run again (each daemon start
 * does). Refuses a bridge another forkd home owns and a subnet another interface's routes overlap.
 */
export async function ensureHostNetwork(config: HostNetworkConfig, home: string): Promise<void> {
  const owner = bridgeOwnerTag(home);
  const existing = await showLink(config.bridge);
  // A bridge without an alias and without ports is one whose creator stopped before naming it: claim it.
  const unclaimed = existing?.alias === "" && existing.ports.length === 0;
  if (existing && (existing.linkinfo?.info_kind !== "bridge" || (existing.alias !== owner && !unclaimed))) {
    throw new ForkdError(
      "conflict",
      `interface ${config.bridge} exists and is not this forkd home's bridge (alias ${JSON.stringify(existing.alias)}, ` +
        `expected ${owner}); give this daemon another bridge (--net-bridge) and subnet (--net-subnet)`,
    );
  }
  if (!existing) {
    await checkSubnetIsFree(config);
    await runTool("ip", [
      "link",
      "add",
      "name",
      config.bridge,
      "address",
      bridgeMac(config),
      "type",
      "bridge",
      "stp_state",
      "0",
      "mcast_snooping",
      "0",
    ]);
  }
  if (existing?.alias !== owner) await runTool("ip", ["link", "set", "dev", config.bridge, "alias", owner]);
  await writeFile(`/proc/sys/net/ipv6/conf/${config.bridge}/disable_ipv6`, "1");
  await ipBatch([
    `address replace ${config.bridgeAddress}/${config.subnet.prefix} dev ${config.bridge}`,
    `link set dev ${config.bridge} up`,
  ]);
  await writeFile("/proc/sys/net/ipv4/ip_forward", "1");
  await nftHost(hostRules(config));
}

/** Removes the bridge and the host rules (tests; an operator retiring a daemon). Sandboxes must be gone first. */
export async function removeHostNetwork(config: HostNetworkConfig, home: string): Promise<void> {
  const link = await showLink(config.bridge);
  if (link && link.alias === bridgeOwnerTag(home)) await runTool("ip", ["link", "del", "dev", config.bridge]);
  await nftHost(deleteHostRules(config));
}

/** A route on another interface that overlaps the subnet would make sandbox addresses ambiguous. */
async function checkSubnetIsFree(config: HostNetworkConfig): Promise<void> {
  const routes = JSON.parse(await runTool("ip", ["-j", "route", "show", "table", "all"])) as {
    dst: string;
    dev?: string;
    type?: string;
  }[];
  for (const route of routes) {
    if (route.dev === config.bridge || route.dst === "default") continue;
    if (route.type && route.type !== "unicast") continue;
    const dst: Cidr | null = parseCidr(route.dst);
    if (dst && cidrsOverlap(dst, config.subnet)) {
      throw new ForkdError(
        "conflict",
        `the sandbox subnet ${formatCidr(config.subnet)} overlaps the route ${route.dst} on ${route.dev ?? "?"}; ` +
          "choose another one (--net-subnet)",
      );
    }
  }
}
