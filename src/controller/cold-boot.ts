/**
 * A sandbox the slow way: boot a fresh VM from the image, warm it, run one expression, tear it down. This is
 * what forking replaces; the spawn benchmark measures both side by side.
 */
import { mkdir, rm } from "node:fs/promises";
import path from "node:path";
import type { ForkdPaths } from "../common/paths.js";
import type { BuiltImage, Template } from "../image/index.js";
import type { ConfinementConfig } from "../isolation/confinement.js";
import { createOverlay } from "../vmm/qemu-tools.js";
import type { AcceleratorChoice } from "./accelerator.js";
import { bootWarmVm } from "./boot.js";
import { newSandboxId } from "./ids.js";
import { RUN_FILES } from "./machine.js";

export interface ColdBootResult {
  id: string;
  /** Spawn to the answer of `code`: boot + warm-up + eval. */
  totalMs: number;
  bootMs: number;
  warmupMs: number;
  result: string | null;
  error: string | null;
}

export async function coldBootEval(
  paths: ForkdPaths,
  options: {
    template: Template;
    image: BuiltImage;
    accel: AcceleratorChoice;
    code: string;
    /** Default: this process's. */
    confinement?: ConfinementConfig;
    signal?: AbortSignal;
  },
): Promise<ColdBootResult> {
  const id = newSandboxId();
  const runDir = path.join(paths.run, `cold-${id}`);
  const started = performance.now();
  await mkdir(runDir, { recursive: true, mode: 0o700 });
  try {
    const disk = path.join(runDir, RUN_FILES.disk);
    await createOverlay({ backing: options.image.rootfs, backingFormat: "raw", overlay: disk });
    const booted = await bootWarmVm({
      template: options.template,
      image: options.image,
      accel: options.accel,
      runDir,
      memoryFile: path.join(runDir, "memory.bin"),
      disk,
      diskBacking: [options.image.rootfs],
      confinement: options.confinement,
      signal: options.signal,
    });
    try {
      const evaluated = await booted.agent.eval(options.code, { timeoutMs: 120_000, signal: options.signal });
      return {
        id,
        totalMs: performance.now() - started,
        bootMs: booted.bootMs,
        warmupMs: booted.warmupMs,
        result: evaluated.result,
        error: evaluated.error ? `${evaluated.error.type}: ${evaluated.error.message}` : null,
      };
    } finally {
      booted.agent.close();
      await booted.vm.kill({ graceMs: 0 });
    }
  } finally {
    await rm(runDir, { recursive: true, force: true });
  }
}
