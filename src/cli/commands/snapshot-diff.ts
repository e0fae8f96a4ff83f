/** `forkd snapshot-diff --from BASE --tag NEW --exec CMD`: a new layer on BASE made by running a command (daemon). */
import type { Command } from "commander";
import type { BranchResultWire } from "../../api/schemas.js";
import { addDaemonOptions, DaemonClient } from "../daemon-client.js";
import { parseIntOption } from "../options.js";
import { printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

type DiffResult = BranchResultWire & { exit_code: number; stdout: string; stderr: string };

export function registerSnapshotDiff(program: Command): void {
  addDaemonOptions(
    program
      .command("snapshot-diff")
      .description(
        "layer a new snapshot on BASE: spawn from it, run a command (a failure aborts with its output), " +
          "BRANCH the result in diff mode (only what changed is stored)",
      )
      .requiredOption("--from <base>", "snapshot to build on")
      .requiredOption("-t, --tag <tag>", "tag of the new layer")
      .requiredOption("--exec <command>", "shell command to run in the sandbox (sh -c)")
      .option(
        "--timeout-ms <ms>",
        "limit for the command (default 30 minutes)",
        parseIntOption("--timeout-ms", 1, 86_400_000),
      )
      .option("--json", "print the result as JSON")
      .addHelpText(
        "after",
        "\nExample:\n  forkd snapshot-diff --from pyagent --tag py-sympy --exec 'apt-get install -y python3-sympy'\n",
      ),
  ).action((opts, command: Command) =>
    runCommand(async (signal) => {
      const progress = opts.json ? undefined : startProgress(`building ${opts.tag} on ${opts.from}`);
      let result: DiffResult;
      try {
        result = await DaemonClient.from(command).json<DiffResult>(
          "POST",
          `/v1/snapshots/${encodeURIComponent(opts.from)}/diff`,
          {
            json: {
              tag: opts.tag,
              exec: opts.exec,
              ...(opts.timeoutMs ? { timeout_ms: opts.timeoutMs } : {}),
            },
            signal,
          },
        );
      } catch (err) {
        progress?.fail(`snapshot-diff ${opts.tag} failed`);
        throw err;
      }
      progress?.succeed(
        `snapshot ${result.tag} on ${result.parent_tag}: ${(result.bytes_written / 2 ** 20).toFixed(1)} MiB written ` +
          `(${(result.bytes_captured / 2 ** 20).toFixed(1)} MiB of RAM changed)`,
      );
      if (opts.json) printJson(result);
      return undefined;
    }),
  );
}
