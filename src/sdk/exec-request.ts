/**
 * The body of an exec request (argv, env, cwd, stdin, the command's timeout as the wire needs it) and the NDJSON
 * request of an exec whose stdin is streamed.
 */
import { MAX_GUEST_TIMEOUT_MS, STDIN_FRAME_BYTES } from "../common/limits.js";
import { InvalidArgumentError } from "./errors.js";
import type { ExecCommandOptions } from "./options.js";
import { checkDurationMs, DEFAULT_COMMAND_TIMEOUT_MS } from "./settings.js";

/** The command's timeout in ms: `timeoutMs`, else forkd v0.5's `timeoutSecs`, else the SDKs' default; checked. */
export function commandTimeoutMs(options: Pick<ExecCommandOptions, "timeoutMs" | "timeoutSecs">): number {
  const timeoutMs =
    options.timeoutMs ??
    (options.timeoutSecs === undefined ? DEFAULT_COMMAND_TIMEOUT_MS : options.timeoutSecs * 1000);
  checkDurationMs(
    timeoutMs,
    options.timeoutMs === undefined && options.timeoutSecs !== undefined ? "timeoutSecs*1000" : "timeoutMs",
  );
  return timeoutMs;
}

/** "No limit" (0) becomes the daemon's longest timeout: the wire requires a bound. */
export function wireTimeoutMs(timeoutMs: number): number {
  return timeoutMs === 0 ? MAX_GUEST_TIMEOUT_MS : timeoutMs;
}

/** The JSON exec request (POST /v1/sandboxes/:id/exec and the first line of exec/stream). */
export function execBody(
  args: string[],
  options: Pick<ExecCommandOptions, "envs" | "cwd" | "stdin">,
  timeoutMs: number,
): Record<string, unknown> {
  if (!Array.isArray(args) || args.length === 0 || args.some((a) => typeof a !== "string")) {
    throw new InvalidArgumentError(
      "args must be a non-empty array of strings (the program and its arguments)",
    );
  }
  const body: Record<string, unknown> = { args, timeout_ms: wireTimeoutMs(timeoutMs) };
  if (options.envs !== undefined) body.env = options.envs;
  if (options.cwd !== undefined) body.cwd = options.cwd;
  return { ...body, ...inlineStdin(options.stdin) };
}

/** Stdin given whole rides in the request (text as `stdin`, bytes as `stdin_b64`). */
export function inlineStdin(
  stdin: string | Uint8Array | AsyncIterable<unknown> | undefined,
): Record<string, string> {
  if (typeof stdin === "string") return { stdin };
  if (stdin instanceof Uint8Array) return { stdin_b64: Buffer.from(stdin).toString("base64") };
  return {};
}

/** The NDJSON request of a streamed-stdin exec: the exec request, then one line per stdin chunk, then EOF. */
export async function* stdinFrames(
  exec: Record<string, unknown>,
  stdin: AsyncIterable<string | Uint8Array>,
): AsyncGenerator<Buffer> {
  yield Buffer.from(`${JSON.stringify(exec)}\n`);
  for await (const chunk of stdin) {
    const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : Buffer.from(chunk);
    for (let offset = 0; offset < bytes.length; offset += STDIN_FRAME_BYTES) {
      const part = bytes.subarray(offset, offset + STDIN_FRAME_BYTES).toString("base64");
      yield Buffer.from(`${JSON.stringify({ stdin_b64: part })}\n`);
    }
  }
  yield Buffer.from(`${JSON.stringify({ eof: true })}\n`);
}
