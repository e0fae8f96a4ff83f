/**
 * What a sandbox may use of the host: memory (no swap), CPU time, processes/threads and disk. Every sandbox
 * gets limits: the ones its spawn asked for, or defaults derived from its machine. A limit the caller asked
 * for that this host cannot enforce refuses the spawn (501); a default the host cannot enforce is simply not
 * applied (and `forkd doctor` says so), so clients that never ask keep working everywhere.
 */
import { ForkdError, invalidArgument } from "../../common/errors.js";
import {
  DEFAULT_MEMORY_OVERHEAD_MIB,
  DEFAULT_PIDS_LIMIT,
  MAX_CPU_LIMIT_MILLICORES,
  MAX_DISK_LIMIT_MIB,
  MAX_MEMORY_LIMIT_MIB,
  MAX_PIDS_LIMIT,
  MIN_CPU_LIMIT_MILLICORES,
  MIN_DISK_LIMIT_MIB,
  MIN_MEMORY_LIMIT_MIB,
  MIN_PIDS_LIMIT,
} from "../../common/limits.js";
import { type CgroupLayout, type CgroupLimits, CPU_PERIOD_US } from "../../isolation/cgroup.js";
import type { SandboxRow } from "../../store/db.js";

export interface LimitsRequest {
  memoryLimitMiB?: number;
  /** Thousandths of a CPU: 500 = half a CPU, 2000 = two. */
  cpuLimitMillicores?: number;
  pidsLimit?: number;
  diskLimitMiB?: number;
}

/** The limits a sandbox runs with (null: not enforced on this host). Recorded with the sandbox. */
export interface SandboxLimits {
  memory_mib: number | null;
  cpu_millicores: number | null;
  pids: number | null;
  disk_mib: number | null;
}

export interface LimitContext {
  /** The cgroup controllers available (null: no cgroups, e.g. confinement off or not root). */
  layout: CgroupLayout | null;
  /** Whether the disk cap can be enforced (the launcher's RLIMIT_FSIZE; off with confinement). */
  diskCap: boolean;
  /** The daemon's default disk cap. */
  defaultDiskMiB: number;
  /** The snapshot's machine. */
  ramMiB: number;
  vcpus: number;
}

/** Validates what a spawn asked for (400 naming the field) before anything else happens. */
export function validateLimitsRequest(request: LimitsRequest): void {
  check("memory_limit_mib", request.memoryLimitMiB, MIN_MEMORY_LIMIT_MIB, MAX_MEMORY_LIMIT_MIB);
  check(
    "cpu_limit_millicores",
    request.cpuLimitMillicores,
    MIN_CPU_LIMIT_MILLICORES,
    MAX_CPU_LIMIT_MILLICORES,
  );
  check("pids_limit", request.pidsLimit, MIN_PIDS_LIMIT, MAX_PIDS_LIMIT);
  check("disk_limit_mib", request.diskLimitMiB, MIN_DISK_LIMIT_MIB, MAX_DISK_LIMIT_MIB);
}

function check(field: string, value: number | undefined, min: number, max: number): void {
  if (value === undefined) return;
  if (!Number.isInteger(value) || value < min || value > max) {
    throw invalidArgument(`${field} must be an integer in ${min}..${max}`);
  }
}

/**
 * The limits a sandbox gets: asked-for values (refused with 501 when the host cannot enforce them), else the
 * defaults (memory: RAM + DEFAULT_MEMORY_OVERHEAD_MIB; CPU: one CPU per vCPU; DEFAULT_PIDS_LIMIT; the
 * daemon's disk cap) where the host can enforce them.
 */
export function resolveLimits(request: LimitsRequest, context: LimitContext): SandboxLimits {
  const has = (controller: "memory" | "cpu" | "pids") =>
    context.layout?.hierarchies[controller] !== undefined;
  const why = (controller: "memory" | "cpu" | "pids") =>
    context.layout === null
      ? "this daemon runs without cgroups (confinement off, or not root)"
      : (context.layout.missing[controller] ?? "unavailable");
  const asked = (field: string, controller: "memory" | "cpu" | "pids") => {
    if (!has(controller)) {
      throw new ForkdError(
        "not_implemented",
        `${field} needs the cgroup ${controller} controller: ${why(controller)}`,
      );
    }
  };
  if (request.memoryLimitMiB !== undefined) asked("memory_limit_mib", "memory");
  if (request.cpuLimitMillicores !== undefined) asked("cpu_limit_millicores", "cpu");
  if (request.pidsLimit !== undefined) asked("pids_limit", "pids");
  if (request.diskLimitMiB !== undefined && !context.diskCap) {
    throw new ForkdError(
      "not_implemented",
      "disk_limit_mib needs confinement (this daemon runs with it off)",
    );
  }
  return {
    memory_mib: has("memory")
      ? (request.memoryLimitMiB ?? context.ramMiB + DEFAULT_MEMORY_OVERHEAD_MIB)
      : null,
    cpu_millicores: has("cpu") ? (request.cpuLimitMillicores ?? context.vcpus * 1000) : null,
    pids: has("pids") ? (request.pidsLimit ?? DEFAULT_PIDS_LIMIT) : null,
    disk_mib: context.diskCap ? (request.diskLimitMiB ?? context.defaultDiskMiB) : null,
  };
}

/** The cgroup settings for `limits`. */
export function cgroupLimits(limits: SandboxLimits): CgroupLimits {
  return {
    memoryBytes: limits.memory_mib === null ? undefined : limits.memory_mib * 2 ** 20,
    cpu:
      limits.cpu_millicores === null
        ? undefined
        : { quotaUs: Math.round((limits.cpu_millicores * CPU_PERIOD_US) / 1000), periodUs: CPU_PERIOD_US },
    pids: limits.pids ?? undefined,
  };
}

/** No limit of any kind (a daemon without cgroups or confinement, in-process forks). */
export const NO_LIMITS: Readonly<SandboxLimits> = {
  memory_mib: null,
  cpu_millicores: null,
  pids: null,
  disk_mib: null,
};

/** The limits recorded for a sandbox (rows from before they were recorded: none known). */
export function parseLimits(row: Pick<SandboxRow, "limits">): SandboxLimits {
  return { ...NO_LIMITS, ...(JSON.parse(row.limits || "{}") as Partial<SandboxLimits>) };
}

/** The cgroup directories recorded for a sandbox: a JSON array (rows before confinement: one path, or none). */
export function cgroupDirsOf(row: Pick<SandboxRow, "cgroup">): string[] {
  if (row.cgroup === null) return [];
  if (!row.cgroup.startsWith("[")) return [row.cgroup];
  return JSON.parse(row.cgroup) as string[];
}
