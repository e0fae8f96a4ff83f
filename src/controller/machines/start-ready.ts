/**
 * A format-2 template's `start` command (a process that outlives the call) and its `ready` check (polled until it
 * exits 0, within its deadline), run through the guest agent: in a snapshot's parent before it is saved (boot.ts),
 * and again in a sandbox cold-booted from a filesystem-only pause (sandbox-vm.ts), from what the snapshot's
 * manifest recorded of them (guestCommandsOf: users resolved against the image once, at the snapshot).
 */
import type { AgentClient } from "../../agent/host/client.js";
import type { ProcEnd, ProcHandle } from "../../agent/host/types.js";
import { sleep } from "../../common/deadline.js";
import { ForkdError } from "../../common/errors.js";
import { GUEST_USER_NAME_PATTERN } from "../../common/limits.js";
import type { BuiltImage, Template, TemplateCommand } from "../../image/index.js";
import type { ManifestReadyCheck, ManifestStartCommand } from "../../store/manifest.js";

/** The tag the template's `start` process carries in the guest (proc.list/connect find it by it). */
export const START_PROCESS_TAG = "forkd-start";
const OUTPUT_TAIL_BYTES = 4096;
const GUEST_USER_NAME = new RegExp(GUEST_USER_NAME_PATTERN);
/** The longest one ready attempt may take (the check's whole deadline bounds it too). */
const READY_ATTEMPT_MAX_MS = 60_000;

/** The start command and ready check as they run: users resolved (undefined: root), as the manifest records them. */
export interface GuestCommands {
  start?: ManifestStartCommand;
  ready?: ManifestReadyCheck;
}

/** What names a template in errors, and the image whose default user a command without one runs as. */
type CommandSource = Pick<Template, "name" | "start" | "ready">;

/**
 * The template's start and ready as they run in `image`: each command's own user, else the image's (format 2),
 * else root; undefined fields left out (the manifest records exactly this).
 */
export function guestCommandsOf(template: Partial<CommandSource>, image: BuiltImage): GuestCommands {
  const name = template.name ?? "(unnamed)";
  const commands: GuestCommands = {};
  if (template.start) commands.start = resolved(template.start, image, name, "start");
  if (template.ready) {
    commands.ready = {
      ...resolved(template.ready, image, name, "ready"),
      timeoutMs: template.ready.timeoutMs,
      intervalMs: template.ready.intervalMs,
    };
  }
  return commands;
}

function resolved(command: TemplateCommand, image: BuiltImage, template: string, field: string) {
  const user = commandUser(command, image, template, field);
  return {
    argv: [...command.argv],
    ...(user === undefined ? {} : { user }),
    ...(command.cwd === undefined ? {} : { cwd: command.cwd }),
    env: { ...command.env },
  };
}

/** Who `start`/`ready` run as: the command's own user, else the image's (format 2), else root. */
function commandUser(
  command: TemplateCommand,
  image: BuiltImage,
  template: string,
  field: string,
): string | undefined {
  const user = command.user ?? image.manifest.settings?.user;
  if (user === undefined || user === "root") return command.user;
  if (!GUEST_USER_NAME.test(user)) {
    throw new ForkdError(
      "invalid_argument",
      `template ${template}: the image's user is ${JSON.stringify(user)}, not a name the guest agent can run ${field} as; set ${field}.user`,
    );
  }
  return user;
}

class OutputTail {
  private text = "";
  add = (chunk: Buffer) => {
    this.text = (this.text + chunk.toString("utf8")).slice(-OUTPUT_TAIL_BYTES);
  };
  toString(): string {
    return this.text.trim();
  }
  section(title: string): string {
    const text = this.toString();
    return text ? `\n--- ${title} (last lines) ---\n${text}` : "";
  }
}

export interface StartReadyOptions {
  /** Whose start and ready these are, for errors: "template x", "sandbox y (cold boot)". */
  what: string;
  progress?: (message: string) => void;
  signal?: AbortSignal;
}

/**
 * Starts `start` (kept running: the call only stops following it) and polls `ready` until it exits 0, within
 * ready's deadline. Fails with the output of both when the start command exits first (unprocessable) or ready
 * never succeeds (timeout).
 */
export async function startAndWaitReady(
  agent: AgentClient,
  commands: GuestCommands,
  options: StartReadyOptions,
): Promise<void> {
  const startOutput = new OutputTail();
  const started = commands.start && (await startCommand(agent, commands.start, startOutput, options));
  try {
    if (commands.ready) await pollReady(agent, commands.ready, () => started?.exited, startOutput, options);
  } finally {
    // The process keeps running in the guest (and in every child of a snapshot); only this call stops following it.
    started?.handle.detach();
  }
}

async function startCommand(
  agent: AgentClient,
  start: ManifestStartCommand,
  output: OutputTail,
  options: StartReadyOptions,
): Promise<{ handle: ProcHandle; exited: ProcEnd | undefined }> {
  options.progress?.(`starting ${JSON.stringify(start.argv.join(" ")).slice(0, 120)}`);
  const handle = agent.procs.start(start.argv, {
    tag: START_PROCESS_TAG,
    user: start.user,
    cwd: start.cwd,
    env: Object.keys(start.env).length > 0 ? start.env : undefined,
    onStdout: output.add,
    onStderr: output.add,
    signal: options.signal,
  });
  const started: { handle: ProcHandle; exited: ProcEnd | undefined } = { handle, exited: undefined };
  handle.done.then(
    (end) => {
      started.exited = end;
    },
    () => {},
  );
  const pid = await handle.pid.catch((err: unknown) => {
    throw new ForkdError(
      "unprocessable",
      `${options.what}: start command could not be started: ${err instanceof Error ? err.message : String(err)}`,
    );
  });
  options.progress?.(`start command running (pid ${pid})`);
  return started;
}

async function pollReady(
  agent: AgentClient,
  ready: ManifestReadyCheck,
  startExited: () => ProcEnd | undefined,
  startOutput: OutputTail,
  options: StartReadyOptions,
): Promise<void> {
  const deadline = performance.now() + ready.timeoutMs;
  let attempts = 0;
  let last = "";
  for (;;) {
    const exited = startExited();
    if (exited) {
      const how =
        exited.error ?? (exited.signal ? `signal ${exited.signal}` : `exit code ${exited.exitCode}`);
      throw new ForkdError(
        "unprocessable",
        `${options.what}: start command exited (${how}) before ready succeeded${startOutput.section("start output")}`,
      );
    }
    const remaining = deadline - performance.now();
    if (remaining <= 0) {
      throw new ForkdError(
        "timeout",
        `${options.what}: ready command did not succeed within ${ready.timeoutMs / 1000} s (${attempts} attempts)` +
          (last ? `\n--- ready output (last attempt) ---\n${last}` : "") +
          startOutput.section("start output"),
      );
    }
    attempts++;
    const result = await agent.exec(ready.argv, {
      user: ready.user,
      cwd: ready.cwd,
      env: Object.keys(ready.env).length > 0 ? ready.env : undefined,
      timeoutMs: Math.round(Math.max(1000, Math.min(remaining, READY_ATTEMPT_MAX_MS))),
      signal: options.signal,
    });
    if (result.exitCode === 0) {
      options.progress?.(`ready after ${attempts} attempt${attempts === 1 ? "" : "s"}`);
      return;
    }
    const output = Buffer.concat([result.stdout, result.stderr]).toString("utf8").trim();
    last = `exit code ${result.exitCode ?? result.signal}: ${output.slice(-OUTPUT_TAIL_BYTES)}`;
    await sleep(ready.intervalMs, options.signal);
  }
}
