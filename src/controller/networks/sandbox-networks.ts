/**
 * Sandboxes' networks, as the daemon runs them: which mode the host allows, the host setup, one DNS forwarder,
 * and per sandbox a namespace (net/namespace.ts) recorded in SQLite before it is created and removed with the
 * sandbox (also after a daemon crash: `reconcile`).
 *
 * Modes:
 *   netns     (root, network namespaces, nftables): every sandbox gets its own namespace with an uplink,
 *             its egress policy, DNS through the forwarder, and inbound through the port proxy.
 *   isolated  (no root / no netns / no nftables): children still get their NIC (the restore invariant),
 *             attached to a tap in a private empty namespace, or to nothing; no traffic leaves, which is the one
 *             egress policy this mode can enforce ("deny"). QEMU's user networking is not used: it maps the
 *             gateway to the host's loopback, so it could not keep a guest off the host's services.
 */

import { randomInt } from "node:crypto";
import { crashPoint } from "../../common/crash-points.js";
import { conflict, errorMessage, ForkdError } from "../../common/errors.js";
import { GUEST_IP } from "../../common/guest-network.js";
import type { ForkdPaths } from "../../common/paths.js";
import { type LaunchPlan, launcherPrefix, privateNetnsUnavailable } from "../../isolation/launcher.js";
import {
  type HostNetworkConfig,
  type NetworkConfigInput,
  resolveNetworkConfig,
  subnetAddress,
  subnetHostCount,
} from "../../net/config.js";
import { DnsForwarder } from "../../net/dns-forwarder.js";
import { ensureHostNetwork } from "../../net/host.js";
import { netnsPath, sandboxNetNames, TAP_IFNAME } from "../../net/names.js";
import {
  allowResolvedAddresses,
  applyEgressPolicy,
  createSandboxNetwork,
  removeSandboxNetwork,
  sandboxNetworkComplete,
} from "../../net/namespace.js";
import { MIN_DNS_ALLOW_SECONDS } from "../../net/nft.js";
import {
  type CompiledPolicy,
  compilePolicy,
  DENY_ALL,
  type EgressDefault,
  type EgressPolicy,
  type EgressPolicyInput,
  parseEgressPolicy,
} from "../../net/policy.js";
import type { PortTarget } from "../../net/port-proxy.js";
import type { SandboxNetworkRow, StateDb } from "../../store/db.js";
import type { SnapshotManifest } from "../../store/manifest.js";
import { TAP_FD } from "../../vmm/qemu-args.js";

export type NetworkMode = "netns" | "isolated";

/** `input` checked, with each field it leaves out taken from `base`. */
export function completeEgress(input: EgressPolicyInput, base: EgressPolicyInput): EgressPolicy {
  if (typeof input !== "object" || input === null) return parseEgressPolicy(input);
  const given = Object.fromEntries(Object.entries(input).filter(([, value]) => value !== undefined));
  return parseEgressPolicy({ ...base, ...given });
}

/** The egress default a snapshot's template set (`[egress]`), checked again as any policy is; else undefined. */
export function templateEgressOf(manifest: SnapshotManifest): EgressPolicy | undefined {
  const recorded = manifest.template.egress;
  return recorded ? parseEgressPolicy(recorded, `snapshot ${manifest.tag}: template egress`) : undefined;
}

/**
 * A spawn's network: the default egress (undefined: its snapshot's template default, else the daemon's), a
 * policy, or "none" (a NIC with no uplink).
 */
export type NetworkRequest = EgressPolicyInput | "none" | undefined;

/** How a VM's NIC is attached: the backend and, for a tap, what the launcher does to open it. */
export interface NicAttachment {
  backend: "tap" | "none";
  launch?: LaunchPlan;
}

export interface SandboxNetworkInfo {
  /** netns: its own namespace with an uplink; private: a NIC that leads nowhere; none: no NIC. */
  kind: "netns" | "private" | "none";
  netns: string | null;
  /** The namespace's address on the bridge (what the port proxy connects to). */
  address: string | null;
  /** The guest's own address (the same in every sandbox); null without a NIC. */
  guestAddress: string | null;
  policy: EgressPolicy | null;
}

export interface SandboxNetworksOptions {
  network?: NetworkConfigInput;
  /** Egress of sandboxes whose spawn names no policy. Default "allow". */
  defaultEgress?: EgressDefault;
  log?: { info(obj: object, msg?: string): void; warn(obj: object, msg?: string): void };
}

interface Registered {
  sandboxId: string;
  policy: CompiledPolicy;
  /** Addresses already allowed through DNS, and until when (ms), to skip an nft run per repeated lookup. */
  allowed: Map<string, number>;
}

export class SandboxNetworks {
  private readonly byAddress = new Map<string, Registered>();
  private forwarder: DnsForwarder | undefined;

  private constructor(
    private readonly db: StateDb,
    readonly mode: NetworkMode,
    /** Why the mode is "isolated" (null in netns mode). */
    readonly reason: string | null,
    readonly config: HostNetworkConfig,
    readonly defaultEgress: EgressDefault,
    private readonly log: NonNullable<SandboxNetworksOptions["log"]>,
  ) {}

  /** Sets up the host (netns mode) or finds out why it cannot, and starts the DNS forwarder. */
  static async open(
    paths: ForkdPaths,
    db: StateDb,
    options: SandboxNetworksOptions = {},
  ): Promise<SandboxNetworks> {
    const log = options.log ?? { info: () => {}, warn: () => {} };
    const config = resolveNetworkConfig(options.network, process.env, paths.home);
    let reason = await netnsModeUnavailable();
    if (reason === null) {
      try {
        await ensureHostNetwork(config, paths.home);
      } catch (err) {
        // Another home's bridge or an overlapping subnet is a configuration error, not a missing feature.
        if (err instanceof ForkdError && err.code === "conflict") throw err;
        reason = `host network setup failed: ${errorMessage(err)}`;
      }
    }
    const mode: NetworkMode = reason === null ? "netns" : "isolated";
    const networks = new SandboxNetworks(db, mode, reason, config, options.defaultEgress ?? "allow", log);
    if (mode === "netns") {
      networks.forwarder = await DnsForwarder.start(config, {
        clientFor: (address) => networks.dnsClient(address),
        log,
      }).catch((err: unknown) => {
        throw new ForkdError(
          "unavailable",
          `cannot start the sandboxes' DNS forwarder on ${config.bridgeAddress}:${config.dnsPort}: ${errorMessage(err)}`,
        );
      });
      log.info(
        { bridge: config.bridge, subnet: `${config.subnet.address}/${config.subnet.prefix}` },
        "sandbox network ready",
      );
    } else {
      log.warn({ reason }, "sandbox networks are isolated (no egress): netns mode is unavailable");
    }
    return networks;
  }

  /**
   * The policy a spawn gets, checked against what this mode can enforce. `templateDefault` is its snapshot's
   * template egress (see completePolicy).
   */
  resolvePolicy(request: NetworkRequest, templateDefault?: EgressPolicy): EgressPolicy | "none" {
    if (request === "none") return "none";
    const policy = this.completePolicy(request ?? {}, templateDefault);
    if (this.mode === "isolated") {
      if (request === undefined) return "none";
      if (policy.default === "allow" || policy.allowOut.length > 0) {
        throw new ForkdError(
          "not_implemented",
          `egress other than "deny" needs network namespaces, and this host runs isolated sandboxes (${this.reason})`,
        );
      }
      return "none";
    }
    return policy;
  }

  /**
   * Records the network of a sandbox adopted from another node (its durable pause) with `policyJson` and a free
   * address here, as "creating": its resume builds it (reattach).
   */
  recordAdopted(sandboxId: string, policyJson: string): void {
    this.record(sandboxId, policyJson);
  }

  /** Records sandbox `sandboxId`'s network as "creating" with a free address of the subnet (returned), or throws. */
  private record(sandboxId: string, policyJson: string) {
    const names = sandboxNetNames(sandboxId);
    const address = this.db.insertNetwork(
      {
        sandbox_id: sandboxId,
        state: "creating",
        netns: names.netns,
        veth: names.veth,
        policy: policyJson,
        generation: 1,
      },
      this.addressCandidates(),
    );
    if (address === null) {
      throw new ForkdError(
        "unavailable",
        `no free address left in the sandbox subnet of ${this.config.bridge}`,
      );
    }
    return address;
  }

  /**
   * Creates sandbox `sandboxId`'s network for a snapshot whose NIC is `nic` (null: the snapshot has none) and
   * returns how its QEMU attaches the NIC. Recorded before anything is created.
   */
  async attach(
    sandboxId: string,
    request: EgressPolicy | "none",
    nic: { vnetHdr: boolean } | null,
  ): Promise<NicAttachment | undefined> {
    if (!nic) return undefined;
    if (request === "none") return privateNic(nic.vnetHdr);
    const names = sandboxNetNames(sandboxId);
    const address = this.record(sandboxId, JSON.stringify(request));
    const policy = compilePolicy(request);
    crashPoint("net.recorded");
    try {
      await createSandboxNetwork({ sandboxId, address, config: this.config, policy, generation: 1 });
    } catch (err) {
      this.db.deleteNetwork(sandboxId);
      throw err;
    }
    crashPoint("net.ruled");
    this.db.updateNetwork(sandboxId, { state: "ready" });
    this.register(sandboxId, address, policy);
    return tapIn(names.netns, nic.vnetHdr);
  }

  /**
   * A warm pool's VM gets its network before any spawn asks for it: its own namespace, veth and rules under its id
   * (the id of the sandbox it will become), recorded first like any, denying all egress and answering no DNS until
   * `claim` gives it its spawn's policy. A pooled VM that is never claimed loses it through `detach`.
   */
  async prepare(sandboxId: string, nic: { vnetHdr: boolean }): Promise<NicAttachment> {
    const attached = (await this.attach(sandboxId, DENY_ALL, nic)) as NicAttachment;
    this.release(sandboxId);
    return attached;
  }

  /**
   * A pooled VM's network becomes its spawn's: `policy` applied in one nft transaction (a new rules generation,
   * so nothing the pooled guest opened survives it), recorded, and the sandbox's DNS answered under it.
   */
  async claim(sandboxId: string, policy: EgressPolicy): Promise<void> {
    const row = this.db.network(sandboxId);
    if (row?.state !== "ready") {
      throw new ForkdError("internal", `pooled sandbox ${sandboxId} has no prepared network`);
    }
    await this.applyPolicy(row, policy);
  }

  /**
   * A paused sandbox's VM is gone: its namespace, address and policy stay (so its identity survives the pause)
   * but it answers no DNS until it runs again.
   */
  release(sandboxId: string): void {
    const row = this.db.network(sandboxId);
    if (row) this.byAddress.delete(row.address);
  }

  /**
   * The NIC of a sandbox that runs again after a pause: its own namespace, created again with the same address,
   * policy and rules generation when it is gone (a host reboot) or incomplete; a private one for "private".
   */
  async reattach(
    sandboxId: string,
    kind: "netns" | "private" | "none",
    nic: { vnetHdr: boolean } | null,
  ): Promise<NicAttachment | undefined> {
    if (!nic || kind === "none") return undefined;
    if (kind === "private") return privateNic(nic.vnetHdr);
    const row = this.db.network(sandboxId);
    if (!row) {
      throw conflict(`sandbox ${sandboxId} lost its network record; it cannot get its address back`);
    }
    if (this.mode !== "netns") {
      throw new ForkdError(
        "unavailable",
        `sandbox ${sandboxId} has a network namespace of its own, and this daemon runs isolated sandboxes (${this.reason})`,
      );
    }
    const policy = compilePolicy(JSON.parse(row.policy) as EgressPolicy);
    if (row.state !== "ready" || !(await sandboxNetworkComplete(sandboxId))) {
      this.db.updateNetwork(sandboxId, { state: "creating" });
      await removeSandboxNetwork(sandboxId);
      await createSandboxNetwork({
        sandboxId,
        address: row.address,
        config: this.config,
        policy,
        generation: row.generation,
      });
      this.db.updateNetwork(sandboxId, { state: "ready" });
      this.log.info({ id: sandboxId, address: row.address }, "recreated a paused sandbox's network");
    }
    this.register(sandboxId, row.address, policy);
    return tapIn(row.netns, nic.vnetHdr);
  }

  /** Removes everything of `sandboxId`'s network; idempotent (a no-op without a record). */
  async detach(sandboxId: string): Promise<void> {
    const row = this.db.network(sandboxId);
    if (!row) return;
    this.db.updateNetwork(sandboxId, { state: "removing" });
    this.byAddress.delete(row.address);
    await removeSandboxNetwork(sandboxId);
    this.db.deleteNetwork(sandboxId);
  }

  /** Replaces a running sandbox's egress policy (new connections, and established ones at their next packet). */
  async setPolicy(
    sandboxId: string,
    input: EgressPolicyInput,
    templateDefault?: EgressPolicy,
  ): Promise<EgressPolicy> {
    const row = this.db.network(sandboxId);
    if (row?.state !== "ready") {
      throw conflict(
        this.mode === "isolated"
          ? `sandbox ${sandboxId} is isolated (${this.reason}): its egress cannot be changed`
          : `sandbox ${sandboxId} has no network of its own (spawned with network "none" or from a snapshot without a NIC)`,
      );
    }
    const policy = this.completePolicy(input, templateDefault);
    await this.applyPolicy(row, policy);
    return policy;
  }

  /** Replaces the rules of `row`'s namespace with `policy` (the next generation), records and registers it. */
  private async applyPolicy(row: SandboxNetworkRow, policy: EgressPolicy): Promise<void> {
    const compiled = compilePolicy(policy);
    const generation = row.generation + 1;
    const sandboxId = row.sandbox_id;
    await applyEgressPolicy({
      sandboxId,
      address: row.address,
      config: this.config,
      policy: compiled,
      generation,
    });
    this.db.updateNetwork(sandboxId, { policy: JSON.stringify(policy), generation });
    this.register(sandboxId, row.address, compiled);
  }

  info(sandboxId: string, hasNic: boolean): SandboxNetworkInfo {
    const row = this.db.network(sandboxId);
    if (!row) {
      return {
        kind: hasNic ? "private" : "none",
        netns: null,
        address: null,
        guestAddress: hasNic ? GUEST_IP : null,
        policy: hasNic ? DENY_ALL : null,
      };
    }
    return {
      kind: "netns",
      netns: row.netns,
      address: row.address,
      guestAddress: GUEST_IP,
      policy: JSON.parse(row.policy) as EgressPolicy,
    };
  }

  /** Where the daemon connects to reach TCP port `port` of the sandbox's guest. */
  portTarget(sandboxId: string, port: number): PortTarget {
    const row = this.db.network(sandboxId);
    if (row?.state !== "ready") {
      throw conflict(
        `sandbox ${sandboxId} has no network the daemon can reach (network "none", or isolated mode)`,
      );
    }
    return { host: row.address, port };
  }

  /**
   * After a restart: sandboxes in `live` get their DNS registration back; the records of `paused` ones stay as
   * they are (resume recreates what a reboot removed); every other record's network is removed (whatever of it
   * exists) and the record deleted.
   */
  async reconcile(live: ReadonlySet<string>, paused: ReadonlySet<string> = new Set()): Promise<void> {
    for (const row of this.db.networks()) {
      if (live.has(row.sandbox_id) && row.state === "ready") {
        this.register(row.sandbox_id, row.address, compilePolicy(JSON.parse(row.policy) as EgressPolicy));
        continue;
      }
      if (paused.has(row.sandbox_id)) continue;
      await this.detach(row.sandbox_id).catch((err: unknown) =>
        this.log.warn({ id: row.sandbox_id, err: errorMessage(err) }, "could not remove a sandbox network"),
      );
    }
  }

  /** Stops the DNS forwarder. Namespaces stay: their sandboxes outlive the daemon. */
  async close(): Promise<void> {
    await this.forwarder?.close();
    this.forwarder = undefined;
    this.byAddress.clear();
  }

  /**
   * Checks `input`. A field it leaves out comes from the template's default policy when the snapshot has one;
   * else a missing `default` is the daemon's --egress and a missing list is empty.
   */
  completePolicy(input: EgressPolicyInput, templateDefault?: EgressPolicy): EgressPolicy {
    return completeEgress(input, templateDefault ?? { default: this.defaultEgress });
  }

  private register(sandboxId: string, address: string, policy: CompiledPolicy): void {
    this.byAddress.set(address, { sandboxId, policy, allowed: new Map() });
  }

  private dnsClient(address: string) {
    const entry = this.byAddress.get(address);
    if (!entry) return undefined;
    return {
      sandboxId: entry.sandboxId,
      policy: entry.policy,
      allow: async (addresses: string[], ttlSeconds: number) => {
        const now = Date.now();
        const seconds = Math.max(ttlSeconds, MIN_DNS_ALLOW_SECONDS);
        // Re-adding is only needed when an address would expire before half of the new TTL has passed.
        const needed = addresses.filter((a) => (entry.allowed.get(a) ?? 0) < now + (seconds * 1000) / 2);
        if (needed.length === 0) return;
        await allowResolvedAddresses(entry.sandboxId, needed, seconds);
        for (const a of needed) entry.allowed.set(a, now + seconds * 1000);
      },
    };
  }

  /** Random addresses of the subnet first (so a freed address is rarely reused at once), then all of them. */
  private *addressCandidates(): Generator<string> {
    const size = subnetHostCount(this.config);
    for (let i = 0; i < 32; i++) yield subnetAddress(this.config, randomInt(2, size - 1));
    for (let i = 2; i < size - 1; i++) yield subnetAddress(this.config, i);
  }
}

/** The tap of namespace `netns`, as the launcher opens it for QEMU. */
function tapIn(netns: string, vnetHdr: boolean): NicAttachment {
  return {
    backend: "tap",
    launch: { netns: { join: netnsPath(netns) }, tap: { name: TAP_IFNAME, fd: TAP_FD, vnetHdr } },
  };
}

/** A NIC that leads nowhere: a tap in a fresh namespace of QEMU's own, or no peer at all. */
export async function privateNic(vnetHdr: boolean): Promise<NicAttachment> {
  const unavailable = await privateNetnsUnavailable();
  if (unavailable === null) {
    return { backend: "tap", launch: { netns: "new", tap: { name: TAP_IFNAME, fd: TAP_FD, vnetHdr } } };
  }
  if (vnetHdr) {
    throw new ForkdError(
      "conflict",
      `this snapshot's NIC has offloads, which need a tap, and this host cannot open one (${unavailable}); ` +
        "take the snapshot on this host again",
    );
  }
  return { backend: "none" };
}

/** The launcher argv prefix that starts a VM with `nic` attached; `keepFds` are fds QEMU must inherit. */
export function nicLaunchPrefix(
  nic: NicAttachment | undefined,
  keepFds: readonly number[] = [],
): string[] | undefined {
  return nic?.launch ? launcherPrefix({ ...nic.launch, keepFds }) : undefined;
}

/** Why sandboxes cannot have namespaces of their own here (null when they can). */
async function netnsModeUnavailable(): Promise<string | null> {
  if (process.getuid?.() !== 0) return `running as uid ${process.getuid?.()}, not root`;
  return privateNetnsUnavailable();
}

export type { SandboxNetworkRow };
