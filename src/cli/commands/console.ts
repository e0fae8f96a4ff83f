/** `forkd console <id>`: the end of a sandbox's serial console, as the daemon kept it (bounded per sandbox). */
import type { Command } from "commander";
import { CONSOLE_READ_BYTES, MAX_CONSOLE_READ_BYTES } from "../../common/limits.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";

export function registerConsole(program: Command): void {
  addDaemonOptions(
    program
      .command("console")
      .description("print the end of a sandbox's serial console (daemon; kept across daemon restarts)")
      .argument("<id>", "sandbox id")
      .option(
        "--bytes <n>",
        `how much of the end to print (default ${CONSOLE_READ_BYTES / 1024} KiB)`,
        parseIntOption("--bytes", 1, MAX_CONSOLE_READ_BYTES),
      ),
  ).action((id: string, opts: { bytes?: number }, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      process.stdout.write(await controller.readConsole(id, { bytes: opts.bytes, signal }));
      return undefined;
    }),
  );
}
