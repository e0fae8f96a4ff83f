/** `forkd ping`: a round trip to a sandbox's guest agent, through the daemon. */
import type { Command } from "commander";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { printJson } from "../output.js";

export function registerPing(program: Command): void {
  addDaemonOptions(
    program
      .command("ping")
      .description("round trip to a sandbox's guest agent (daemon)")
      .argument("<id>", "sandbox id")
      .option("--json", "print the agent's answer as JSON"),
  ).action((id: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const started = performance.now();
      const answer = await controller.pingSandbox(id, { signal });
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
