import type { Command } from "commander";
import { invalidArgument } from "../../common/errors.js";
import { MAX_GUEST_TIMEOUT_MS, MAX_SANDBOX_TIMEOUT_MS, MAX_SPAWN_N } from "../../common/limits.js";
import { resolvePaths } from "../../common/paths.js";
import { percentile } from "../../common/stats.js";
import { type ForkResult, failedChildren, forkChildren } from "../../controller/sandboxes/fork-children.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "../options.js";
import { oneLine, printJson, printTable, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

/** Where the commands take it from now (the name stays exported here for code that still imports it from fork). */
export { parseIntOption };

export function registerFork(program: Command): void {
  program
    .command("fork")
    .description("restore N copy-on-write children from a snapshot, optionally run a command or code in each")
    .requiredOption("-t, --tag <tag>", "snapshot tag")
    .option(
      "-n, --count <n>",
      `number of children (1..${MAX_SPAWN_N})`,
      parseIntOption("-n", 1, MAX_SPAWN_N),
      1,
    )
    .option("--exec [command...]", "command to run in each child (put it after `--` if it has flags)")
    .option("--eval <code>", "Python code to evaluate in each child's warm interpreter")
    .option("--concurrency <c>", "children restored at once", parseIntOption("--concurrency", 1, MAX_SPAWN_N))
    .option(
      "--timeout-ms <ms>",
      "limit for --exec/--eval in each child",
      parseIntOption("--timeout-ms", 1, MAX_GUEST_TIMEOUT_MS),
    )
    .option(
      "--settle-secs <s>",
      "keep the children running this many seconds after they answered, then stop them (forkd v0.5's flag; " +
        "SIGTERM or Ctrl-C ends the wait early)",
      parseIntOption("--settle-secs", 0, MAX_SANDBOX_TIMEOUT_MS / 1000),
    )
    .option("--json", "print one JSON object")
    .argument("[command...]", "the --exec command, when given after `--`")
    .addHelpText(
      "after",
      "\nExamples:\n  forkd fork --tag pyagent -n 100 --eval 'numpy.zeros(5).tolist()'\n" +
        "  forkd fork --tag pyagent -n 3 --exec -- python3 -c 'import uuid; print(uuid.uuid4())'\n",
    )
    .action((operands: string[], opts) =>
      runCommand(async (signal) => {
        const exec = resolveExec(opts.exec, operands);
        const progress = opts.json ? undefined : startProgress(`forking ${opts.count} from ${opts.tag}`);
        let done = 0;
        const result = await forkChildren(resolvePaths(), {
          tag: opts.tag,
          n: opts.count,
          exec,
          eval: opts.eval,
          concurrency: opts.concurrency,
          workTimeoutMs: opts.timeoutMs,
          ...(opts.settleSecs === undefined ? {} : { settleMs: opts.settleSecs * 1000 }),
          signal,
          onChild: () => {
            done++;
            progress?.update(`forking from ${opts.tag}: ${done}/${opts.count} answered`);
            if (done === opts.count && opts.settleSecs !== undefined) {
              progress?.update(`all answered; letting them run for ${opts.settleSecs} s`);
            }
          },
        }).finally(() => progress?.stop());
        if (opts.json) printJson(jsonView(result));
        else printHuman(result);
        return failedChildren(result).length > 0 ? EXIT.failure : EXIT.ok;
      }),
    );
}

/** `--exec a b` or `--exec -- a -b`: commander leaves what follows `--` in the command's operands. */
function resolveExec(flag: unknown, operands: string[]): string[] | undefined {
  if (flag === undefined) {
    if (operands.length > 0)
      throw invalidArgument(`unexpected arguments: ${operands.join(" ")} (use --exec)`);
    return undefined;
  }
  const argv = [...(Array.isArray(flag) ? (flag as string[]) : []), ...operands];
  if (argv.length === 0) throw invalidArgument("--exec needs a command");
  return argv;
}

function jsonView(result: ForkResult) {
  return {
    accelerator: result.accelerator,
    n: result.n,
    wall_ms: result.wall_ms,
    children: result.children.map((c) => ({
      index: c.index,
      id: c.id,
      ready_ms: c.ready_ms,
      exit_code: c.exit_code,
      stdout: c.stdout,
      stderr: c.stderr,
      result: c.result,
      error: c.error,
    })),
    ...(result.settle ? { settle_ms: result.settle.ms, alive_after_settle: result.settle.alive } : {}),
  };
}

function printHuman(result: ForkResult): void {
  printTable(
    ["#", "ID", "READY_MS", "DONE_MS", "EXIT", "RESULT / STDOUT", "ERROR"],
    result.children.map((c) => [
      String(c.index),
      c.id ?? "-",
      c.ready_ms === null ? "-" : c.ready_ms.toFixed(0),
      c.done_ms.toFixed(0),
      c.exit_code === null ? "-" : String(c.exit_code),
      oneLine(c.result ?? c.stdout, 40),
      oneLine(c.error ?? "", 50),
    ]),
  );
  const ready = result.children.flatMap((c) => (c.ready_ms === null ? [] : [c.ready_ms]));
  const failed = failedChildren(result).length;
  process.stdout.write(
    `\n${result.n - failed}/${result.n} ok on ${result.accelerator} in ${result.wall_ms.toFixed(0)} ms wall; ` +
      `ready p50 ${percentile(ready, 50).toFixed(0)} ms, p99 ${percentile(ready, 99).toFixed(0)} ms\n`,
  );
  if (result.settle) {
    process.stdout.write(
      `${result.settle.alive}/${result.n} still alive after settling ${(result.settle.ms / 1000).toFixed(1)} s\n`,
    );
  }
}
