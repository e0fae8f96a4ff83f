/**
 * A sandbox the slow way: boot a fresh VM from the image, warm it, run one expression, tear it down. This is
 * what forking replaces; the spawn benchmark measures both side by side.
 */
import { mkdir, rm } from "node:fs/promises";
import path from "node:path";
import type { ForkdPaths } from "../../common/paths.js";
import type { BuiltImage, Template } from "../../image/index.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import { createOverlay } from "../../vmm/qemu-tools.js";
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

export interface ColdBootExecResult extends Omit<ColdBootResult, "result" | "warmupMs"> {
  /** Boot to the template's `ready` succeeding (its `start` command and `ready` polls included). */
  readyMs: number;
  exitCode: number | null;
  stdout: string;
}

interface ColdBootOptions {
  template: Template;
  image: BuiltImage;
  accel: AcceleratorChoice;
  /** Default: this process's. */
  confinement?: ConfinementConfig;
  signal?: AbortSignal;
}

type BootedVm = Awaited<ReturnType<typeof bootWarmVm>>;

/** Boots a fresh VM from the image (start and ready included), runs `work` in it, tears it down. */
async function withColdBoot<T>(
  paths: ForkdPaths,
  options: ColdBootOptions,
  work: (booted: BootedVm, id: string, started: number) => Promise<T>,
): Promise<T> {
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
      return await work(booted, id, started);
    } finally {
      booted.agent.close();
      await booted.vm.kill({ graceMs: 0 });
    }
  } finally {
    await rm(runDir, { recursive: true, force: true });
  }
}

/**
 * The slow way for a template with a service: boot a fresh VM, run its `start` command and poll `ready` (as a
 * snapshot's parent does), then run `argv`, tear it down. Spawn to `argv`'s exit is what forking replaces.
 */
export function coldBootExec(
  paths: ForkdPaths,
  options: ColdBootOptions & { exec: string[] },
): Promise<ColdBootExecResult> {
  return withColdBoot(paths, options, async (booted, id, started) => {
    const ran = await booted.agent.exec(options.exec, { timeoutMs: 120_000, signal: options.signal });
    return {
      id,
      totalMs: performance.now() - started,
      bootMs: booted.bootMs,
      readyMs: booted.readyMs,
      exitCode: ran.exitCode,
      stdout: ran.stdout.toString("utf8"),
      error: ran.exitCode === 0 ? null : ran.stderr.toString("utf8").slice(-500),
    };
  });
}

/** Boots a fresh VM, warms it, evaluates `code` once, tears it down: what one forked child replaces. */
export function coldBootEval(
  paths: ForkdPaths,
  options: ColdBootOptions & { code: string },
): Promise<ColdBootResult> {
  return withColdBoot(paths, options, async (booted, id, started) => {
    const evaluated = await booted.agent.eval(options.code, { timeoutMs: 120_000, signal: options.signal });
    return {
      id,
      totalMs: performance.now() - started,
      bootMs: booted.bootMs,
      warmupMs: booted.warmupMs,
      result: evaluated.result,
      error: evaluated.error ? `${evaluated.error.type}: ${evaluated.error.message}` : null,
    };
  });
}
