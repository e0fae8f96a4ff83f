/** `forkd ls`: the daemon's sandboxes. */
import { type Command, Option } from "commander";
import type { SandboxInfo, SandboxStatus } from "../../sdk/index.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { printJson, printTable } from "../output.js";

export function registerLs(program: Command): void {
  addDaemonOptions(
    program
      .command("ls")
      .alias("ps")
      .description("list sandboxes (daemon)")
      .option("-t, --tag <tag>", "only sandboxes of this snapshot")
      .addOption(
        new Option("--status <status>", "only sandboxes in this state").choices([
          "starting",
          "running",
          "pausing",
          "paused",
          "resuming",
          "stopping",
          "dead",
        ]),
      )
      .option("--json", "print JSON"),
  ).action((opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const sandboxes = await controller.listSandboxes({
        ...(opts.tag === undefined ? {} : { snapshotTag: opts.tag as string }),
        ...(opts.status === undefined ? {} : { status: opts.status as SandboxStatus }),
        signal,
      });
      if (opts.json) printJson(sandboxes);
      else printSandboxes(sandboxes);
      return undefined;
    }),
  );
}

export function printSandboxes(sandboxes: SandboxInfo[], now = Date.now()): void {
  printTable(
    ["ID", "SNAPSHOT", "STATUS", "PID", "ACCEL", "READY_MS", "MEMORY_LIMIT", "EXPIRES_IN", "CREATED"],
    sandboxes.map((s) => [
      s.id,
      s.snapshot_tag,
      s.status,
      s.pid === null ? "-" : String(s.pid),
      s.accelerator ?? "-",
      s.ready_ms == null ? "-" : s.ready_ms.toFixed(0),
      s.memory_limit_mib === null ? "-" : `${s.memory_limit_mib} MiB`,
      s.expires_at_unix_ms == null ? "never" : formatDuration(s.expires_at_unix_ms - now),
      new Date(s.created_at_unix * 1000).toISOString(),
    ]),
  );
}

export function formatDuration(ms: number): string {
  if (ms <= 0) return "expired";
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}
