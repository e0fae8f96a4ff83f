/** `forkd ping`: a round trip to a sandbox's guest agent, through the daemon. */
import type { Command } from "commander";
import { addDaemonOptions, DaemonClient, routePath } from "../daemon-client.js";
import { printJson } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerPing(program: Command): void {
  addDaemonOptions(
    program
      .command("ping")
      .description("round trip to a sandbox's guest agent (daemon)")
      .argument("<id>", "sandbox id")
      .option("--json", "print the agent's answer as JSON"),
  ).action((id: string, opts, command: Command) =>
    runCommand(async (signal) => {
      const started = performance.now();
      const answer = await DaemonClient.from(command).json<Record<string, unknown>>(
        "POST",
        routePath`/v1/sandboxes/${id}/ping`,
        { signal },
      );
      const ms = performance.now() - started;
      if (opts.json) printJson(answer);
      else
        process.stdout.write(
          `${id}: agent ${String(answer.agent_version)}, ${String(answer.interpreter)} ${String(answer.warm)}, ` +
            `${ms.toFixed(1)} ms\n`,
        );
      return undefined;
    }),
  );
}
