/**
 * `forkd pack --tag T --out T.tar.zst`: bundle a snapshot chain with the guest image its root needs, to move it
 * to another host or FORKD_HOME (`forkd unpack`). Works on this host's files directly (as the daemon's user), not
 * through the daemon: a pack is a file here.
 */
import type { Command } from "commander";
import { invalidArgument } from "../../common/errors.js";
import { resolvePaths } from "../../common/paths.js";
import { packSnapshot } from "../../controller/snapshots/pack.js";
import { armCliCrashPoints } from "../arm-crash-points.js";
import { printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";
import { bytes } from "./snapshot-info.js";

export function registerPack(program: Command): void {
  program
    .command("pack")
    .description("bundle a snapshot, its ancestors and its guest image into one .tar.zst file")
    .requiredOption("-t, --tag <tag>", "snapshot to pack (its whole chain goes in)")
    .requiredOption("-o, --out <file>", "the pack to write (must not exist)")
    .option("--level <n>", "zstd compression level 1..19", "3")
    .option(
      "--without-image",
      "leave the guest image out (the target must already have this exact image build)",
    )
    .option("--json", "print the result as JSON")
    .action((opts: { tag: string; out: string; level: string; withoutImage?: boolean; json?: boolean }) =>
      runCommand(async (signal) => {
        armCliCrashPoints();
        const level = Number(opts.level);
        if (!Number.isInteger(level)) throw invalidArgument(`--level must be an integer, got ${opts.level}`);
        const progress = startProgress(`packing ${opts.tag}`);
        try {
          const result = await packSnapshot(resolvePaths(), {
            tag: opts.tag,
            out: opts.out,
            level,
            withoutImage: opts.withoutImage,
            signal,
            onProgress: progress.update,
          });
          progress.succeed(
            `${result.out}: ${result.chain.join(" -> ")}${result.image_included ? " + image" : ""}, ` +
              `${bytes(result.content_bytes)} in ${bytes(result.pack_bytes)} (${(result.ms / 1000).toFixed(1)} s)`,
          );
          if (opts.json) printJson(result);
        } catch (err) {
          progress.fail(`packing ${opts.tag} failed`);
          throw err;
        }
        return undefined;
      }),
    );
}
