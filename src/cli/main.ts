/** Entry point of the `forkd` command line. */
import { Command } from "commander";
import { FORKD_VERSION } from "../common/version.js";
import { registerDaemonCommands } from "./commands/daemon-commands.js";
import { registerDoctor } from "./commands/doctor.js";
import { registerFork } from "./commands/fork.js";
import { registerImage } from "./commands/image.js";
import { registerPack } from "./commands/pack.js";
import { registerRegistry } from "./commands/registry.js";
import { registerSnapshot } from "./commands/snapshot.js";
import { registerSnapshotCompact } from "./commands/snapshot-compact.js";
import { registerSnapshotDiff } from "./commands/snapshot-diff.js";
import { registerSnapshotInfo } from "./commands/snapshot-info.js";
import { registerSnapshots } from "./commands/snapshots.js";
import { registerTeardown } from "./commands/teardown.js";
import { registerUnpack } from "./commands/unpack.js";
import { EXIT } from "./exit-codes.js";

export function buildProgram(): Command {
  const program = new Command("forkd")
    .description("microVM sandboxes for AI-agent fan-out: warm a parent VM once, fork copy-on-write children")
    .version(FORKD_VERSION)
    .showHelpAfterError("(run with --help for usage)")
    .exitOverride((err) => {
      // commander prints its own message; map its exits onto ours (help/version are not errors).
      process.exit(err.exitCode === 0 ? EXIT.ok : EXIT.usage);
    });
  registerImage(program);
  registerSnapshot(program);
  registerFork(program);
  registerSnapshots(program);
  registerSnapshotInfo(program);
  registerSnapshotDiff(program);
  registerSnapshotCompact(program);
  registerPack(program);
  registerUnpack(program);
  registerRegistry(program);
  registerDoctor(program);
  registerTeardown(program);
  registerDaemonCommands(program);
  return program;
}

await buildProgram().parseAsync(process.argv);
