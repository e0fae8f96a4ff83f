/** `forkd set-timeout`: extend (or remove) a sandbox's lifetime. */
import type { Command } from "commander";
import type { SandboxInfoWire } from "../../api/schemas.js";
import { addDaemonOptions, DaemonClient, routePath } from "../daemon-client.js";
import { parseIntOption } from "../options.js";
import { printJson } from "../output.js";
import { runCommand } from "../run-command.js";
import { formatDuration } from "./ls.js";

export function registerSetTimeout(program: Command): void {
  addDaemonOptions(
    program
      .command("set-timeout")
      .description("set a sandbox's remaining lifetime from now (daemon); 0 = until killed")
      .argument("<id>", "sandbox id")
      .argument("<ms>", "milliseconds from now", parseIntOption("<ms>", 0, 7 * 24 * 3_600_000))
      .option("--json", "print the sandbox as JSON"),
  ).action((id: string, ms: number, opts, command: Command) =>
    runCommand(async (signal) => {
      const info = await DaemonClient.from(command).json<SandboxInfoWire>(
        "POST",
        routePath`/v1/sandboxes/${id}/timeout`,
        { json: { timeout_ms: ms }, signal },
      );
      if (opts.json) printJson(info);
      else {
        const left =
          info.expires_at_unix_ms === null ? "never" : formatDuration(info.expires_at_unix_ms - Date.now());
        process.stdout.write(`${id}: expires in ${left}\n`);
      }
      return undefined;
    }),
  );
}
