/** Every command of the `forkd` CLI, registered on one program (src/cli/main.ts loads this unless one lazy command is invoked). */
import type { Command } from "commander";
import { registerClusterController } from "./commands/cluster-controller.js";
import { registerDaemonCommands } from "./commands/daemon-commands.js";
import { registerDoctor } from "./commands/doctor.js";
import { registerFork } from "./commands/fork.js";
import { registerGateway } from "./commands/gateway.js";
import { registerImage } from "./commands/image.js";
import { registerPack } from "./commands/pack.js";
import { registerRegistry } from "./commands/registry.js";
import { registerSnapshot } from "./commands/snapshot.js";
import { registerSnapshotCompact } from "./commands/snapshot-compact.js";
import { registerSnapshotDiff } from "./commands/snapshot-diff.js";
import { registerSnapshotInfo } from "./commands/snapshot-info.js";
import { registerSnapshots } from "./commands/snapshots.js";
import { registerTeardown } from "./commands/teardown.js";
import { registerToken } from "./commands/token.js";
import { registerUnpack } from "./commands/unpack.js";

export function registerAll(program: Command): Command {
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
  registerToken(program);
  registerDaemonCommands(program);
  registerGateway(program);
  registerClusterController(program);
  return program;
}
