/** Build progress events, so a CLI can show one spinner per step. */
import { errorMessage } from "../common/errors.js";

/**
 * Steps of a build. "kernel"/"initramfs" and "rootfs"/"filesystem" belong to two chains that run at the same
 * time, so two steps can be in progress at once.
 */
export type BuildStep = "resolve" | "kernel" | "initramfs" | "rootfs" | "filesystem" | "finalize";

/** How one base or build step of a format-2 template went (layered-build.ts). */
export interface StepTiming {
  /** 0 for the base, then 1..n. */
  number: number;
  description: string;
  cached: boolean;
  seconds: number;
}

export interface BuildProgressEvent {
  step: BuildStep;
  phase: "start" | "progress" | "done" | "failed";
  message: string;
  /** 0..1 within the step, when known. */
  fraction?: number;
  /** A format-2 build's base (0) or step (1..n) the event is about (its start, output, end). */
  buildStep?: number;
  /** Set on the rootfs step's "done" event of a format-2 build: each base/step, cached or how long it took. */
  steps?: StepTiming[];
}

export type Emit = (event: BuildProgressEvent) => void;

/** Runs `fn` as step `name`, reporting its start, its end (with the time taken) or its failure. */
export async function step<T>(
  emit: Emit,
  name: BuildStep,
  message: string,
  fn: () => Promise<T>,
): Promise<T> {
  const started = performance.now();
  emit({ step: name, phase: "start", message });
  try {
    const result = await fn();
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    emit({ step: name, phase: "done", message: `${message} (${seconds} s)`, fraction: 1 });
    return result;
  } catch (err) {
    emit({ step: name, phase: "failed", message: `${message}: ${errorMessage(err)}` });
    throw err;
  }
}
