/**
 * The local cluster's network: a bridge on the host (its "node network") with the host's address on it, and one
 * network namespace per node daemon with a veth to the bridge and an address of its own, as nodes of a cluster
 * each have theirs. The API server and the registry listen on the host's bridge address, so the nodes reach
 * them; the gateway reaches each node at its address. Names carry an id of the cluster's directory, so two
 * local clusters on one machine never touch each other's links. A node's link can be cut and restored (a
 * network partition for the fault tests).
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface ClusterNetwork {
  id: string;
  bridge: string;
  /** e.g. "10.251.37" */
  prefix: string;
  hostAddress: string;
}

export interface NodeNetwork {
  netns: string;
  /** The veth's host end (on the bridge). */
  hostVeth: string;
  address: string;
}

async function ip(args: string[]): Promise<string> {
  const { stdout } = await run("ip", args, { encoding: "utf8" });
  return stdout;
}

/** The /24s already on this host's interfaces ("10.251.37" for 10.251.37.1/24). */
async function usedPrefixes(): Promise<Set<string>> {
  const out = await ip(["-j", "-4", "addr", "show"]);
  const used = new Set<string>();
  for (const link of JSON.parse(out) as { addr_info?: { local?: string }[] }[]) {
    for (const addr of link.addr_info ?? []) {
      if (addr.local) used.add(addr.local.split(".").slice(0, 3).join("."));
    }
  }
  return used;
}

/** The network of the cluster whose directory is `dir`: its id and a free /24 in 10.251.0.0/16. */
export async function planNetwork(dir: string): Promise<ClusterNetwork> {
  const id = createHash("sha256").update(dir).digest("hex").slice(0, 4);
  const used = await usedPrefixes();
  const start = Number.parseInt(id, 16) % 200;
  for (let i = 0; i < 200; i++) {
    const prefix = `10.251.${20 + ((start + i) % 200)}`;
    if (!used.has(prefix)) return { id, bridge: `fdlc${id}`, prefix, hostAddress: `${prefix}.1` };
  }
  throw new Error("no free /24 in 10.251.0.0/16 for the local cluster's bridge");
}

export async function createBridge(net: ClusterNetwork): Promise<void> {
  await ip(["link", "add", net.bridge, "type", "bridge"]);
  await ip(["addr", "add", `${net.hostAddress}/24`, "dev", net.bridge]);
  await ip(["link", "set", net.bridge, "up"]);
}

export function nodeNetwork(net: ClusterNetwork, index: number): NodeNetwork {
  return {
    netns: `fdlc${net.id}-n${index}`,
    hostVeth: `fdlc${net.id}v${index}`,
    address: `${net.prefix}.${10 + index}`,
  };
}

export async function createNodeNetwork(net: ClusterNetwork, node: NodeNetwork): Promise<void> {
  await ip(["netns", "add", node.netns]);
  await ip(["link", "add", node.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", node.netns]);
  await ip(["link", "set", node.hostVeth, "master", net.bridge, "up"]);
  await ip(["-n", node.netns, "link", "set", "lo", "up"]);
  await ip(["-n", node.netns, "addr", "add", `${node.address}/24`, "dev", "eth0"]);
  await ip(["-n", node.netns, "link", "set", "eth0", "up"]);
  await ip(["-n", node.netns, "route", "add", "default", "via", net.hostAddress]);
}

/** Cuts (down) or restores (up) a node's link to the rest of the cluster. */
export async function setNodeLink(node: NodeNetwork, up: boolean): Promise<void> {
  await ip(["link", "set", node.hostVeth, up ? "up" : "down"]);
}

/** Pids of the processes in a node's namespace. */
export async function pidsInNamespace(netns: string): Promise<number[]> {
  const out = await ip(["netns", "pids", netns]).catch(() => "");
  return out
    .split(/\s+/)
    .filter((p) => /^\d+$/.test(p))
    .map(Number);
}

export async function deleteNodeNetwork(node: NodeNetwork): Promise<void> {
  await ip(["link", "del", node.hostVeth]).catch(() => {});
  await ip(["netns", "del", node.netns]).catch(() => {});
}

export async function deleteBridge(net: ClusterNetwork): Promise<void> {
  await ip(["link", "del", net.bridge]).catch(() => {});
}

/** Whether anything of the cluster's network is still on the host (down checks it left nothing). */
export async function leftovers(net: ClusterNetwork): Promise<string[]> {
  const links = JSON.parse(await ip(["-j", "link", "show"])) as { ifname: string }[];
  const namespaces = (await ip(["netns", "list"])).split("\n").map((l) => l.split(" ")[0] ?? "");
  return [
    ...links.map((l) => l.ifname).filter((n) => n.startsWith(`fdlc${net.id}`)),
    ...namespaces.filter((n) => n.startsWith(`fdlc${net.id}-`)),
  ];
}
