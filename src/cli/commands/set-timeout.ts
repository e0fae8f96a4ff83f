/** `forkd set-timeout`: extend (or remove) a sandbox's lifetime. */
import type { Command } from "commander";
import { MAX_SANDBOX_TIMEOUT_MS } from "../../common/limits.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";
import { printJson } from "../output.js";
import { formatDuration } from "./ls.js";

export function registerSetTimeout(program: Command): void {
  addDaemonOptions(
    program
      .command("set-timeout")
      .description("set a sandbox's remaining lifetime from now (daemon); 0 = until killed")
      .argument("<id>", "sandbox id")
      .argument("<ms>", "milliseconds from now", parseIntOption("<ms>", 0, MAX_SANDBOX_TIMEOUT_MS))
      .option("--json", "print the sandbox as JSON"),
  ).action((id: string, ms: number, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const info = await controller.setSandboxTimeout(id, ms, { signal });
      if (opts.json) printJson(info);
      else {
        const left =
          info.expires_at_unix_ms == null ? "never" : formatDuration(info.expires_at_unix_ms - Date.now());
        process.stdout.write(`${id}: expires in ${left}\n`);
      }
      return undefined;
    }),
  );
}
