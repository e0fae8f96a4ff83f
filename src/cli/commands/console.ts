/** `forkd console <id>`: the end of a sandbox's serial console, as the daemon kept it (bounded per sandbox). */
import type { Command } from "commander";
import { MAX_CONSOLE_READ_BYTES } from "../../controller/sandboxes/manager.js";
import { addDaemonOptions, DaemonClient, routePath } from "../daemon-client.js";
import { parseIntOption } from "../options.js";
import { runCommand } from "../run-command.js";

export function registerConsole(program: Command): void {
  addDaemonOptions(
    program
      .command("console")
      .description("print the end of a sandbox's serial console (daemon; kept across daemon restarts)")
      .argument("<id>", "sandbox id")
      .option(
        "--bytes <n>",
        "how much of the end to print (default 64 KiB)",
        parseIntOption("--bytes", 1, MAX_CONSOLE_READ_BYTES),
      ),
  ).action((id: string, opts: { bytes?: number }, command: Command) =>
    runCommand(async (signal) => {
      const { body } = await DaemonClient.from(command).request(
        "GET",
        routePath`/v1/sandboxes/${id}/console`,
        {
          query: { bytes: opts.bytes },
          signal,
        },
      );
      process.stdout.write(body);
      return undefined;
    }),
  );
}
