/**
 * Daemon-backed `forkd snapshots` / `rmi` / `snapshot-info` / `snapshot-compact`: while a daemon runs it owns the snapshots (it knows which sandboxes
 * still map one), so these commands go through it and fall back to the local engine only when no daemon answers.
 * An explicit --daemon-url/FORKD_URL means "the daemon": then an unreachable daemon is an error, not a fallback.
 */
import type { Command } from "commander";
import {
  addDaemonOptions,
  connectDaemon,
  type Daemon,
  daemonAnswers,
  daemonError,
  daemonNamed,
} from "../daemon-connection.js";
import { runCommand } from "../run-command.js";

/** How long the daemon at the default address gets to answer before the command uses the local engine. */
const DAEMON_PROBE_MS = 1000;

/** The daemon to use for snapshot commands, or null to use the local engine. */
export async function snapshotDaemon(command: Command): Promise<Daemon | null> {
  const opts = command.optsWithGlobals() as { local?: boolean };
  if (opts.local) return null;
  const daemon = connectDaemon(command);
  if (daemonNamed(command)) return daemon;
  return (await daemonAnswers(daemon, DAEMON_PROBE_MS)) ? daemon : null;
}

/** Runs a snapshot command through the daemon when one answers (its errors reported as the CLI's), else locally. */
export function runSnapshotCommand(
  command: Command,
  action: (daemon: Daemon | null, signal: AbortSignal) => Promise<number | undefined>,
): Promise<never> {
  return runCommand(async (signal) => {
    const daemon = await snapshotDaemon(command);
    try {
      return await action(daemon, signal);
    } catch (err) {
      throw daemon ? daemonError(err, daemon.url) : err;
    }
  });
}

/** `--local` plus the daemon options, for the engine-local snapshot commands. */
export function addSnapshotDaemonOptions(command: Command): Command {
  return addDaemonOptions(command.option("--local", "use the local engine even if a daemon is running"));
}

/** The daemon's snapshots in the shape `forkd snapshots --json` has always printed (plus status/bootable). */
export async function listSnapshotsViaDaemon(daemon: Daemon, signal: AbortSignal) {
  const snapshots = await daemon.controller.listSnapshots({ signal });
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
