/** `forkd eval <id> CODE`: Python in a sandbox's warm interpreter, through the daemon. */
import { readFile } from "node:fs/promises";
import type { Command } from "commander";
import { MAX_GUEST_TIMEOUT_MS } from "../../common/limits.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "../options.js";
import { printJson } from "../output.js";

export function registerEval(program: Command): void {
  addDaemonOptions(
    program
      .command("eval")
      .description(
        "evaluate Python in a sandbox's warm interpreter (daemon); prints repr() of the last expression",
      )
      .argument("<id>", "sandbox id")
      .argument("<code>", "Python code, or - to read it from stdin")
      .option(
        "--timeout-ms <ms>",
        "limit for the evaluation",
        parseIntOption("--timeout-ms", 1, MAX_GUEST_TIMEOUT_MS),
      )
      .option("--json", "print the whole answer as JSON")
      .addHelpText("after", "\nExample:\n  forkd eval sb-0123456789ab 'numpy.arange(3).sum()'\n"),
  ).action((id: string, code: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const source = code === "-" ? await readFile("/dev/stdin", "utf8") : code;
      // Without --timeout-ms the SDK's default applies (60 s, the daemon's own default for an eval too).
      const answer = await controller.evalCode(id, source, { timeoutMs: opts.timeoutMs, signal });
      if (opts.json) {
        printJson(answer);
        return answer.exit_code === 0 ? EXIT.ok : EXIT.failure;
      }
      process.stdout.write(answer.stdout ?? "");
      process.stderr.write(answer.stderr ?? "");
      if (answer.result !== null) process.stdout.write(`${answer.result}\n`);
      if (answer.error !== null) process.stderr.write(answer.traceback ?? `${answer.error}\n`);
      return answer.exit_code === 0 ? EXIT.ok : EXIT.failure;
    }),
  );
}
