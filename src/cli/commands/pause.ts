/** `forkd pause` and `forkd resume`: a sandbox's state to disk with its VM stopped, and back under the same id. */
import type { Command } from "commander";
import { invalidArgument } from "../../common/errors.js";
import { MAX_SANDBOX_TIMEOUT_MS } from "../../common/limits.js";
import { isValidSandboxId } from "../../common/names.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";
import { printJson } from "../output.js";
import { formatDuration } from "./ls.js";

function checkedId(id: string): string {
  if (!isValidSandboxId(id)) throw invalidArgument(`invalid sandbox id ${JSON.stringify(id)}`);
  return id;
}

export function registerPause(program: Command): void {
  addDaemonOptions(
    program
      .command("pause")
      .description("pause a running sandbox (daemon): its state on disk, its VM stopped, its RAM given back")
      .argument("<id>", "sandbox id")
      .option("--merge", "write one layer holding everything since its snapshot (merging earlier pauses)")
      .option("--json", "print the pause (sandbox, layer, timings, bytes) as JSON"),
  ).action((id: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const outcome = await controller.pauseSandbox(checkedId(id), {
        ...(opts.merge ? { merge: true } : {}),
        signal,
      });
      if (opts.json) printJson(outcome);
      else {
        const mib = (bytes: number) => `${(bytes / 1048576).toFixed(1)} MiB`;
        process.stdout.write(
          `${id}: paused into ${outcome.tag} (guest stopped ${outcome.pause_ms.toFixed(0)} ms, ` +
            `${mib(outcome.bytes_stored)} stored, ${mib(outcome.freed_bytes)} RAM freed` +
            `${outcome.merged ? ", earlier pauses merged" : ""})\n`,
        );
      }
      return undefined;
    }),
  );
}

export function registerResume(program: Command): void {
  addDaemonOptions(
    program
      .command("resume")
      .description("resume a paused sandbox (daemon) under the same id, where it was")
      .argument("<id>", "sandbox id")
      .option(
        "--timeout-ms <ms>",
        "lifetime from now (default: the one it had; 0 = until killed)",
        parseIntOption("--timeout-ms", 0, MAX_SANDBOX_TIMEOUT_MS),
      )
      .option("--json", "print the sandbox as JSON"),
  ).action((id: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const info = await controller.resumeSandbox(checkedId(id), { timeoutMs: opts.timeoutMs, signal });
      if (opts.json) printJson(info);
      else {
        const left =
          info.expires_at_unix_ms == null ? "never" : formatDuration(info.expires_at_unix_ms - Date.now());
        process.stdout.write(`${id}: ${info.status}, pid ${info.pid ?? "-"}, expires in ${left}\n`);
      }
      return undefined;
    }),
  );
}
