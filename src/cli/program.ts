/** The `forkd` program without its commands: name, version, how commander's exits map onto ours. */
import { Command } from "commander";
import { FORKD_VERSION } from "../common/version.js";
import { EXIT } from "./exit-codes.js";

export function baseProgram(): Command {
  return new Command("forkd")
    .description("microVM sandboxes for AI-agent fan-out: warm a parent VM once, fork copy-on-write children")
    .version(FORKD_VERSION)
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride((err) => {
      // commander prints its own message; map its exits onto ours (help/version are not errors).
      process.exit(err.exitCode === 0 ? EXIT.ok : EXIT.usage);
    });
}
