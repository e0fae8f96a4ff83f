/** `forkd snapshot-compact --from HEAD --to FLAT`: fold a chain into one new flat snapshot. */
import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { compactSnapshot, localSnapshotDetail } from "../../controller/snapshots/chains.js";
import { printJson, startProgress } from "../output.js";
import { bytes } from "./snapshot-info.js";
import { addSnapshotDaemonOptions, runSnapshotCommand } from "./snapshots-remote.js";

export function registerSnapshotCompact(program: Command): void {
  addSnapshotDaemonOptions(
    program
      .command("snapshot-compact")
      .description("fold a snapshot chain into one new flat snapshot with no parent (the chain is kept)")
      .requiredOption("--from <tag>", "head of the chain to compact")
      .requiredOption("--to <tag>", "tag of the new flat snapshot"),
  )
    .option("--json", "print the new snapshot as JSON")
    .action((opts: { from: string; to: string; json?: boolean }, command: Command) =>
      runSnapshotCommand(command, async (daemon, signal) => {
        const progress = startProgress(`compacting ${opts.from} into ${opts.to}`);
        try {
          let summary: unknown;
          if (daemon) {
            summary = await daemon.controller.compactSnapshot(opts.from, opts.to, { timeoutMs: 0, signal });
            progress.succeed(`${opts.to} ready`);
          } else {
            const paths = resolvePaths();
            await compactSnapshot(paths, {
              from: opts.from,
              to: opts.to,
              signal,
              onProgress: progress.update,
            });
            const detail = await localSnapshotDetail(paths, opts.to);
            const layer = detail.layers[0];
            progress.succeed(
              `${opts.to} ready: memory ${bytes(layer?.memory.physical_bytes ?? 0)} on disk, ` +
                `disk layer ${bytes(layer?.disk.physical_bytes ?? 0)}`,
            );
            summary = detail;
          }
          if (opts.json) printJson(summary);
        } catch (err) {
          progress.fail(`compacting ${opts.from} failed`);
          throw err;
        }
        return undefined;
      }),
    );
}
