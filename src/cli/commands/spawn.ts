/** `forkd spawn`: fork sandboxes from a snapshot through the daemon; they live until killed or timed out. */
import { type Command, Option } from "commander";
import { invalidArgument } from "../../common/errors.js";
import {
  DEFAULT_MEMORY_OVERHEAD_MIB,
  DEFAULT_PIDS_LIMIT,
  MAX_CPU_LIMIT_MILLICORES,
  MAX_DISK_LIMIT_MIB,
  MAX_MEMORY_LIMIT_MIB,
  MAX_PIDS_LIMIT,
  MAX_SANDBOX_TIMEOUT_MS,
  MAX_SPAWN_N,
  MIN_CPU_LIMIT_MILLICORES,
  MIN_DISK_LIMIT_MIB,
  MIN_MEMORY_LIMIT_MIB,
  MIN_PIDS_LIMIT,
} from "../../common/limits.js";
import type { SandboxInfo } from "../../sdk/index.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";
import { printJson, startProgress } from "../output.js";
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
          `memory limit per sandbox (default: guest RAM + ${DEFAULT_MEMORY_OVERHEAD_MIB} MiB where the host has the memory controller)`,
          parseIntOption("--memory-limit-mib", MIN_MEMORY_LIMIT_MIB, MAX_MEMORY_LIMIT_MIB),
        )
        .option(
          "--cpu-limit-millicores <n>",
          "CPU bandwidth per sandbox, thousandths of a CPU (default: one CPU per vCPU)",
          parseIntOption("--cpu-limit-millicores", MIN_CPU_LIMIT_MILLICORES, MAX_CPU_LIMIT_MILLICORES),
        )
        .option(
          "--pids-limit <n>",
          `processes and threads QEMU may have (default ${DEFAULT_PIDS_LIMIT})`,
          parseIntOption("--pids-limit", MIN_PIDS_LIMIT, MAX_PIDS_LIMIT),
        )
        .option(
          "--disk-limit-mib <mib>",
          "largest writable disk layer per sandbox (default: the daemon's --disk-limit-mib)",
          parseIntOption("--disk-limit-mib", MIN_DISK_LIMIT_MIB, MAX_DISK_LIMIT_MIB),
        )
        .option(
          "--timeout-ms <ms>",
          "lifetime (default: until killed, unless the daemon has --default-timeout-ms; 0 = until killed)",
          parseIntOption("--timeout-ms", 0, MAX_SANDBOX_TIMEOUT_MS),
        )
        .addOption(
          new Option("--on-timeout <action>", "what the end of the lifetime does: kill, or pause to disk")
            .choices(["kill", "pause"])
            .default("kill"),
        )
        .option("--live-fork", "map guest RAM from tmpfs so the sandboxes can be BRANCHed in live mode")
        .option("--no-network", 'a NIC that leads nowhere: no namespace, no egress (network "none")')
        .option("--json", "print the sandboxes as JSON"),
    ),
  ).action((opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const egress = egressFromOptions(opts);
      if (opts.network === false && egress) throw invalidArgument("--no-network excludes the egress flags");
      const progress = opts.json ? undefined : startProgress(`spawning ${opts.count} from ${opts.tag}`);
      let spawned: SandboxInfo[];
      try {
        spawned = await controller.spawnSandboxes({
          snapshotTag: opts.tag,
          n: opts.count,
          memoryLimitMib: opts.memoryLimitMib,
          cpuLimitMillicores: opts.cpuLimitMillicores,
          pidsLimit: opts.pidsLimit,
          diskLimitMib: opts.diskLimitMib,
          timeoutMs: opts.timeoutMs,
          ...(opts.onTimeout === "pause" ? { onTimeout: "pause" as const } : {}),
          ...(opts.liveFork ? { liveFork: true } : {}),
          ...(opts.network === false ? { network: "none" as const } : egress ? { network: egress } : {}),
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
