import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { createSnapshot } from "../../controller/create-snapshot.js";
import { printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerSnapshot(program: Command): void {
  program
    .command("snapshot")
    .description("boot a template's parent VM, warm it, and save it as a snapshot children fork from")
    .requiredOption("-t, --tag <tag>", "tag of the new snapshot")
    .option("--template <name|file>", "template name or .toml file (default: the tag)")
    .option("--replace", "replace an existing snapshot with this tag")
    .option("--json", "print the manifest as JSON")
    .action((opts) =>
      runCommand(async (signal) => {
        const progress = startProgress(`snapshot ${opts.tag}`);
        try {
          const created = await createSnapshot(resolvePaths(), {
            tag: opts.tag,
            template: opts.template,
            replace: opts.replace,
            signal,
            onProgress: (e) => progress.update(`${e.step}: ${e.message}`),
          });
          const t = created.manifest.timings;
          progress.succeed(
            `snapshot ${created.tag} ready (${created.manifest.machine.accel}; boot ${(t.bootMs / 1000).toFixed(1)} s, ` +
              `warm-up ${(t.warmupMs / 1000).toFixed(1)} s, pause+save ${t.saveMs} ms)`,
          );
          if (opts.json) printJson({ dir: created.dir, ...created.manifest });
        } catch (err) {
          progress.fail(`snapshot ${opts.tag} failed`);
          throw err;
        }
        return undefined;
      }),
    );
}
