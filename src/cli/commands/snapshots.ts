import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { deleteSnapshot, listSnapshots } from "../../controller/snapshots.js";
import { printJson, printTable } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerSnapshots(program: Command): void {
  program
    .command("snapshots")
    .description("list snapshots")
    .option("--json", "print JSON")
    .action((opts) =>
      runCommand(async () => {
        const snaps = await listSnapshots(resolvePaths());
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
  program
    .command("rmi")
    .description("delete a snapshot")
    .argument("<tag>", "snapshot tag")
    .action((tag: string) =>
      runCommand(async () => {
        await deleteSnapshot(resolvePaths(), tag);
        process.stdout.write(`deleted ${tag}\n`);
        return undefined;
      }),
    );
}
