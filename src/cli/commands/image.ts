import type { Command } from "commander";
import {
  type BuiltImage,
  buildImage,
  findCachedImage,
  listTemplateEntries,
  loadTemplate,
} from "../../image/index.js";
import { oneLine, printJson, printTable, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerImage(program: Command): void {
  const image = program.command("image").description("guest images built from templates");
  registerImageBuild(image);
  registerImageList(image);
}

function registerImageBuild(image: Command): void {
  image
    .command("build")
    .description("build (or reuse from cache) the guest image of a template")
    .argument("<template>", "template name (see `forkd image ls`) or path to a .toml file")
    .option("--force", "rebuild even if the cache has this recipe")
    .option("--json", "print the built image as JSON")
    .addHelpText(
      "after",
      "\nFormat-2 templates (docs/templates.md) build from a Debian suite, an OCI layout or archive, a registry\n" +
        "image or a Dockerfile, then run their steps; each step is cached, and the build prints a table of them\n" +
        "(cached, or the seconds it took). --force uses no cached step: the base is fetched again and every\n" +
        "step runs again (their cache entries are replaced).\n\n" +
        "Examples:\n  forkd image build postgres\n  forkd image build ./my-template.toml --json\n",
    )
    .action((name: string, opts) =>
      runCommand(async (signal) => {
        const template = await loadTemplate(name, { allowFiles: true });
        const progress = startProgress(`image ${template.name}`);
        try {
          const built = await buildImage(template, {
            signal,
            force: opts.force,
            // Build-step output comes from the image: one line, control characters escaped.
            onProgress: (e) => progress.update(`${template.name}: ${oneLine(e.message, 200)}`),
          });
          progress.succeed(`image ${template.name} ${built.hash.slice(0, 12)} at ${built.dir}`);
          if (opts.json) printJson(built);
          else printStepTimings(built);
        } catch (err) {
          progress.fail(`image ${template.name} failed`);
          throw err;
        }
        return undefined;
      }),
    );
}

function registerImageList(image: Command): void {
  image
    .command("ls")
    .alias("list")
    .description("list templates and whether their image is built")
    .option("--json", "print JSON")
    .action((opts) =>
      runCommand(async () => {
        const rows = [];
        for (const entry of await listTemplateEntries()) {
          const t = entry.template;
          if (!t) {
            rows.push({
              template: entry.name,
              interpreter: "-",
              memory_mib: 0,
              built: null,
              description: `(cannot be loaded here: ${entry.error?.split("\n")[0]})`,
            });
            continue;
          }
          const built = await findCachedImage(t).catch(() => undefined);
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

/** The base and steps of a format-2 build, each cached or with the time it took. */
function printStepTimings(built: BuiltImage): void {
  const steps = built.steps;
  if (!steps || steps.length === 0) return;
  printTable(
    ["STEP", "SECONDS", "WHAT"],
    steps.map((s) => [
      s.number === 0 ? "base" : String(s.number),
      s.cached ? "cached" : s.seconds.toFixed(1),
      oneLine(s.description, 100),
    ]),
  );
}
