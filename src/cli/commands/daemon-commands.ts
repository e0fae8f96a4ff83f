/** Every command that runs or talks to the daemon, registered in one place (src/cli/main.ts calls this). */
import type { Command } from "commander";
import { addDaemonOptions } from "../daemon-connection.js";
import { registerConsole } from "./console.js";
import { registerDaemon } from "./daemon.js";
import { registerEval } from "./eval.js";
import { registerExec } from "./exec.js";
import { registerFiles } from "./files.js";
import { registerImages } from "./images.js";
import { registerKill } from "./kill.js";
import { registerLs } from "./ls.js";
import { registerMcp } from "./mcp.js";
import { registerNetwork } from "./network.js";
import { registerPause, registerResume } from "./pause.js";
import { registerPing } from "./ping.js";
import { registerPort } from "./port.js";
import { registerSetTimeout } from "./set-timeout.js";
import { registerSpawn } from "./spawn.js";
import { registerWorkspace } from "./workspace.js";

export function registerDaemonCommands(program: Command): void {
  addDaemonOptions(program);
  registerDaemon(program);
  registerSpawn(program);
  registerLs(program);
  registerKill(program);
  registerPause(program);
  registerResume(program);
  registerWorkspace(program);
  registerExec(program);
  registerEval(program);
  registerPing(program);
  registerConsole(program);
  registerSetTimeout(program);
  registerFiles(program);
  registerNetwork(program);
  registerPort(program);
  registerImages(program);
  registerMcp(program);
}
