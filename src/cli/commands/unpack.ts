/**
 * `forkd unpack FILE [--tag NEW] [--force]`: verify a pack (every entry against its manifest, every hash, the
 * disk layers' shape) and install its snapshots all or none. Works on this host's files directly, like pack.
 */
import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { unpackSnapshot } from "../../controller/snapshots/unpack.js";
import { armCliCrashPoints } from "../arm-crash-points.js";
import { printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerUnpack(program: Command): void {
  program
    .command("unpack")
    .description("verify a pack and install its snapshots (all or none) and, if missing, its guest image")
    .argument("<file>", "a pack written by forkd pack")
    .option("-t, --tag <tag>", "install the head under this tag (its ancestors keep theirs)")
    .option("--force", "replace existing snapshots of the same tags that differ from the packed ones")
    .option("--json", "print the result as JSON")
    .action((file: string, opts: { tag?: string; force?: boolean; json?: boolean }) =>
      runCommand(async (signal) => {
        armCliCrashPoints();
        const progress = startProgress(`unpacking ${file}`);
        try {
          const result = await unpackSnapshot(resolvePaths(), {
            file,
            tag: opts.tag,
            force: opts.force,
            signal,
            onProgress: progress.update,
          });
          const parts = [
            `installed ${result.installed.join(", ") || "nothing new"}`,
            result.reused.length > 0 ? `kept identical ${result.reused.join(", ")}` : "",
            result.replaced.length > 0 ? `replaced ${result.replaced.join(", ")}` : "",
            `image ${result.image}`,
          ].filter(Boolean);
          progress.succeed(`${result.head} ready: ${parts.join("; ")} (${(result.ms / 1000).toFixed(1)} s)`);
          if (result.orphaned.length > 0) {
            process.stderr.write(
              `forkd: replacing left these snapshots unbootable (they were made on the old layers): ${result.orphaned.join(", ")}\n`,
            );
          }
          if (opts.json) printJson(result);
        } catch (err) {
          progress.fail(`unpacking ${file} failed`);
          throw err;
        }
        return undefined;
      }),
    );
}
