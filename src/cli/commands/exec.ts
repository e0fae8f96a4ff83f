/**
 * `forkd exec <id> -- cmd...`: runs a command in a sandbox through the daemon's streaming exec, copying its output
 * byte for byte as it happens, and exits with the command's exit code. `-i` streams this process's stdin to it.
 */
import { type Command, InvalidArgumentError } from "commander";
import { ERROR_CODES, type ErrorCode, ForkdError, invalidArgument } from "../../common/errors.js";
import {
  DEFAULT_EXEC_TIMEOUT_SECS,
  ENV_NAME_PATTERN,
  MAX_EXEC_ARGS,
  MAX_GUEST_TIMEOUT_MS,
} from "../../common/limits.js";
import { ConnectionError, ForkdSdkError } from "../../sdk/index.js";
import { addDaemonOptions, connectFailed, runDaemonCommand } from "../daemon-connection.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "../options.js";

export function registerExec(program: Command): void {
  addDaemonOptions(
    program
      .command("exec")
      .description("run a command in a sandbox (daemon), streaming its output; exits with its exit code")
      .argument("<id>", "sandbox id")
      .argument("<command...>", "the command and its arguments (put them after `--`)")
      .option("-i, --interactive", "send this process's stdin to the command")
      .option("-e, --env <NAME=value>", "environment variable (repeatable)", collectEnv, {})
      .option("-w, --cwd <dir>", "working directory in the sandbox (absolute)")
      .option(
        "--timeout-ms <ms>",
        `kill the command after this long (default ${DEFAULT_EXEC_TIMEOUT_SECS} s)`,
        parseIntOption("--timeout-ms", 1, MAX_GUEST_TIMEOUT_MS),
      )
      .addHelpText("after", "\nExample:\n  forkd exec sb-0123456789ab -- python3 -c 'print(2+2)'\n"),
  ).action((id: string, argv: string[], opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      if (argv.length > MAX_EXEC_ARGS) throw invalidArgument(`at most ${MAX_EXEC_ARGS} arguments`);
      const events = controller.execStream(id, argv, {
        ...(Object.keys(opts.env).length > 0 ? { envs: opts.env } : {}),
        ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }),
        timeoutMs: opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_SECS * 1000,
        ...(opts.interactive ? { stdin: process.stdin as AsyncIterable<Buffer> } : {}),
        signal,
      });
      try {
        for await (const event of events) {
          if (event.type === "exit") return event.exitCode;
          const out = event.type === "stdout" ? process.stdout : process.stderr;
          if (!out.write(event.data)) await new Promise((resolve) => out.once("drain", resolve));
        }
      } catch (err) {
        throw streamError(err, id);
      }
      return EXIT.failure;
    }),
  );
}

/**
 * An error the daemon reported inside the stream (the command could not run on) or a connection that broke
 * mid-stream is named as the exec's; an answer the daemon refused the exec with is its own message.
 */
function streamError(err: unknown, id: string): unknown {
  if (!(err instanceof ForkdSdkError) || err.status !== undefined) return err;
  if (err.code !== undefined) {
    const code = (err.code in ERROR_CODES ? err.code : "internal") as ErrorCode;
    return new ForkdError(code, `exec in ${id}: ${err.serverMessage ?? err.message}`);
  }
  if (err instanceof ConnectionError && !connectFailed(err)) {
    const cause = err.cause instanceof Error ? err.cause.message : err.message;
    return new ForkdError("unavailable", `exec in ${id}: the connection to the daemon broke (${cause})`);
  }
  return err;
}

function collectEnv(value: string, previous: Record<string, string>): Record<string, string> {
  const eq = value.indexOf("=");
  const name = eq === -1 ? value : value.slice(0, eq);
  if (!new RegExp(ENV_NAME_PATTERN).test(name)) throw new InvalidArgumentError("expected NAME=value");
  const fromHere = eq === -1 ? process.env[name] : value.slice(eq + 1);
  if (fromHere === undefined) throw new InvalidArgumentError(`${name} is not set here; give NAME=value`);
  return { ...previous, [name]: fromHere };
}
