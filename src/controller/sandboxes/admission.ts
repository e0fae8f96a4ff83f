/**
 * Admission control: refuse a spawn that would exceed the configured limits or the host's memory, with a
 * reason, instead of starting it and thrashing. Capacity is reserved synchronously, before the caller awaits
 * anything: concurrent requests each see the reservations of the others (children of in-flight spawns, tmpfs
 * RAM images being made, BRANCH copy buffers), so a burst cannot slip past a limit between a check and its
 * effect. A reservation is released when its work ends, once what it reserved shows in the host's own figures
 * (alive sandboxes, MemAvailable).
 *
 * Parent boots (`POST /v1/snapshots`, template builds: an image build, then a VM with the template's whole RAM)
 * are admitted too: a bounded number at once host-wide and per tenant, and each boot's memory checked like a
 * spawn's before its VM starts.
 */
import { readFileSync } from "node:fs";
import { ForkdError } from "../../common/errors.js";

export interface AdmissionLimits {
  /** Sandboxes alive at once. */
  maxSandboxes: number;
  /** Spawn requests being served at once; more get 429 (each spawn is CPU-heavy under TCG). */
  maxConcurrentSpawns: number;
  /**
   * Host memory a new child is assumed to cost until measured otherwise: QEMU's own memory plus the guest
   * pages it copies on write. bench/spawn measures the real figure (PSS per child).
   */
  perSandboxEstimateMiB: number;
  /** Host memory that must stay available after the spawn. */
  reserveMiB: number;
  /** Parent boots (template builds included) running at once, host-wide; more get 429. */
  maxConcurrentParentBoots: number;
  /** Parent boots one tenant may run at once; more get 429 (admins: only the host-wide bound). */
  tenantMaxParentBoots: number;
}

export const DEFAULT_ADMISSION_LIMITS: AdmissionLimits = {
  maxSandboxes: 1000,
  maxConcurrentSpawns: 4,
  perSandboxEstimateMiB: 64,
  reserveMiB: 1024,
  maxConcurrentParentBoots: 2,
  tenantMaxParentBoots: 1,
};

/** The host's MemAvailable (synchronous: a read of /proc/meminfo, so a check and its reservation are one step). */
export function memAvailableMiB(): number {
  const meminfo = readFileSync("/proc/meminfo", "utf8");
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(meminfo)?.[1] ?? 0) / 1024;
}

export interface Reservation {
  /** Idempotent. */
  release(): void;
}

export class Admission {
  private spawnsInFlight = 0;
  private sandboxesReserved = 0;
  private memoryReservedMiB = 0;
  private parentBoots = 0;
  private readonly parentBootsByTenant = new Map<string, number>();

  constructor(
    readonly limits: AdmissionLimits,
    /** Sandboxes alive now (not counting reservations). */
    private readonly alive: () => number,
    private readonly memAvailable: () => number = memAvailableMiB,
  ) {}

  /**
   * Reserves a spawn of `n` children (plus `extraMemoryMiB`, e.g. a tmpfs RAM image it may have to make), or
   * throws `too_many_requests`/`unavailable` saying which limit.
   */
  reserveSpawn(n: number, extraMemoryMiB = 0): Reservation {
    if (this.spawnsInFlight >= this.limits.maxConcurrentSpawns) {
      throw new ForkdError(
        "too_many_requests",
        `${this.spawnsInFlight} spawn requests are already running (limit ${this.limits.maxConcurrentSpawns}); retry shortly`,
      );
    }
    const alive = this.alive();
    if (alive + this.sandboxesReserved + n > this.limits.maxSandboxes) {
      const starting = this.sandboxesReserved > 0 ? `, ${this.sandboxesReserved} starting` : "";
      throw new ForkdError(
        "unavailable",
        `spawning ${n} would exceed the limit of ${this.limits.maxSandboxes} sandboxes (${alive} alive${starting})`,
      );
    }
    const needed = n * this.limits.perSandboxEstimateMiB + extraMemoryMiB;
    this.checkMemory(needed, `${n} sandbox${n === 1 ? "" : "es"} need about ${needed} MiB`);
    this.spawnsInFlight++;
    this.sandboxesReserved += n;
    this.memoryReservedMiB += needed;
    return once(() => {
      this.spawnsInFlight--;
      this.sandboxesReserved -= n;
      this.memoryReservedMiB -= needed;
    });
  }

  /** Reserves host memory for other work that allocates it (a BRANCH's copy buffer), or throws `unavailable`. */
  reserveMemory(mib: number, what: string): Reservation {
    const needed = Math.ceil(mib);
    this.checkMemory(needed, `${what} needs about ${needed} MiB`);
    this.memoryReservedMiB += needed;
    return once(() => {
      this.memoryReservedMiB -= needed;
    });
  }

  /**
   * Reserves a slot for a parent boot by `tenant` (null: an admin), or throws `too_many_requests` saying which
   * bound. Its memory is reserved separately (reserveMemory) once the template says how much.
   */
  reserveParentBoot(tenant: string | null): Reservation {
    if (this.parentBoots >= this.limits.maxConcurrentParentBoots) {
      throw new ForkdError(
        "too_many_requests",
        `${this.parentBoots} snapshots are already being built (limit ${this.limits.maxConcurrentParentBoots}); retry when one is done`,
      );
    }
    const ofTenant = tenant === null ? 0 : (this.parentBootsByTenant.get(tenant) ?? 0);
    if (tenant !== null && ofTenant >= this.limits.tenantMaxParentBoots) {
      throw new ForkdError(
        "too_many_requests",
        `tenant ${tenant} is already building ${ofTenant} snapshot${ofTenant === 1 ? "" : "s"} (limit ${this.limits.tenantMaxParentBoots}); retry when it is done`,
      );
    }
    this.parentBoots++;
    if (tenant !== null) this.parentBootsByTenant.set(tenant, ofTenant + 1);
    return once(() => {
      this.parentBoots--;
      if (tenant === null) return;
      const left = (this.parentBootsByTenant.get(tenant) ?? 1) - 1;
      if (left > 0) this.parentBootsByTenant.set(tenant, left);
      else this.parentBootsByTenant.delete(tenant);
    });
  }

  /** What is reserved right now (for metrics and tests). */
  reserved(): { spawns: number; sandboxes: number; memoryMiB: number; parentBoots: number } {
    return {
      parentBoots: this.parentBoots,
      spawns: this.spawnsInFlight,
      sandboxes: this.sandboxesReserved,
      memoryMiB: this.memoryReservedMiB,
    };
  }

  private checkMemory(needed: number, what: string): void {
    const available = this.memAvailable() - this.memoryReservedMiB;
    if (available - needed < this.limits.reserveMiB) {
      const promised =
        this.memoryReservedMiB > 0
          ? ` (${Math.round(this.memoryReservedMiB)} MiB promised to work in progress)`
          : "";
      throw new ForkdError(
        "unavailable",
        `not enough host memory: ${Math.round(available)} MiB available${promised}, ${what} and ` +
          `${this.limits.reserveMiB} MiB must stay free`,
      );
    }
  }
}

function once(fn: () => void): Reservation {
  let done = false;
  return {
    release: () => {
      if (done) return;
      done = true;
      fn();
    },
  };
}
