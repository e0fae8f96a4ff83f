/** `forkd images`: the daemon's snapshots (what sandboxes fork from), like `docker images`. */
import type { Command } from "commander";
import type { SnapshotInfo } from "../../sdk/index.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { printJson, printTable } from "../output.js";

export function registerImages(program: Command): void {
  addDaemonOptions(
    program
      .command("images")
      .description("list the daemon's snapshots (what sandboxes fork from)")
      .option("--json", "print JSON"),
  ).action((opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const snapshots = await controller.listSnapshots({ signal });
      if (opts.json) printJson(snapshots);
      else printSnapshots(snapshots);
      return undefined;
    }),
  );
}

export function printSnapshots(snapshots: SnapshotInfo[]): void {
  printTable(
    ["TAG", "STATUS", "TEMPLATE", "ACCEL", "MEMORY", "SIZE", "PARENT", "CREATED"],
    snapshots.map((s) => [
      s.tag,
      s.status === "ready" && !s.bootable ? "unbootable" : s.status,
      s.template ?? "-",
      s.accelerator ?? "-",
      s.memory_mib == null ? "-" : `${s.memory_mib} MiB`,
      formatBytes(s.bytes ?? 0),
      s.parent_tag ?? "-",
      new Date(s.created_at_unix * 1000).toISOString(),
    ]),
  );
}

export function formatBytes(bytes: number): string {
  if (bytes < 1024 * 1024) return `${Math.ceil(bytes / 1024)} KiB`;
  if (bytes < 1024 * 1024 * 1024) return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
  return `${(bytes / 1024 / 1024 / 1024).toFixed(2)} GiB`;
}
