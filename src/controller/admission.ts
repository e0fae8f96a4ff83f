/**
 * Admission control: refuse a spawn that would exceed the configured limits or the host's memory, with a
 * reason, instead of starting it and thrashing.
 */
import { readFile } from "node:fs/promises";
import { ForkdError } from "../common/errors.js";

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
}

export const DEFAULT_ADMISSION_LIMITS: AdmissionLimits = {
  maxSandboxes: 1000,
  maxConcurrentSpawns: 4,
  perSandboxEstimateMiB: 64,
  reserveMiB: 1024,
};

export async function memAvailableMiB(): Promise<number> {
  const meminfo = await readFile("/proc/meminfo", "utf8");
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(meminfo)?.[1] ?? 0) / 1024;
}

export async function admitSpawn(
  limits: AdmissionLimits,
  state: { alive: number; spawning: number; requested: number },
): Promise<void> {
  if (state.spawning >= limits.maxConcurrentSpawns) {
    throw new ForkdError(
      "too_many_requests",
      `${state.spawning} spawn requests are already running (limit ${limits.maxConcurrentSpawns}); retry shortly`,
    );
  }
  if (state.alive + state.requested > limits.maxSandboxes) {
    throw new ForkdError(
      "unavailable",
      `spawning ${state.requested} would exceed the limit of ${limits.maxSandboxes} sandboxes (${state.alive} alive)`,
    );
  }
  const available = await memAvailableMiB();
  const needed = state.requested * limits.perSandboxEstimateMiB;
  if (available - needed < limits.reserveMiB) {
    throw new ForkdError(
      "unavailable",
      `not enough host memory: ${Math.round(available)} MiB available, ${state.requested} sandboxes need about ` +
        `${needed} MiB (${limits.perSandboxEstimateMiB} MiB each) and ${limits.reserveMiB} MiB must stay free`,
    );
  }
}
