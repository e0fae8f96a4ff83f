/** `forkd teardown`: retire this host's forkd home (the Debian package runs it when removed). */
import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { retireHome } from "../../controller/sandboxes/retire-home.js";
import { EXIT } from "../exit-codes.js";
import { printJson } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerTeardown(program: Command): void {
  program
    .command("teardown")
    .description(
      "kill every sandbox of this FORKD_HOME and remove what it set up on the host (bridge, host rules, " +
        "cgroups, in-memory cache); snapshots, paused sandboxes and images stay. Refused while a daemon runs on it",
    )
    .option("--net-bridge <name>", "the bridge the daemon was given (default forkd0; env FORKD_NET_BRIDGE)")
    .option("--net-subnet <cidr>", "the subnet the daemon was given (env FORKD_NET_SUBNET)")
    .option("--json", "print {killed, bridge, remaining} as JSON")
    .action((opts) =>
      runCommand(async () => {
        const report = await retireHome(resolvePaths(), {
          network: { bridge: opts.netBridge, subnet: opts.netSubnet },
        });
        if (opts.json) printJson(report);
        else {
          for (const id of report.killed) process.stdout.write(`killed ${id}\n`);
          process.stdout.write(
            `removed the host network of ${resolvePaths().home} (bridge ${report.bridge})\n`,
          );
          if (report.remaining.length > 0) {
            process.stdout.write(
              `kept ${report.remaining.length} recorded sandboxes (paused): their state stays\n`,
            );
          }
        }
        return EXIT.ok;
      }),
    );
}
