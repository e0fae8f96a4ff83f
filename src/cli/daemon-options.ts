/**
 * The daemon commands' options, apart from the client (daemon-connection.ts) so that registering them loads
 * nothing else: src/cli/main.ts adds them to the program before it knows which command runs.
 */
import type { Command } from "commander";
import { DAEMON_TOKEN_ENV, DAEMON_URL_ENV } from "../common/limits.js";

/** `--daemon-url`/`--daemon-token` on a command (and on the program, for `forkd --daemon-url ... ls`). */
export function addDaemonOptions(command: Command): Command {
  return command
    .option("--daemon-url <url>", `daemon address: unix:/path or http(s)://host:port (env ${DAEMON_URL_ENV})`)
    .option(
      "--daemon-token <token>",
      `bearer token for a TCP daemon (prefer env ${DAEMON_TOKEN_ENV}: arguments are visible to other users)`,
    );
}
