/**
 * `forkd rmi TAG`: delete a snapshot, through the daemon when one runs (it knows which sandboxes depend on
 * what). `--cascade` deletes its dependents too, `--force` leaves them orphaned; neither ever deletes a snapshot
 * a running VM maps, directly or through a dependent.
 */

import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { removeSnapshot, snapshotDescendants } from "../../controller/snapshots/chains.js";
import { printJson } from "../output.js";
import { addSnapshotDaemonOptions, runSnapshotCommand } from "./snapshots-remote.js";

export function registerRmi(program: Command): void {
  addSnapshotDaemonOptions(
    program
      .command("rmi")
      .description("delete a snapshot (through the daemon, if one is running)")
      .argument("<tag>", "snapshot tag"),
  )
    .option("--cascade", "also delete every snapshot that depends on it (leaves first)")
    .option("--force", "delete it even though others depend on it: they become unbootable (orphans)")
    .option("--json", 'print {"deleted": [...], "orphaned": [...]}')
    .action((tag: string, opts: { cascade?: boolean; force?: boolean; json?: boolean }, command: Command) =>
      runSnapshotCommand(command, async (daemon, signal) => {
        let deleted: string[];
        let orphaned: string[] = [];
        if (daemon) {
          // The daemon answers 204 without a body: ask first what the flags will take along or orphan.
          const before =
            opts.cascade || opts.force ? await daemon.controller.getSnapshot(tag, { signal }) : undefined;
          await daemon.controller.deleteSnapshot(tag, { cascade: opts.cascade, force: opts.force, signal });
          deleted = opts.cascade ? [...(before?.all_dependents ?? []).reverse(), tag] : [tag];
          if (opts.force) orphaned = before?.all_dependents ?? [];
        } else {
          const paths = resolvePaths();
          deleted = await removeSnapshot(paths, tag, { cascade: opts.cascade, force: opts.force });
          if (opts.force) orphaned = await snapshotDescendants(paths, tag);
        }
        if (opts.json) printJson({ deleted, orphaned });
        else {
          process.stdout.write(`deleted ${deleted.join(", ")}\n`);
          if (orphaned.length > 0) {
            process.stdout.write(`orphaned (unbootable until deleted): ${orphaned.join(", ")}\n`);
          }
        }
        return undefined;
      }),
    );
}
