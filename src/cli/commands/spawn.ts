/** `forkd spawn`: fork sandboxes from a snapshot through the daemon; they live until killed or timed out. */
import type { Command } from "commander";
import type { SandboxInfoWire } from "../../api/schemas.js";
import { MAX_SPAWN_N } from "../../api/schemas.js";
import { invalidArgument } from "../../common/errors.js";
import { addDaemonOptions, DaemonClient } from "../daemon-client.js";
import { printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";
import { parseIntOption } from "./fork.js";
import { printSandboxes } from "./ls.js";
import { addEgressOptions, egressFromOptions } from "./network.js";

export function registerSpawn(program: Command): void {
  addDaemonOptions(
    addEgressOptions(
      program
        .command("spawn")
        .description("fork sandboxes from a snapshot (daemon); they run until killed or their timeout passes")
        .requiredOption("-t, --tag <tag>", "snapshot tag")
        .option(
          "-n, --count <n>",
          `number of sandboxes (1..${MAX_SPAWN_N})`,
          parseIntOption("-n", 1, MAX_SPAWN_N),
          1,
        )
        .option(
          "--memory-limit-mib <mib>",
          "memory limit per sandbox",
          parseIntOption("--memory-limit-mib", 1, 1 << 20),
        )
        .option(
          "--timeout-ms <ms>",
          "lifetime (default: until killed, unless the daemon has --default-timeout-ms; 0 = until killed)",
          parseIntOption("--timeout-ms", 0, 7 * 24 * 3_600_000),
        )
        .option("--live-fork", "map guest RAM from tmpfs so the sandboxes can be BRANCHed in live mode")
        .option("--no-network", 'a NIC that leads nowhere: no namespace, no egress (network "none")')
        .option("--json", "print the sandboxes as JSON"),
    ),
  ).action((opts, command: Command) =>
    runCommand(async (signal) => {
      const client = DaemonClient.from(command);
      const egress = egressFromOptions(opts);
      if (opts.network === false && egress) throw invalidArgument("--no-network excludes the egress flags");
      const progress = opts.json ? undefined : startProgress(`spawning ${opts.count} from ${opts.tag}`);
      let spawned: SandboxInfoWire[];
      try {
        spawned = await client.json<SandboxInfoWire[]>("POST", "/v1/sandboxes", {
          json: {
            snapshot_tag: opts.tag,
            n: opts.count,
            ...(opts.memoryLimitMib === undefined ? {} : { memory_limit_mib: opts.memoryLimitMib }),
            ...(opts.timeoutMs === undefined ? {} : { timeout_ms: opts.timeoutMs }),
            ...(opts.liveFork ? { live_fork: true } : {}),
            ...(opts.network === false ? { network: "none" } : egress ? { network: egress } : {}),
          },
          signal,
        });
        progress?.succeed(`spawned ${spawned.length} from ${opts.tag}`);
      } catch (err) {
        progress?.fail(`spawn from ${opts.tag} failed`);
        throw err;
      }
      if (opts.json) printJson(spawned);
      else printSandboxes(spawned);
      return undefined;
    }),
  );
}
