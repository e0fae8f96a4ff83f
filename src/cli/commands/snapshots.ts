import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { listSnapshots } from "../../controller/snapshots/list.js";
import { printJson, printTable } from "../output.js";
import { registerRmi } from "./rmi.js";
import { addSnapshotDaemonOptions, listSnapshotsViaDaemon, runSnapshotCommand } from "./snapshots-remote.js";

export function registerSnapshots(program: Command): void {
  addSnapshotDaemonOptions(
    program.command("snapshots").description("list snapshots (the daemon's, if one is running)"),
  )
    .option("--json", "print JSON")
    .action((opts, command: Command) =>
      runSnapshotCommand(command, async (daemon, signal) => {
        const snaps = daemon
          ? await listSnapshotsViaDaemon(daemon, signal)
          : await listSnapshots(resolvePaths());
        if (opts.json) printJson(snaps);
        else
          printTable(
            ["TAG", "TEMPLATE", "ACCEL", "MEMORY", "CREATED"],
            snaps.map((s) => [
              s.tag,
              s.template,
              s.accel,
              `${s.memory_mib} MiB`,
              new Date(s.created_at_unix * 1000).toISOString(),
            ]),
          );
        return undefined;
      }),
    );
  registerRmi(program);
}
