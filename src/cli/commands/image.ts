import type { Command } from "commander";
import { buildImage, findCachedImage, listTemplates, loadTemplate } from "../../image/index.js";
import { printJson, printTable, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerImage(program: Command): void {
  const image = program.command("image").description("guest images built from templates");
  image
    .command("build")
    .description("build (or reuse from cache) the guest image of a template")
    .argument("<template>", "template name (see `forkd image ls`) or path to a .toml file")
    .option("--force", "rebuild even if the cache has this recipe")
    .option("--json", "print the built image as JSON")
    .action((name: string, opts) =>
      runCommand(async (signal) => {
        const template = await loadTemplate(name, { allowFiles: true });
        const progress = startProgress(`image ${template.name}`);
        try {
          const built = await buildImage(template, {
            signal,
            force: opts.force,
            onProgress: (e) => progress.update(`${template.name}: ${e.message}`),
          });
          progress.succeed(`image ${template.name} ${built.hash.slice(0, 12)} at ${built.dir}`);
          if (opts.json) printJson(built);
        } catch (err) {
          progress.fail(`image ${template.name} failed`);
          throw err;
        }
        return undefined;
      }),
    );
  image
    .command("ls")
    .alias("list")
    .description("list templates and whether their image is built")
    .option("--json", "print JSON")
    .action((opts) =>
      runCommand(async () => {
        const rows = [];
        for (const t of await listTemplates()) {
          const built = await findCachedImage(t);
          rows.push({
            template: t.name,
            interpreter: t.interpreter,
            memory_mib: t.memoryMib,
            built: built ? built.hash : null,
            description: t.description,
          });
        }
        if (opts.json) printJson(rows);
        else
          printTable(
            ["TEMPLATE", "INTERPRETER", "MEMORY", "IMAGE", "DESCRIPTION"],
            rows.map((r) => [
              r.template,
              r.interpreter,
              `${r.memory_mib} MiB`,
              r.built?.slice(0, 12) ?? "(not built)",
              r.description,
            ]),
          );
        return undefined;
      }),
    );
}
