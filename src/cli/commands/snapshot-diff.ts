/** `forkd snapshot-diff --from BASE --tag NEW --exec CMD`: a new layer on BASE made by running a command (daemon). */
import type { Command } from "commander";
import { MAX_GUEST_TIMEOUT_MS } from "../../common/limits.js";
import type { SnapshotDiffResult } from "../../sdk/index.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";
import { printJson, startProgress } from "../output.js";

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
        parseIntOption("--timeout-ms", 1, MAX_GUEST_TIMEOUT_MS),
      )
      .option("--json", "print the result as JSON")
      .addHelpText(
        "after",
        "\nExample:\n  forkd snapshot-diff --from pyagent --tag py-sympy --exec 'apt-get install -y python3-sympy'\n",
      ),
  ).action((opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const progress = opts.json ? undefined : startProgress(`building ${opts.tag} on ${opts.from}`);
      let result: SnapshotDiffResult;
      try {
        result = await controller.snapshotDiff(opts.from, {
          tag: opts.tag,
          exec: opts.exec,
          ...(opts.timeoutMs ? { execTimeoutMs: opts.timeoutMs } : {}),
          signal,
        });
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
