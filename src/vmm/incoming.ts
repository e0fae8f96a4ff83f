/**
 * A child started with `restore.deferred` (`-incoming defer`): QEMU has started, realised its devices, connected
 * the agent chardev and opened the device-state file at DEVICE_STATE_FD, and waits. `startIncoming` loads the
 * state; the guest then runs by itself (unless the spec has `startPaused`). This is what a warm pool keeps ready:
 * the process start is paid before a spawn asks for it.
 */
import { abortError } from "../common/deadline.js";
import { ForkdError } from "../common/errors.js";
import { DEVICE_STATE_FD } from "./qemu-args.js";
import type { QmpClient } from "./qmp.js";

/** Poll interval while a deferred load runs (it takes a few milliseconds). */
const LOAD_POLL_MS = 2;

/** Starts loading the device state at DEVICE_STATE_FD. Returns once QEMU accepted the command. */
export async function startIncoming(qmp: QmpClient, options: { signal?: AbortSignal } = {}): Promise<void> {
  await qmp.execute("migrate-incoming", { uri: `fd:${DEVICE_STATE_FD}` }, { signal: options.signal });
}

/**
 * Waits until the load started by `startIncoming` is done (the run state leaves `inmigrate`). Only needed to
 * time the load on its own (with `startPaused`); a spawn just talks to the agent, which answers once it runs.
 */
export async function waitIncomingLoaded(
  qmp: QmpClient,
  options: { signal?: AbortSignal } = {},
): Promise<string> {
  for (;;) {
    const { status } = await qmp.execute<{ status: string }>("query-status", undefined, options);
    if (status === "postmigrate" || status === "internal-error" || status === "shutdown") {
      throw new ForkdError("internal", `device-state load ended in run state ${status}`);
    }
    if (status !== "inmigrate") return status;
    await new Promise((resolve) => setTimeout(resolve, LOAD_POLL_MS));
    if (options.signal?.aborted) throw abortError(options.signal, "waiting for the device-state load");
  }
}

/** What TCG's translator holds and has done (QMP `x-query-jit`, QEMU 6.2+); null under KVM or on older QEMU. */
export interface JitStats {
  /** Bytes of host code in the translation cache now. */
  codeBytes: number;
  /** Translation blocks in the cache now (reset by a flush). */
  tbCount: number;
  /** Whole-cache flushes since start (each one throws every translation away). */
  flushes: number;
}

export async function queryJit(
  qmp: QmpClient,
  options: { signal?: AbortSignal } = {},
): Promise<JitStats | null> {
  let text: string;
  try {
    ({ "human-readable-text": text } = await qmp.execute<{ "human-readable-text": string }>(
      "x-query-jit",
      undefined,
      options,
    ));
  } catch {
    return null;
  }
  return parseJitText(text);
}

/** Parses the fields of `x-query-jit`'s text that stay stable across QEMU 6.2-8.x. */
export function parseJitText(text: string): JitStats | null {
  const code = /^gen code size\s+(\d+)\//m.exec(text);
  const tbs = /^TB count\s+(\d+)/m.exec(text);
  const flushes = /^TB flush count\s+(\d+)/m.exec(text);
  if (!code || !tbs || !flushes) return null;
  return { codeBytes: Number(code[1]), tbCount: Number(tbs[1]), flushes: Number(flushes[1]) };
}
