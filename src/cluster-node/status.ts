/**
 * What a node's ForkdNode status says, read from the daemon's services: its version, capacity and what is free
 * of it (sandboxes by the admission limit, memory by MemAvailable less the reserve, disk of its home), the
 * sandboxes alive, the snapshots it holds by registry digest, and its warm pools. Free memory and disk are
 * rounded (MEMORY_STEP_MIB, DISK_STEP_MIB), so that a status written "on change" changes when placement would
 * care, not on every page the host allocates.
 */
import { statfs } from "node:fs/promises";
import type { Condition, ForkdNodeStatus, HeldSnapshot, PoolLevel } from "../cluster/schemas.js";
import { FORKD_VERSION } from "../common/version.js";
import type { Services } from "../controller/tenancy/tenant-view.js";
import type { HeldDigests } from "./digests.js";

export const MEMORY_STEP_MIB = 64;
export const DISK_STEP_MIB = 1024;

export interface CapacityLimits {
  maxSandboxes: number;
  /** Host memory that must stay available after a spawn (the daemon's --memory-reserve-mib). */
  reserveMiB: number;
}

export interface PoolReport {
  tag: string;
  ready: number;
  target: number;
}

export interface NodeStatusSource {
  read(services: Services): Promise<ForkdNodeStatus>;
}

const floorTo = (value: number, step: number) => Math.max(0, Math.floor(value / step) * step);

/** The status of a daemon from its services, its admission limits, its home and its digest records. */
export function nodeStatusSource(options: {
  limits: CapacityLimits;
  home: string;
  digests: HeldDigests;
  pools?: () => PoolReport[];
}): NodeStatusSource {
  return {
    async read(services: Services): Promise<ForkdNodeStatus> {
      const host = await services.sandboxes.host();
      const alive = services.sandboxes.list().filter((s) => s.status !== "dead").length;
      const disk = await statfs(options.home);
      const diskTotalMiB = Math.floor((disk.blocks * disk.bsize) / (1024 * 1024));
      const diskFreeMiB = Math.floor((disk.bavail * disk.bsize) / (1024 * 1024));
      const memoryTotalMiB = Math.floor(host.mem_total_bytes / (1024 * 1024));
      const memoryFreeMiB = Math.floor(host.mem_available_bytes / (1024 * 1024)) - options.limits.reserveMiB;
      const { snapshots, digestOf } = await heldSnapshots(services, options.digests);
      const pools: PoolLevel[] = [];
      for (const pool of options.pools?.() ?? []) {
        const digest = digestOf.get(pool.tag);
        // A pool of a snapshot without a registry digest is this node's own business: placement cannot use it.
        if (digest) pools.push({ digest, ready: pool.ready, target: pool.target });
      }
      return {
        version: FORKD_VERSION,
        capacity: {
          sandboxes: options.limits.maxSandboxes,
          memoryMiB: memoryTotalMiB,
          vcpus: host.cpu_count,
          diskMiB: diskTotalMiB,
        },
        available: {
          sandboxes: Math.max(0, options.limits.maxSandboxes - alive),
          memoryMiB: floorTo(memoryFreeMiB, MEMORY_STEP_MIB),
          vcpus: host.cpu_count,
          diskMiB: floorTo(diskFreeMiB, DISK_STEP_MIB),
        },
        sandboxes: alive,
        snapshots,
        pools,
      };
    },
  };
}

/** Ready snapshots whose digest the node recorded (pulled or pushed), by digest; and each tag's digest. */
async function heldSnapshots(
  services: Services,
  digests: HeldDigests,
): Promise<{ snapshots: HeldSnapshot[]; digestOf: Map<string, string> }> {
  const list = await services.snapshots.list();
  await digests.prune(new Set(list.map((s) => s.tag)));
  const byDigest = new Map<string, HeldSnapshot>();
  const digestOf = new Map<string, string>();
  for (const snapshot of list) {
    if (snapshot.status !== "ready" || !snapshot.bootable) continue;
    const record = digests.of(snapshot.tag, snapshot.created_at_unix);
    if (!record) continue;
    digestOf.set(snapshot.tag, record.digest);
    if (byDigest.has(record.digest)) continue;
    byDigest.set(record.digest, {
      digest: record.digest,
      reference: record.reference,
      sizeMiB: Math.ceil(snapshot.disk_bytes / (1024 * 1024)),
    });
  }
  const snapshots = [...byDigest.values()].sort((a, b) => a.digest.localeCompare(b.digest));
  return { snapshots, digestOf };
}

/** The Ready condition of a node in `state`, true since `since` (or false). */
/** Where a node daemon is in its membership of the cluster (membership.ts moves it). */
export type MembershipState = "starting" | "serving" | "fencing" | "stopped";

export function readyCondition(state: MembershipState, since: string): Condition {
  const reasons: Record<MembershipState, [Condition["status"], string, string]> = {
    starting: ["False", "Starting", "the daemon is registering"],
    serving: ["True", "Serving", "the daemon takes cluster calls"],
    fencing: ["False", "Fencing", "the daemon is killing the sandboxes of an older epoch"],
    stopped: ["False", "Stopped", "the daemon stopped"],
  };
  const [status, reason, message] = reasons[state];
  return { type: "Ready", status, reason, message, lastTransitionTime: since };
}

/** What a status write compares ("written on change"): everything. */
export function statusKey(status: ForkdNodeStatus): string {
  return JSON.stringify(status);
}
