/** Which single command an invocation needs (see LAZY_COMMANDS), so the CLI starts without loading the rest. */
import type { Command } from "commander";

/**
 * Commands that talk to a daemon, loaded alone when they are the one invoked: `forkd exec` then loads its own
 * module and the daemon client, not the engine, the API server and every other command (measured: 1.1 s of CPU
 * to start the whole CLI against 0.1 s for `exec`, bench/command). Any other invocation (help, version, the
 * rest) registers everything.
 */
export const LAZY_COMMANDS: Record<string, () => Promise<(program: Command) => void>> = {
  exec: async () => (await import("./commands/exec.js")).registerExec,
  eval: async () => (await import("./commands/eval.js")).registerEval,
  ls: async () => (await import("./commands/ls.js")).registerLs,
  kill: async () => (await import("./commands/kill.js")).registerKill,
  ping: async () => (await import("./commands/ping.js")).registerPing,
  pause: async () => (await import("./commands/pause.js")).registerPause,
  resume: async () => (await import("./commands/pause.js")).registerResume,
  "set-timeout": async () => (await import("./commands/set-timeout.js")).registerSetTimeout,
};
/** Options of the program itself that take a value (so the command name is found after them). */
const GLOBAL_VALUE_OPTIONS = new Set(["--daemon-url", "--daemon-token"]);

/** The command `argv` invokes, when it is one of LAZY_COMMANDS and nothing else asks for the whole program. */
export function lazyCommand(argv: readonly string[]): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (GLOBAL_VALUE_OPTIONS.has(arg)) {
      i++;
      continue;
    }
    if (arg.startsWith("--daemon-url=") || arg.startsWith("--daemon-token=")) continue;
    if (arg.startsWith("-")) return undefined;
    return Object.hasOwn(LAZY_COMMANDS, arg) ? arg : undefined;
  }
  return undefined;
}
