/** `forkd kill`: kill sandboxes by id, every one of a snapshot, or all. */
import type { Command } from "commander";
import { errorMessage, invalidArgument } from "../../common/errors.js";
import { isValidSandboxId } from "../../common/names.js";
import { addDaemonOptions, daemonError, runDaemonCommand } from "../daemon-connection.js";
import { EXIT } from "../exit-codes.js";
import { printJson } from "../output.js";

export function registerKill(program: Command): void {
  addDaemonOptions(
    program
      .command("kill")
      .description("kill sandboxes (daemon): by id, --tag T (all of one snapshot), or --all")
      .argument("[ids...]", "sandbox ids")
      .option("--all", "kill every sandbox")
      .option("-t, --tag <tag>", "kill every sandbox of this snapshot")
      .option("--json", "print {killed, failed} as JSON"),
  ).action((ids: string[], opts, command: Command) =>
    runDaemonCommand(command, async ({ controller, url }, signal) => {
      const modes = [ids.length > 0, opts.all === true, opts.tag !== undefined].filter(Boolean).length;
      if (modes !== 1) throw invalidArgument("give sandbox ids, --tag <tag>, or --all (exactly one)");
      for (const id of ids) {
        if (!isValidSandboxId(id)) throw invalidArgument(`invalid sandbox id ${JSON.stringify(id)}`);
      }
      const killed: string[] = [];
      const failed: { id: string; error: string }[] = [];
      if (ids.length === 0) {
        killed.push(
          ...(await controller.killSandboxes(
            opts.all ? { all: true, signal } : { snapshotTag: opts.tag as string, signal },
          )),
        );
      } else {
        await Promise.all(
          [...new Set(ids)].map(async (id) => {
            try {
              await controller.killSandbox(id, { signal });
              killed.push(id);
            } catch (err) {
              failed.push({ id, error: errorMessage(daemonError(err, url)) });
            }
          }),
        );
      }
      if (opts.json) printJson({ killed, failed });
      else {
        for (const id of killed) process.stdout.write(`${id}\n`);
        for (const f of failed) process.stderr.write(`forkd: ${f.id}: ${f.error}\n`);
        if (ids.length === 0 && killed.length === 0) process.stderr.write("forkd: no sandboxes to kill\n");
      }
      return failed.length > 0 ? EXIT.failure : EXIT.ok;
    }),
  );
}
