/** `sandbox.commands`: run a command in the sandbox, with its output streamed to callbacks as it happens. */
import { COMMAND_SHELL_ARGV } from "../../common/limits.js";
import type { Controller } from "../controller.js";
import { CommandExitError, type CommandResult, InvalidArgumentError } from "../errors.js";
import type { RequestOptions } from "../settings.js";

export type { CommandResult };

export interface CommandOptions extends RequestOptions {
  /** Called with each piece of stdout as it arrives (UTF-8 decoded; a character is never split). */
  onStdout?: (data: string) => unknown;
  onStderr?: (data: string) => unknown;
  /** Kill the command after this many ms; 0 = no limit. @default 60_000 */
  timeoutMs?: number;
  /** Environment variables added to the command's environment. */
  envs?: Record<string, string>;
  /** Absolute working directory. @default / */
  cwd?: string;
  /** The command's standard input: all at once, or streamed while it runs; closed at the end. */
  stdin?: string | Uint8Array | AsyncIterable<string | Uint8Array>;
}

/** Runs a shell command line through bash (COMMAND_SHELL_ARGV), like the E2B SDK; pass an array to run a program without a shell. */
export class Commands {
  /** @internal */
  constructor(
    private readonly controller: Controller,
    private readonly sandboxId: string,
    private readonly diagnose: (err: unknown, what: string) => Promise<unknown>,
  ) {}

  /**
   * Runs `cmd` and resolves when it exits 0 with its output. A string is a bash command line; an array is
   * the program and its arguments, run without a shell.
   * @throws CommandExitError when the command exits non-zero, is killed or runs past `timeoutMs`.
   */
  async run(cmd: string | string[], options: CommandOptions = {}): Promise<CommandResult> {
    const argv = typeof cmd === "string" ? [...COMMAND_SHELL_ARGV, cmd] : cmd;
    if (!Array.isArray(argv) || argv.length === 0) {
      throw new InvalidArgumentError(
        "cmd must be a command line or a non-empty array of program and arguments",
      );
    }
    const shown = typeof cmd === "string" ? JSON.stringify(cmd) : JSON.stringify(argv.join(" "));
    const stdout = new OutputCollector(options.onStdout);
    const stderr = new OutputCollector(options.onStderr);
    let result: CommandResult | undefined;
    try {
      const events = this.controller.execStream(this.sandboxId, argv, options);
      for await (const event of events) {
        if (event.type === "stdout") await stdout.push(event.data);
        else if (event.type === "stderr") await stderr.push(event.data);
        else {
          await stdout.end();
          await stderr.end();
          result = {
            exitCode: event.exitCode,
            stdout: stdout.text,
            stderr: stderr.text,
            signal: event.signal,
            timedOut: event.timedOut,
          };
        }
      }
    } catch (err) {
      throw await this.diagnose(err, `command ${shown}`);
    }
    if (result === undefined) throw new InvalidArgumentError(`command ${shown}: the daemon reported no exit`);
    if (result.exitCode !== 0) throw new CommandExitError(result, shown);
    return result;
  }
}

/** Decodes a byte stream to text without splitting characters, and feeds the caller's callback in order. */
class OutputCollector {
  private readonly decoder = new TextDecoder("utf-8");
  private readonly parts: string[] = [];

  constructor(private readonly onData?: (data: string) => unknown) {}

  get text(): string {
    return this.parts.join("");
  }

  async push(bytes: Uint8Array): Promise<void> {
    await this.emit(this.decoder.decode(bytes, { stream: true }));
  }

  async end(): Promise<void> {
    await this.emit(this.decoder.decode());
  }

  private async emit(text: string): Promise<void> {
    if (text === "") return;
    this.parts.push(text);
    // A callback that throws stops the command (the stream is abandoned) and its error is what `run` throws.
    await this.onData?.(text);
  }
}
