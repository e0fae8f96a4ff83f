/**
 * Daemon-backed `forkd snapshots` / `rmi` / `snapshot-info` / `snapshot-compact`: while a daemon runs it owns the snapshots (it knows which sandboxes
 * still map one), so these commands go through it and fall back to the local engine only when no daemon answers.
 * An explicit --daemon-url/FORKD_URL means "the daemon": then an unreachable daemon is an error, not a fallback.
 */
import type { Command } from "commander";
import type { SnapshotInfoWire } from "../../api/schemas.js";
import { addDaemonOptions, DaemonClient } from "../daemon-client.js";

/** The daemon to use for snapshot commands, or null to use the local engine. */
export async function snapshotDaemon(command: Command): Promise<DaemonClient | null> {
  const opts = command.optsWithGlobals() as { local?: boolean; daemonUrl?: string };
  if (opts.local) return null;
  const client = DaemonClient.from(command);
  const explicit = opts.daemonUrl !== undefined || process.env.FORKD_URL !== undefined;
  if (explicit) return client;
  return (await client.reachable(1000)) ? client : null;
}

/** `--local` plus the daemon options, for the engine-local snapshot commands. */
export function addSnapshotDaemonOptions(command: Command): Command {
  return addDaemonOptions(command.option("--local", "use the local engine even if a daemon is running"));
}

/** The daemon's snapshots in the shape `forkd snapshots --json` has always printed (plus status/bootable). */
export async function listSnapshotsViaDaemon(client: DaemonClient, signal: AbortSignal) {
  const snapshots = await client.json<SnapshotInfoWire[]>("GET", "/v1/snapshots", { signal });
  return snapshots.map((s) => ({
    tag: s.tag,
    template: s.template ?? "-",
    accel: s.accelerator ?? "-",
    memory_mib: s.memory_mib ?? 0,
    created_at_unix: s.created_at_unix,
    parent_tag: s.parent_tag,
    bytes: s.bytes,
    status: s.status,
    bootable: s.bootable,
  }));
}
