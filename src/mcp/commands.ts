/**
 * Commands run by the MCP server's tools, through the SDK's streamed exec. A command either runs to its end (or
 * its timeout), or, with `waitForText`, until that text shows up in its output: then the tool answers and the
 * command keeps running in the background, attached to this MCP session (its output so far is a resource, and
 * `stop_command` ends it). Background commands end when the session closes.
 */
import type { Controller } from "../sdk/index.js";

/** Output of a background command kept in memory: its last part. */
export const MAX_BACKGROUND_OUTPUT_CHARS = 1024 * 1024;
/** Output of a command run to its end kept in memory (the tool result shows 8 KiB; the rest is a resource). */
export const MAX_COMMAND_OUTPUT_CHARS = 16 * 1024 * 1024;
/** Background commands one session may have running at once. */
export const MAX_BACKGROUND_COMMANDS = 16;

export const COMMAND_URI_PREFIX = "forkd://commands/";

export interface CommandOutcome {
  stdout: string;
  stderr: string;
  /** null while it still runs (a background command). */
  exit_code: number | null;
  signal: string | null;
  timed_out: boolean;
  /** With waitForText: whether the text appeared (in stdout or stderr). */
  found?: boolean;
  /** With waitForText and found: the command runs on; this names it for `stop_command` and its resource. */
  command_id?: string;
  duration_ms: number;
}

export interface RunRequest {
  sandboxId: string;
  argv: string[];
  /** Seconds; 0 = no limit. With waitForText: how long to wait for it (the command is stopped if it never came). */
  timeoutSecs: number;
  waitForText?: string;
  envs?: Record<string, string>;
  cwd?: string;
  stdin?: string;
  signal?: AbortSignal;
}

interface Running {
  id: string;
  sandboxId: string;
  argv: string[];
  output: { stdout: string; stderr: string };
  exit: Promise<CommandOutcome>;
  stop(): void;
  done: boolean;
}

/** A command as it was started: when, the tail of its output, its outcome, whether the awaited text showed. */
interface Started {
  started: number;
  output: { stdout: string; stderr: string };
  exit: Promise<CommandOutcome>;
  found: Promise<boolean>;
}

export class CommandRunner {
  private readonly background = new Map<string, Running>();
  private next = 1;

  constructor(private readonly controller: Controller) {}

  async run(request: RunRequest): Promise<CommandOutcome> {
    if (request.waitForText !== undefined && this.runningCount() >= MAX_BACKGROUND_COMMANDS) {
      throw new Error(
        `${MAX_BACKGROUND_COMMANDS} background commands are running in this session; stop one (stop_command) first`,
      );
    }
    const abort = new AbortController();
    const command = this.start(request, abort);
    if (request.waitForText === undefined) return command.exit;
    return this.untilText(request, command, abort);
  }

  /** Starts the command: the tail of its output as it comes, its outcome, and whether the awaited text showed. */
  private start(request: RunRequest, abort: AbortController): Started {
    const started = performance.now();
    const signal = request.signal ? AbortSignal.any([request.signal, abort.signal]) : abort.signal;
    const output = { stdout: "", stderr: "" };
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    let resolveFound: (found: boolean) => void = () => {};
    const found = new Promise<boolean>((resolve) => {
      resolveFound = resolve;
    });
    const wanted = request.waitForText;
    const limit = wanted === undefined ? MAX_COMMAND_OUTPUT_CHARS : MAX_BACKGROUND_OUTPUT_CHARS;
    const events = this.controller.execStream(request.sandboxId, request.argv, {
      // The wait is ours: with waitForText the command has no time limit of its own once found.
      timeoutMs: wanted === undefined ? request.timeoutSecs * 1000 : 0,
      envs: request.envs,
      cwd: request.cwd,
      stdin: request.stdin,
      signal,
    });
    const exit = (async (): Promise<CommandOutcome> => {
      try {
        for await (const event of events) {
          if (event.type === "exit") {
            return {
              stdout: output.stdout + decoders.stdout.decode(),
              stderr: output.stderr + decoders.stderr.decode(),
              exit_code: event.exitCode,
              signal: event.signal,
              timed_out: event.timedOut,
              duration_ms: Math.round(performance.now() - started),
            };
          }
          const text = decoders[event.type].decode(event.data, { stream: true });
          output[event.type] = keepTail(output[event.type] + text, limit);
          if (wanted !== undefined && (output.stdout.includes(wanted) || output.stderr.includes(wanted))) {
            resolveFound(true);
          }
        }
        throw new Error("the command's stream ended without its exit");
      } finally {
        resolveFound(false);
      }
    })();
    exit.catch(() => resolveFound(false));
    return { started, output, exit, found };
  }

  /**
   * Waits for the text (within the timeout): found, the command keeps running in the background under an id;
   * not found in time, it is stopped; ended first, its outcome.
   */
  private async untilText(
    request: RunRequest,
    command: Started,
    abort: AbortController,
  ): Promise<CommandOutcome> {
    const { started, output, exit, found } = command;
    const deadline =
      request.timeoutSecs === 0
        ? undefined
        : new Promise<"timeout">((resolve) =>
            setTimeout(resolve, request.timeoutSecs * 1000, "timeout").unref(),
          );
    const first = await Promise.race([found, ...(deadline ? [deadline] : [])]);
    if (first === true) {
      const id = String(this.next++);
      const running: Running = {
        id,
        sandboxId: request.sandboxId,
        argv: request.argv,
        output,
        exit,
        stop: () => abort.abort(new Error("stopped")),
        done: false,
      };
      const ended = () => {
        running.done = true;
      };
      exit.then(ended, ended);
      this.background.set(id, running);
      return {
        stdout: output.stdout,
        stderr: output.stderr,
        exit_code: null,
        signal: null,
        timed_out: false,
        found: true,
        command_id: id,
        duration_ms: Math.round(performance.now() - started),
      };
    }
    if (first === "timeout") {
      abort.abort(new Error("timed out waiting for the text"));
      const partial = { ...output };
      await exit.catch(() => {});
      return {
        ...partial,
        exit_code: null,
        signal: null,
        timed_out: true,
        found: false,
        duration_ms: Math.round(performance.now() - started),
      };
    }
    // The command ended (or failed) before the text appeared.
    return { ...(await exit), found: false };
  }

  /** A background command's state and output so far. */
  describe(
    id: string,
  ): { id: string; sandbox_id: string; argv: string[]; running: boolean } & Running["output"] {
    const running = this.background.get(id);
    if (!running) throw new Error(`no background command ${JSON.stringify(id)} in this session`);
    return {
      id,
      sandbox_id: running.sandboxId,
      argv: running.argv,
      running: !running.done,
      stdout: running.output.stdout,
      stderr: running.output.stderr,
    };
  }

  /** Stops a background command (the daemon kills it in the guest) and returns how it ended. */
  async stop(id: string): Promise<CommandOutcome | { stopped: true }> {
    const running = this.background.get(id);
    if (!running) throw new Error(`no background command ${JSON.stringify(id)} in this session`);
    this.background.delete(id);
    if (running.done) return running.exit;
    running.stop();
    await running.exit.catch(() => {});
    return { stopped: true };
  }

  ids(): string[] {
    return [...this.background.keys()];
  }

  /** Ends every background command (the session is closing). */
  async close(): Promise<void> {
    const all = [...this.background.values()];
    this.background.clear();
    for (const running of all) running.stop();
    await Promise.all(all.map((r) => r.exit.catch(() => {})));
  }

  private runningCount(): number {
    return [...this.background.values()].filter((r) => !r.done).length;
  }
}

function keepTail(text: string, limit: number): string {
  return text.length > limit ? text.slice(-limit) : text;
}
