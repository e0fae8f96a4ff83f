/** Entry point of the `forkd` command line. */
import type { Command } from "commander";
import { addDaemonOptions } from "./daemon-options.js";
import { LAZY_COMMANDS, lazyCommand } from "./lazy-commands.js";
import { baseProgram } from "./program.js";

/** Only the invoked command when it is a lazy one, else everything. */
export async function programFor(argv: readonly string[]): Promise<Command> {
  const name = lazyCommand(argv.slice(2));
  if (name === undefined) return (await import("./all-commands.js")).registerAll(baseProgram());
  const program = addDaemonOptions(baseProgram());
  (await (LAZY_COMMANDS[name] as () => Promise<(program: Command) => void>)())(program);
  return program;
}

await (await programFor(process.argv)).parseAsync(process.argv);
