/**
 * `forkd exec <id> -- cmd...`: runs a command in a sandbox through the daemon's streaming exec, copying its output
 * byte for byte as it happens, and exits with the command's exit code. `-i` streams this process's stdin to it.
 */
import { type Command, InvalidArgumentError } from "commander";
import { readNdjson } from "../../api/ndjson.js";
import { MAX_EXEC_ARGS } from "../../api/schemas.js";
import { ERROR_CODES, type ErrorCode, ForkdError, invalidArgument } from "../../common/errors.js";
import { addDaemonOptions, DaemonClient, routePath } from "../daemon-client.js";
import { EXIT } from "../exit-codes.js";
import { parseIntOption } from "../options.js";
import { runCommand } from "../run-command.js";

/** Stdin is sent in frames of this many bytes (base64 in NDJSON lines, well under the daemon's line limit). */
const STDIN_FRAME_BYTES = 256 * 1024;

interface ExecEvent {
  type: string;
  data?: string;
  exit_code?: number;
  error?: string;
  code?: string;
}

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
        "kill the command after this long (default 30 s)",
        parseIntOption("--timeout-ms", 1, 86_400_000),
      )
      .addHelpText("after", "\nExample:\n  forkd exec sb-0123456789ab -- python3 -c 'print(2+2)'\n"),
  ).action((id: string, argv: string[], opts, command: Command) =>
    runCommand(async (signal) => {
      if (argv.length > MAX_EXEC_ARGS) throw invalidArgument(`at most ${MAX_EXEC_ARGS} arguments`);
      const request = {
        args: argv,
        encoding: "base64" as const,
        ...(Object.keys(opts.env).length > 0 ? { env: opts.env } : {}),
        ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }),
        ...(opts.timeoutMs === undefined ? {} : { timeout_ms: opts.timeoutMs }),
      };
      const client = DaemonClient.from(command);
      const route = routePath`/v1/sandboxes/${id}/exec/stream`;
      const response = opts.interactive
        ? await client.stream("POST", route, {
            bodyStream: ndjsonRequest(request, process.stdin),
            contentType: "application/x-ndjson",
            signal,
          })
        : await client.stream("POST", route, { json: request, signal });
      const events = readNdjson(response, 16 * 1024 * 1024);
      for await (const line of brokenConnectionNamed(events, id)) {
        const event = line as ExecEvent;
        if (event.type === "stdout" || event.type === "stderr") {
          const out = event.type === "stdout" ? process.stdout : process.stderr;
          if (!out.write(Buffer.from(event.data ?? "", "base64"))) {
            await new Promise((resolve) => out.once("drain", resolve));
          }
        } else if (event.type === "exit") {
          return event.exit_code ?? EXIT.failure;
        } else if (event.type === "error") {
          const code = (event.code && event.code in ERROR_CODES ? event.code : "internal") as ErrorCode;
          throw new ForkdError(code, `exec in ${id}: ${event.error ?? "failed"}`);
        }
      }
      throw new ForkdError(
        "unavailable",
        `exec in ${id}: the daemon closed the stream before the command exited`,
      );
    }),
  );
}

async function* ndjsonRequest(request: object, stdin: NodeJS.ReadableStream): AsyncGenerator<string> {
  yield `${JSON.stringify(request)}\n`;
  for await (const chunk of stdin as AsyncIterable<Buffer>) {
    for (let at = 0; at < chunk.length; at += STDIN_FRAME_BYTES) {
      yield `${JSON.stringify({ stdin_b64: chunk.subarray(at, at + STDIN_FRAME_BYTES).toString("base64") })}\n`;
    }
  }
}

function collectEnv(value: string, previous: Record<string, string>): Record<string, string> {
  const eq = value.indexOf("=");
  const name = eq === -1 ? value : value.slice(0, eq);
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new InvalidArgumentError("expected NAME=value");
  const fromHere = eq === -1 ? process.env[name] : value.slice(eq + 1);
  if (fromHere === undefined) throw new InvalidArgumentError(`${name} is not set here; give NAME=value`);
  return { ...previous, [name]: fromHere };
}

/** A connection that breaks mid-stream (daemon stopped, network) is named as such, not as a bare "aborted". */
async function* brokenConnectionNamed(events: AsyncGenerator<unknown>, id: string): AsyncGenerator<unknown> {
  try {
    yield* events;
  } catch (err) {
    if (err instanceof ForkdError) throw err;
    throw new ForkdError(
      "unavailable",
      `exec in ${id}: the connection to the daemon broke (${(err as Error).message})`,
    );
  }
}
