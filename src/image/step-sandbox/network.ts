/**
 * The network of a networked build step: a network namespace of its own behind a veth pair, routed and
 * masqueraded by the host, whose only reachable destinations are the machine's configured package indexes
 * (indexes.ts), each at the addresses its name resolves to on the host when the step starts and only on its
 * port. The step resolves those names through an /etc/hosts of its own (there is no DNS server to reach).
 * Everything else is dropped by the host before it is routed: the host's own addresses (its loopback and
 * every service it listens on), sandboxes' guest ports and bridges, the LAN, the rest of the internet.
 *
 * Names: namespace `forkd-build-<slot>`, host veth `fkb<slot>`, nft table `inet forkd_build_<slot>`; the slot
 * is claimed by creating the namespace (which fails if it exists) and gives the link its /30 of
 * FORKD_BUILD_SUBNET (default 10.44.0.0/16). A slot whose owner (recorded under /run/forkd/build-net) is dead is
 * swept by the next build that needs a slot, so a crashed build leaks nothing for long.
 */
import { lookup } from "node:dns/promises";
import fs from "node:fs/promises";
import { isIPv4 } from "node:net";
import path from "node:path";
import { errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import { identityJson, isAlive, parseIdentity, selfIdentity } from "../../common/processes.js";
import { run, runText } from "../run.js";
import { type IndexEndpoint, indexEndpoints, type PackageIndex } from "./indexes.js";

export const DEFAULT_BUILD_SUBNET = "10.44.0.0/16";
const OWNERS_DIR = "/run/forkd/build-net";
const NETNS_PREFIX = "forkd-build-";
const PEER_IFNAME = "eth0";
/** Addresses that are never a package index's (loopback, link-local, multicast, unspecified, reserved). */
const NEVER_REACHABLE = [/^0\./, /^127\./, /^169\.254\./, /^(22[4-9]|2[3-5]\d)\./];

export interface StepNetwork {
  /** /run/netns/<name>: the step's bwrap runs in it (userns.ts). */
  netnsPath: string;
  /** The step's /etc/hosts: every index name and the addresses it may reach. */
  hosts: string;
  /** What the step may reach, for messages ("pypi.org:443 (151.101.0.223)"). */
  reachable: string[];
  close(): Promise<void>;
}

interface Slot {
  index: number;
  netns: string;
  veth: string;
  table: string;
  hostAddress: string;
  stepAddress: string;
}

function subnetBase(env: NodeJS.ProcessEnv): { base: number; slots: number } {
  const text = env.FORKD_BUILD_SUBNET ?? DEFAULT_BUILD_SUBNET;
  const match = /^(\d+\.\d+\.\d+\.\d+)\/(\d+)$/.exec(text);
  const prefix = Number(match?.[2]);
  if (!match || !isIPv4(match[1] as string) || prefix < 8 || prefix > 28) {
    throw invalidArgument(`FORKD_BUILD_SUBNET must be an IPv4 block /8../28, got ${JSON.stringify(text)}`);
  }
  const base = toUint32(match[1] as string) & (prefix === 0 ? 0 : (~0 << (32 - prefix)) >>> 0);
  return { base: base >>> 0, slots: Math.min(4096, 2 ** (32 - prefix) / 4) };
}

function toUint32(ip: string): number {
  return ip.split(".").reduce((n, part) => n * 256 + Number(part), 0);
}

function fromUint32(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

function slotOf(index: number, base: number): Slot {
  const link = base + index * 4;
  return {
    index,
    netns: `${NETNS_PREFIX}${index}`,
    veth: `fkb${index}`,
    table: `forkd_build_${index}`,
    hostAddress: fromUint32(link + 1),
    stepAddress: fromUint32(link + 2),
  };
}

/** Resolves each endpoint's name on the host; names that resolve to nothing reachable are left out. */
async function resolveEndpoints(
  endpoints: readonly IndexEndpoint[],
): Promise<{ host: string; port: number; addresses: string[] }[]> {
  const out: { host: string; port: number; addresses: string[] }[] = [];
  for (const endpoint of endpoints) {
    const addresses = isIPv4(endpoint.host)
      ? [endpoint.host]
      : await lookup(endpoint.host, { all: true, family: 4 }).then(
          (found) => found.map((a) => a.address),
          () => [] as string[],
        );
    const usable = [...new Set(addresses)].filter((a) => !NEVER_REACHABLE.some((r) => r.test(a)));
    if (usable.length > 0) out.push({ ...endpoint, addresses: usable });
  }
  return out;
}

export function stepNetworkRules(
  slot: Pick<Slot, "veth" | "table" | "stepAddress">,
  allowed: readonly { port: number; addresses: readonly string[] }[],
): string {
  const elements = allowed.flatMap((a) => a.addresses.map((address) => `${address} . ${a.port}`));
  const set = elements.length > 0 ? `elements = { ${elements.join(", ")} }` : "";
  const veth = JSON.stringify(slot.veth);
  return `table inet ${slot.table} {}
delete table inet ${slot.table}
table inet ${slot.table} {
  set indexes {
    type ipv4_addr . inet_service
    ${set}
  }
  chain input {
    type filter hook input priority filter - 20; policy accept;
    iifname ${veth} ct state established,related accept
    iifname ${veth} ip daddr . tcp dport @indexes accept
    iifname ${veth} counter drop
  }
  chain forward {
    type filter hook forward priority filter - 20; policy accept;
    oifname ${veth} ct state established,related accept
    oifname ${veth} counter drop
    iifname ${veth} ip saddr != ${slot.stepAddress} counter drop
    iifname ${veth} ip daddr . tcp dport @indexes accept
    iifname ${veth} counter drop
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr ${slot.stepAddress} oifname != ${veth} masquerade
  }
}
`;
}

async function removeSlot(slot: Slot): Promise<void> {
  await run("ip", ["link", "del", slot.veth], { tailBytes: 0 }).catch(() => {});
  await run("ip", ["netns", "del", slot.netns], { tailBytes: 0 }).catch(() => {});
  await run("nft", ["-f", "-"], {
    input: `table inet ${slot.table} {}\ndelete table inet ${slot.table}\n`,
  }).catch(() => {});
  await fs.rm(path.join(OWNERS_DIR, String(slot.index)), { force: true });
}

/** Claims a free slot (sweeping one whose owner died), by creating its namespace. */
async function claimSlot(base: number, slots: number): Promise<Slot> {
  await fs.mkdir(OWNERS_DIR, { recursive: true, mode: 0o700 });
  const existing = new Set(await fs.readdir("/run/netns").catch(() => [] as string[]));
  const start = Math.floor(Math.random() * slots);
  for (let i = 0; i < slots; i++) {
    const slot = slotOf((start + i) % slots, base);
    if (existing.has(slot.netns)) {
      const owner = parseIdentity(
        await fs
          .readFile(path.join(OWNERS_DIR, String(slot.index)), "utf8")
          .then((t) => JSON.parse(t) as unknown)
          .catch(() => null),
      );
      // No owner recorded yet may be a build that is claiming it right now: leave it.
      if (owner === null || (await isAlive(owner))) continue;
      await removeSlot(slot);
    }
    const made = await run("ip", ["netns", "add", slot.netns], { tailBytes: 0 }).then(
      () => true,
      () => false,
    );
    if (!made) continue;
    await fs.writeFile(path.join(OWNERS_DIR, String(slot.index)), identityJson(selfIdentity()));
    return slot;
  }
  throw new ForkdError("unavailable", `no free build network slot in ${slots} (FORKD_BUILD_SUBNET)`);
}

/** Refuses a link whose addresses the host already routes somewhere (another network uses the block). */
async function checkUnrouted(slot: Slot): Promise<void> {
  const routes = await runText("ip", ["-4", "route", "show", "to", "match", slot.stepAddress]);
  const specific = routes.split("\n").filter((l) => l.trim() !== "" && !l.startsWith("default"));
  if (specific.length > 0) {
    throw new ForkdError(
      "unavailable",
      `the build network ${slot.hostAddress}/30 is already routed on this host (${specific[0]?.trim()}); ` +
        "choose another block with FORKD_BUILD_SUBNET",
    );
  }
}

/**
 * Makes a step network that reaches `indexes` only. The caller closes it (its namespace, veth and rules go);
 * a crash leaves it to the next build's sweep.
 */
export async function openStepNetwork(
  indexes: readonly PackageIndex[],
  env: NodeJS.ProcessEnv = process.env,
): Promise<StepNetwork> {
  const { base, slots } = subnetBase(env);
  const allowed = await resolveEndpoints(indexEndpoints(indexes));
  const slot = await claimSlot(base, slots);
  try {
    await checkUnrouted(slot);
    await run("ip", [
      "link",
      "add",
      slot.veth,
      "type",
      "veth",
      "peer",
      "name",
      PEER_IFNAME,
      "netns",
      slot.netns,
    ]);
    await run("ip", ["address", "add", `${slot.hostAddress}/30`, "dev", slot.veth]);
    await run("ip", ["link", "set", slot.veth, "up"]);
    const inside = (args: string[]) => run("ip", ["-n", slot.netns, ...args]);
    await inside(["link", "set", "lo", "up"]);
    await inside(["address", "add", `${slot.stepAddress}/30`, "dev", PEER_IFNAME]);
    await inside(["link", "set", PEER_IFNAME, "up"]);
    await inside(["route", "add", "default", "via", slot.hostAddress]);
    await run("nft", ["-f", "-"], {
      input: stepNetworkRules(slot, allowed),
      label: "nft (build step network)",
    });
    // The host routes the step's packets (as it routes sandboxes'): forwarding must be on.
    await fs.writeFile("/proc/sys/net/ipv4/ip_forward", "1");
  } catch (err) {
    await removeSlot(slot);
    throw new ForkdError("unavailable", `cannot set up the build step's network: ${errorMessage(err)}`, {
      cause: err,
    });
  }
  const hosts = [
    "127.0.0.1 localhost",
    ...allowed.flatMap((a) => (isIPv4(a.host) ? [] : a.addresses.map((address) => `${address} ${a.host}`))),
  ].join("\n");
  let closed: Promise<void> | undefined;
  return {
    netnsPath: `/run/netns/${slot.netns}`,
    hosts: `${hosts}\n`,
    reachable: allowed.map((a) => `${a.host}:${a.port} (${a.addresses.join(", ")})`),
    close: () => {
      closed ??= removeSlot(slot);
      return closed;
    },
  };
}
