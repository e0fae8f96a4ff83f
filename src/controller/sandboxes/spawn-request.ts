/**
 * A spawn request checked and resolved against the daemon, before anything is created: its settings validated,
 * host capacity reserved for its children, its snapshot, network policy and limits looked up, and the record
 * every child of it shares. spawn-children.ts starts the children from that.
 */

import path from "node:path";
import { conflict, invalidArgument } from "../../common/errors.js";
import { MAX_SANDBOX_TIMEOUT_MS } from "../../common/limits.js";
import { assertTag } from "../../common/names.js";
import { type CgroupLayout, sandboxCgroupDirs } from "../../isolation/cgroup.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import type { EgressPolicy } from "../../net/policy.js";
import type { SandboxRow } from "../../store/db.js";
import type { SnapshotManifest } from "../../store/manifest.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import { newSandboxId } from "../machines/ids.js";
import { type SandboxNetworks, templateEgressOf } from "../networks/sandbox-networks.js";
import type { SpawnRequest } from "../sandbox-service.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { Admission, Reservation } from "./admission.js";
import { validateChildCount } from "./fork-children.js";
import { resolveLimits, type SandboxLimits, validateLimitsRequest } from "./limits.js";
import { validateOnTimeout } from "./paused-state.js";
import {
  newAccessToken,
  validateEnvVars,
  validateInbound,
  validateMetadata,
  validateOwnNamespace,
} from "./settings.js";

/** The columns of a sandbox's record that every child of one spawn has in common. */
export type SharedColumns = Pick<
  SandboxRow,
  | "snapshot_tag"
  | "accelerator"
  | "memory_limit_mib"
  | "live_fork"
  | "limits"
  | "metadata"
  | "env_vars"
  | "template_alias"
  | "network"
  | "timeout_ms"
  | "on_timeout"
  | "auto_resume"
  | "inbound"
  | "owner"
  | "auto_pause_memory"
>;

/** A spawn request as the daemon will carry it out. */
export interface ResolvedSpawn {
  tag: string;
  n: number;
  /** The children's lifetime from the moment they run, in ms; 0 = none. */
  timeoutMs: number;
  liveFork: boolean;
  signal?: AbortSignal;
  snapshot: StoredSnapshot;
  /** The snapshot's NIC; null when it has none. */
  snapshotNic: NonNullable<SnapshotManifest["machine"]["nic"]> | null;
  network: EgressPolicy | "none";
  limits: SandboxLimits;
  /**
   * Whether prestarted VMs may serve it: a pooled VM maps the snapshot's disk image, so not for live_fork (a pool
   * serves a spawn with a network of its own only with VMs that have one prepared: warm-pool.ts).
   */
  poolable: boolean;
  shared: SharedColumns;
  /** Gives back the host capacity reserved for the spawn, once it has ended either way. */
  release(): void;
}

/** What resolving a spawn reads of the daemon. */
export interface SpawnRequestContext {
  snapshots: Pick<DaemonSnapshots, "bootable">;
  networks: Pick<SandboxNetworks, "resolvePolicy" | "mode" | "reason">;
  admission: Pick<Admission, "reserveSpawn" | "reserveMemory">;
  cgroups: CgroupLayout | null;
  confinement: ConfinementConfig;
  /** Lifetime of a sandbox whose spawn names none, in ms; 0 = none. */
  defaultTimeoutMs: number;
  /** Cap on each sandbox's writable disk layer unless its spawn names one. */
  diskLimitMiB: number;
}

/** The request's own settings, checked (bad input is refused before anything is reserved). */
interface SpawnSettings {
  tag: string;
  n: number;
  timeoutMs: number;
  metadata: string;
  envVars: string;
  onTimeout: SandboxRow["on_timeout"];
  inbound: string;
}

function validateSpawnSettings(request: SpawnRequest, defaultTimeoutMs: number): SpawnSettings {
  const tag = assertTag(request.snapshotTag, "snapshot_tag");
  const n = validateChildCount(request.n);
  validateLimitsRequest(request);
  const timeoutMs = request.timeoutMs ?? defaultTimeoutMs;
  if (!isIntIn(timeoutMs, 0, MAX_SANDBOX_TIMEOUT_MS)) {
    throw invalidArgument(`timeout_ms must be an integer in 0..${MAX_SANDBOX_TIMEOUT_MS}`);
  }
  const metadata = JSON.stringify(validateMetadata(request.metadata));
  const envVars = JSON.stringify(validateEnvVars(request.env));
  const onTimeout = validateOnTimeout(request.onTimeout);
  if (request.autoResume === true && onTimeout !== "pause") {
    throw invalidArgument('auto_resume needs on_timeout "pause" (only a paused sandbox can be resumed)');
  }
  if (request.autoPauseMemory === false && request.autoResume === true) {
    throw invalidArgument(
      "auto_resume cannot resume a sandbox paused without memory (autoPauseMemory false)",
    );
  }
  const inbound = JSON.stringify(validateInbound(request.inbound));
  return { tag, n, timeoutMs, metadata, envVars, onTimeout, inbound };
}

/**
 * Validates `request` and reserves host capacity for it (released on failure here, else by `release`), then
 * looks up what its children are restored from and with.
 */
export async function resolveSpawn(ctx: SpawnRequestContext, request: SpawnRequest): Promise<ResolvedSpawn> {
  validateOwnNamespace(request, ctx.networks);
  const settings = validateSpawnSettings(request, ctx.defaultTimeoutMs);
  // Reserved before the first await: concurrent spawns each see the others' children (admission.ts).
  const reservations: Reservation[] = [ctx.admission.reserveSpawn(settings.n)];
  const release = () => {
    for (const r of reservations) r.release();
  };
  try {
    const snapshot = await ctx.snapshots.bootable(settings.tag);
    const snapshotNic = snapshot.manifest.machine.nic ?? null;
    if (!snapshotNic && request.network !== undefined && request.network !== "none") {
      throw conflict(
        `snapshot ${settings.tag} has no NIC (its template says network = "none"), so its sandboxes cannot have a network policy`,
      );
    }
    const network = ctx.networks.resolvePolicy(request.network, templateEgressOf(snapshot.manifest));
    const limits = resolveLimits(request, {
      layout: ctx.cgroups,
      diskCap: ctx.confinement.mode === "on",
      defaultDiskMiB: ctx.diskLimitMiB,
      ramMiB: snapshot.manifest.machine.memoryMiB,
      vcpus: snapshot.manifest.machine.vcpus,
    });
    // live_fork may copy the RAM image to tmpfs first: host memory that is gone before any child starts.
    if (request.liveFork === true) {
      const ramMiB = snapshot.manifest.memory.ramBytes / 2 ** 20;
      reservations.push(ctx.admission.reserveMemory(ramMiB, "a tmpfs copy of the RAM image (live_fork)"));
    }
    const networkKind = !snapshotNic ? "none" : network === "none" ? "private" : "netns";
    const shared = sharedColumns(request, settings, snapshot, { limits, networkKind });
    const liveFork = request.liveFork === true;
    const poolable = !liveFork;
    const { tag, n, timeoutMs } = settings;
    return {
      tag,
      n,
      timeoutMs,
      liveFork,
      signal: request.signal,
      snapshot,
      snapshotNic,
      network,
      limits,
      poolable,
      shared,
      release,
    };
  } catch (err) {
    release();
    throw err;
  }
}

function sharedColumns(
  request: SpawnRequest,
  settings: SpawnSettings,
  snapshot: StoredSnapshot,
  resolved: { limits: SandboxLimits; networkKind: SandboxRow["network"] },
): SharedColumns {
  return {
    snapshot_tag: settings.tag,
    accelerator: snapshot.manifest.machine.accel,
    memory_limit_mib: request.memoryLimitMiB ?? null,
    live_fork: request.liveFork === true ? 1 : 0,
    limits: JSON.stringify(resolved.limits),
    metadata: settings.metadata,
    env_vars: settings.envVars,
    template_alias: request.templateAlias ?? null,
    network: resolved.networkKind,
    timeout_ms: settings.timeoutMs === 0 ? null : settings.timeoutMs,
    on_timeout: settings.onTimeout,
    auto_resume: request.autoResume === true ? 1 : 0,
    inbound: settings.inbound,
    owner: request.owner ?? null,
    auto_pause_memory: request.autoPauseMemory === false ? 0 : 1,
  };
}

/**
 * The records of a spawn's children, all "starting": the first ones under the ids of the pooled VMs they will
 * take (`pooledIds`), the rest under new ids.
 */
export function spawnRows(
  spawn: ResolvedSpawn,
  pooledIds: readonly string[],
  host: { runDir: string; cgroups: CgroupLayout | null },
): SandboxRow[] {
  return Array.from({ length: spawn.n }, (_, index): SandboxRow => {
    const id = pooledIds[index] ?? newSandboxId();
    return {
      ...spawn.shared,
      id,
      status: "starting",
      pid: null,
      pid_start_time: null,
      run_dir: path.join(host.runDir, id),
      created_at_unix: Math.floor(Date.now() / 1000),
      expires_at_unix_ms: null,
      memory_image: null,
      layer_tags: "[]",
      last_branch_tag: null,
      branch_blocked: null,
      // Recorded before they are created (see forget, destroy and reconcile).
      cgroup: host.cgroups ? JSON.stringify(sandboxCgroupDirs(host.cgroups, id)) : null,
      ready_ms: null,
      error: null,
      access_token: newAccessToken(),
      traffic_token: newAccessToken(),
      pause_tags: "[]",
      pending_pause_tag: null,
      memory_tag: null,
      paused_at_unix_ms: null,
      kept_disk: null,
      cold_booted: 0,
    };
  });
}

export function isIntIn(value: unknown, min: number, max: number): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= min && value <= max;
}
