/**
 * The record side of pause and resume: what the database says about a sandbox once its pause layer is published,
 * and how a sandbox that must be paused (a resume that failed, or a restart finding a pause or resume that
 * did not finish) loses whatever of a VM it still has. pause-resume.ts sequences these under the sandbox's lock;
 * pause-layer.ts writes the layer itself.
 */
import { readFile, rm } from "node:fs/promises";
import { invalidArgument } from "../../common/errors.js";
import { removeCgroups } from "../../isolation/cgroup.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import { killAndWait, processesMentioning } from "../host/processes.js";
import type { OnTimeout } from "../sandbox-service.js";
import { cgroupDirsOf } from "./limits.js";

/**
 * The row of a sandbox paused in `tag`: its own pause layers (only `tag` when the pause merged `replaced` into
 * it), its chain without the merged layers, no lifetime while paused.
 */
export function pausedRowUpdate(
  row: SandboxRow,
  tag: string,
  replaced: readonly string[],
): Partial<Omit<SandboxRow, "id">> {
  const own = replaced.length > 0 ? [tag] : [...(JSON.parse(row.pause_tags) as string[]), tag];
  const layers = (JSON.parse(row.layer_tags) as string[]).filter((t) => !replaced.includes(t));
  return {
    status: "paused",
    pending_pause_tag: null,
    pause_tags: JSON.stringify(own),
    last_branch_tag: tag,
    layer_tags: JSON.stringify([...layers, tag]),
    expires_at_unix_ms: null,
    paused_at_unix_ms: Date.now(),
  };
}

/** The row of a sandbox paused without memory: its kept disk, no lifetime while paused. */
export function keptRowUpdate(keptDisk: string): Partial<Omit<SandboxRow, "id">> {
  return {
    status: "paused",
    pending_pause_tag: null,
    kept_disk: keptDisk,
    expires_at_unix_ms: null,
    paused_at_unix_ms: Date.now(),
  };
}

/** A paused sandbox has no VM: whatever still runs or lies in its run directory goes, and its row says paused. */
export async function settlePaused(db: StateDb, row: SandboxRow): Promise<void> {
  for (const identity of await processesMentioning(row.run_dir)) await killAndWait(identity);
  await rm(row.run_dir, { recursive: true, force: true });
  await removeCgroups(cgroupDirsOf(row)).catch(() => {});
  db.updateSandbox(row.id, { status: "paused", pid: null, pid_start_time: null, cgroup: null });
}

export function validateOnTimeout(value: unknown): OnTimeout {
  if (value === undefined) return "kill";
  if (value !== "kill" && value !== "pause") {
    throw invalidArgument(`on_timeout must be "kill" or "pause", got ${JSON.stringify(value)}`);
  }
  return value;
}

/** The resident set of a process, bytes (0 when it cannot be read): what stopping it gives back. */
export async function residentBytes(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const kib = /^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1];
  return kib === undefined ? 0 : Number(kib) * 1024;
}
