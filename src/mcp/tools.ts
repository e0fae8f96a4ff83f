/**
 * forkd's MCP tools, for a model to drive sandboxes: list snapshots and their chains, create sandboxes, branch
 * and fork, run commands (with a timeout, or until a text appears), run Python in the warm interpreter, read,
 * write and list files, pause and resume, kill. Every result is small structured JSON; long output is cut with a note naming the
 * resource that holds all of it. Errors are the daemon's messages as MCP tool errors.
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import {
  COMMAND_SHELL_ARGV,
  DEFAULT_COMMAND_TIMEOUT_MS,
  ENV_NAME_PATTERN,
  MAX_EVAL_CODE_CHARS,
  MAX_FILE_MODE,
  MAX_GUEST_TIMEOUT_MS,
  MAX_MEMORY_LIMIT_MIB,
  MAX_PATH_CHARS,
  MAX_SPAWN_N,
  MIN_MEMORY_LIMIT_MIB,
  SANDBOX_REF_PATTERN,
  TAG_PATTERN,
} from "../common/limits.js";
import type { Controller, SandboxInfo, SnapshotInfo } from "../sdk/index.js";
import type { CommandOutcome, CommandRunner } from "./commands.js";
import type { OutputStore } from "./outputs.js";

/** What every tool handler gets: the SDK client, the session's output store and background commands. */
export interface ToolContext {
  controller: Controller;
  outputs: OutputStore;
  commands: CommandRunner;
}

/** Names that cannot be paths: the daemon checks them too, this refuses them before any request. */
export const sandboxIdSchema = z
  .string()
  .regex(new RegExp(SANDBOX_REF_PATTERN), "a sandbox id, e.g. sb-0123456789ab")
  .describe("Sandbox id, as create_sandboxes returned it (sb-<12 hex>).");
export const tagSchema = z
  .string()
  .regex(new RegExp(TAG_PATTERN), "letters, digits, '.', '_', '-'; at most 64; no leading '.' or '-'")
  .describe("Snapshot tag.");
export const guestPathSchema = z
  .string()
  .min(1)
  .max(MAX_PATH_CHARS)
  .refine(
    (p) => p.startsWith("/") && !p.includes("\0") && !p.split("/").some((s) => s === ".." || s === "."),
    {
      message: "an absolute path inside the sandbox, without '.' or '..' segments",
    },
  )
  .describe("Absolute path inside the sandbox.");
const timeoutSecsSchema = z
  .number()
  .min(0)
  .max(MAX_GUEST_TIMEOUT_MS / 1000);
/** Tools that run guest work wait this long unless told otherwise (the SDKs' default). */
export const DEFAULT_TIMEOUT_SECS = DEFAULT_COMMAND_TIMEOUT_MS / 1000;
/** Longest text a tool waits for in a command's output or a file. */
export const MAX_MARKER_CHARS = 4096;

/** A tool's answer: the structured result, and the same as JSON text for clients that only show text. */
export function result<T extends Record<string, unknown>>(value: T) {
  return {
    content: [{ type: "text" as const, text: JSON.stringify(value, null, 1) }],
    structuredContent: value,
  };
}

/** What a model needs of a sandbox. */
export function sandboxSummary(info: SandboxInfo) {
  return {
    id: info.id,
    snapshot_tag: info.snapshot_tag,
    status: info.status,
    expires_at_unix_ms: info.expires_at_unix_ms ?? null,
    branch_count: info.branch_count ?? 0,
  };
}

export function snapshotSummary(info: SnapshotInfo) {
  return {
    tag: info.tag,
    status: info.status,
    bootable: info.bootable,
    template: info.template ?? null,
    parent_tag: info.parent_tag ?? null,
    memory_mib: info.memory_mib ?? null,
  };
}

/** A command's outcome with its output cut to size (the full text is a resource). */
export function commandResult(outputs: OutputStore, outcome: CommandOutcome, what: string) {
  const stdout = outputs.shorten(outcome.stdout, `stdout of ${what}`);
  const stderr = outputs.shorten(outcome.stderr, `stderr of ${what}`);
  return {
    ...outcome,
    stdout: stdout.text,
    stderr: stderr.text,
    ...(stdout.truncated || stderr.truncated
      ? { full_output: [stdout.resource, stderr.resource].filter((r): r is string => r !== undefined) }
      : {}),
  };
}

export function registerTools(server: McpServer, context: ToolContext): void {
  for (const register of [
    listSnapshotsTool,
    snapshotInfoTool,
    createSandboxesTool,
    forkSandboxTool,
    runCommandTool,
    stopCommandTool,
    runCodeTool,
    readFileTool,
    writeFileTool,
    listFilesTool,
    pauseSandboxTool,
    resumeSandboxTool,
  ]) {
    register(server, context);
  }
}

function listSnapshotsTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "list_snapshots",
    {
      title: "List snapshots",
      description:
        "List the snapshots sandboxes can be created from. Each is a warm, paused VM (e.g. 'pyagent': Python with " +
        "numpy already imported); parent_tag is set for a branch layered on another snapshot.",
      annotations: { readOnlyHint: true },
    },
    async () => result({ snapshots: (await controller.listSnapshots()).map(snapshotSummary) }),
  );
}

function snapshotInfoTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "snapshot_info",
    {
      title: "Snapshot details",
      description:
        "One snapshot with its chain: ancestors (root first), dependents, depth, and the bytes each layer takes.",
      inputSchema: { tag: tagSchema },
      annotations: { readOnlyHint: true },
    },
    async ({ tag }) => {
      const detail = await controller.getSnapshot(tag);
      return result({
        ...snapshotSummary(detail),
        chain_depth: detail.chain_depth ?? 0,
        ancestors: detail.ancestors ?? [],
        dependents: detail.dependents ?? [],
        bytes: detail.bytes ?? 0,
        error: detail.error ?? null,
      });
    },
  );
}

function createSandboxesTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "create_sandboxes",
    {
      title: "Create sandboxes",
      description:
        "Fork n sandboxes (microVMs) from a snapshot in one call, all or none; each starts warm (Python and its " +
        "imports already loaded) within a second or so. Returns their ids. They live until kill_sandbox, or for " +
        "lifetime_secs if given.",
      inputSchema: {
        snapshot_tag: tagSchema.describe("The snapshot to fork from (see list_snapshots)."),
        n: z
          .number()
          .int()
          .min(1)
          .max(MAX_SPAWN_N)
          .default(1)
          .describe(`How many sandboxes, 1..${MAX_SPAWN_N}.`),
        lifetime_secs: timeoutSecsSchema
          .optional()
          .describe("Kill each sandbox this many seconds after creation (0 or absent: until killed)."),
        memory_limit_mib: z
          .number()
          .int()
          .min(MIN_MEMORY_LIMIT_MIB)
          .max(MAX_MEMORY_LIMIT_MIB)
          .optional()
          .describe("Memory limit per sandbox."),
      },
    },
    async ({ snapshot_tag, n, lifetime_secs, memory_limit_mib }) => {
      const spawned = await controller.spawnSandboxes({
        snapshotTag: snapshot_tag,
        n,
        ...(lifetime_secs === undefined ? {} : { timeoutMs: Math.round(lifetime_secs * 1000) }),
        ...(memory_limit_mib === undefined ? {} : { memoryLimitMib: memory_limit_mib }),
      });
      return result({ sandboxes: spawned.map(sandboxSummary) });
    },
  );
}

function forkSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "fork_sandbox",
    {
      title: "Fork a running sandbox",
      description:
        "Branch a running sandbox where it is (its memory, files and processes, mid-work) and create n new " +
        "sandboxes that continue from that point; the source keeps running. Use it to try several next steps in " +
        "parallel. Returns the branch's snapshot tag and the new sandboxes.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        n: z
          .number()
          .int()
          .min(1)
          .max(MAX_SPAWN_N)
          .default(1)
          .describe("How many sandboxes to create from the branch."),
        tag: tagSchema.optional().describe("Tag for the branch snapshot (default: generated)."),
        mode: z
          .enum(["full", "diff", "live"])
          .default("diff")
          .describe(
            "diff: only what the sandbox changed (fast, the default here); full: a snapshot that stands alone.",
          ),
      },
    },
    async ({ sandbox_id, n, tag, mode }) => {
      const branch = await controller.branchSandbox(sandbox_id, {
        mode,
        ...(tag === undefined ? {} : { tag }),
      });
      const spawned = await controller.spawnSandboxes({ snapshotTag: branch.tag, n });
      return result({
        branch_tag: branch.tag,
        pause_ms: branch.pause_ms,
        sandboxes: spawned.map(sandboxSummary),
      });
    },
  );
}

function runCommandTool(server: McpServer, { outputs, commands }: ToolContext): void {
  server.registerTool(
    "run_command",
    {
      title: "Run a command",
      description:
        "Run a shell command line (bash -c) in a sandbox and return its exit code and output (long output is " +
        "cut; the full text is a resource). With wait_for_text, return as soon as that text appears in the " +
        "output and leave the command running in the background (e.g. a server that prints 'listening'); " +
        "stop it with stop_command.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        command: z.string().min(1).max(60_000).describe("A bash command line."),
        timeout_secs: timeoutSecsSchema
          .default(DEFAULT_TIMEOUT_SECS)
          .describe(
            "Kill the command after this long (0: no limit); with wait_for_text, how long to wait for it.",
          ),
        wait_for_text: z
          .string()
          .min(1)
          .max(MAX_MARKER_CHARS)
          .optional()
          .describe("Return once this text is in the output."),
        cwd: guestPathSchema.optional().describe("Working directory (default /)."),
        env: z
          .record(z.string().regex(new RegExp(ENV_NAME_PATTERN)), z.string())
          .optional()
          .describe("Environment variables to add."),
        stdin: z.string().max(1_000_000).optional().describe("Text written to the command's standard input."),
      },
    },
    async ({ sandbox_id, command, timeout_secs, wait_for_text, cwd, env, stdin }, extra) => {
      const outcome = await commands.run({
        sandboxId: sandbox_id,
        argv: [...COMMAND_SHELL_ARGV, command],
        timeoutSecs: timeout_secs,
        waitForText: wait_for_text,
        envs: env,
        cwd,
        stdin,
        signal: extra.signal,
      });
      return result(commandResult(outputs, outcome, `\`${command.slice(0, 80)}\` in ${sandbox_id}`));
    },
  );
}

function stopCommandTool(server: McpServer, { outputs, commands }: ToolContext): void {
  server.registerTool(
    "stop_command",
    {
      title: "Stop a background command",
      description: "Stop a command that run_command left running (wait_for_text) and return how it ended.",
      inputSchema: {
        command_id: z
          .string()
          .regex(/^\d{1,9}$/)
          .describe("command_id from run_command."),
      },
      annotations: { destructiveHint: true },
    },
    async ({ command_id }) => {
      const ended = await commands.stop(command_id);
      return result(
        "stopped" in ended
          ? { command_id, stopped: true }
          : commandResult(outputs, ended, `command ${command_id}`),
      );
    },
  );
}

function runCodeTool(server: McpServer, { controller, outputs }: ToolContext): void {
  server.registerTool(
    "run_code",
    {
      title: "Run Python",
      description:
        "Evaluate Python in the sandbox's warm interpreter (state persists between calls; numpy is already " +
        "imported in pyagent snapshots). Returns repr() of the last expression as result, printed output, and " +
        "the exception (name, value, traceback) if the code raised one.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        code: z
          .string()
          .max(MAX_EVAL_CODE_CHARS)
          .describe("Python source; the value of its last line is returned."),
        timeout_secs: timeoutSecsSchema
          .default(DEFAULT_TIMEOUT_SECS)
          .describe("Stop the evaluation after this long (0: no limit)."),
      },
    },
    async ({ sandbox_id, code, timeout_secs }) => {
      const answer = await controller.evalCode(sandbox_id, code, {
        timeoutMs: Math.round(timeout_secs * 1000),
      });
      const what = `code in ${sandbox_id}`;
      const value = answer.result === null ? null : outputs.shorten(answer.result, `result of ${what}`).text;
      const stdout = outputs.shorten(answer.stdout ?? "", `stdout of ${what}`).text;
      const stderr = outputs.shorten(answer.stderr ?? "", `stderr of ${what}`).text;
      const error =
        answer.error === null
          ? null
          : {
              name: answer.error_type ?? "Error",
              value: answer.error.replace(/^[\w.]+: /, ""),
              traceback: outputs.shorten(answer.traceback ?? "", `traceback of ${what}`).text,
            };
      return result({ result: value, stdout, stderr, error, timed_out: answer.timed_out === true });
    },
  );
}

function readFileTool(server: McpServer, { controller, outputs }: ToolContext): void {
  server.registerTool(
    "read_file",
    {
      title: "Read a file",
      description:
        "Read a file from a sandbox: UTF-8 text, or base64 when it is not text (or when encoding is base64). " +
        "Long text is cut; the full text is a resource.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        path: guestPathSchema,
        encoding: z
          .enum(["utf8", "base64"])
          .optional()
          .describe("Default: utf8 if the file is text, else base64."),
      },
      annotations: { readOnlyHint: true },
    },
    async ({ sandbox_id, path, encoding }) => {
      const bytes = await controller.readFile(sandbox_id, path);
      const text = bytes.toString("utf8");
      const asText =
        encoding === "utf8" || (encoding === undefined && Buffer.from(text, "utf8").equals(bytes));
      const body = asText ? text : bytes.toString("base64");
      const shortened = outputs.shorten(body, `${path} in ${sandbox_id}`);
      return result({
        path,
        bytes: bytes.length,
        encoding: asText ? "utf8" : "base64",
        content: shortened.text,
        ...(shortened.resource ? { full_content: shortened.resource } : {}),
      });
    },
  );
}

function writeFileTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "write_file",
    {
      title: "Write a file",
      description: "Create or replace a file in a sandbox (parent directories are created). At most ~16 MiB.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        path: guestPathSchema,
        content: z
          .string()
          .max(24 * 1024 * 1024)
          .describe("The file's content."),
        encoding: z.enum(["utf8", "base64"]).default("utf8").describe("How content is encoded."),
        mode: z
          .number()
          .int()
          .min(0)
          .max(MAX_FILE_MODE)
          .optional()
          .describe("Permission bits, e.g. 493 (0o755)."),
      },
    },
    async ({ sandbox_id, path, content, encoding, mode }) => {
      const data = encoding === "base64" ? Buffer.from(content, "base64") : Buffer.from(content, "utf8");
      const written = await controller.writeFile(sandbox_id, path, data, mode === undefined ? {} : { mode });
      return result({ path, bytes: written.bytes });
    },
  );
}

function listFilesTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "list_files",
    {
      title: "List a directory",
      description:
        "List a directory in a sandbox: name, type (file, dir, symlink, other), size and mode of each entry.",
      inputSchema: { sandbox_id: sandboxIdSchema, path: guestPathSchema },
      annotations: { readOnlyHint: true },
    },
    async ({ sandbox_id, path }) => {
      const listing = await controller.listFiles(sandbox_id, path);
      return result({
        path,
        entries: listing.entries.map((e) => ({ name: e.name, type: e.type, size: e.size, mode: e.mode })),
        truncated: listing.truncated === true,
      });
    },
  );
}

function pauseSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "pause_sandbox",
    {
      title: "Pause a sandbox",
      description:
        "Put a running sandbox to sleep on disk: its memory, processes and files are kept, its RAM is given back, " +
        "and it keeps its id. Calls into it fail until resume_sandbox wakes it where it was.",
      inputSchema: { sandbox_id: sandboxIdSchema },
    },
    async ({ sandbox_id }) => {
      const paused = await controller.pauseSandbox(sandbox_id);
      return result({ id: sandbox_id, status: paused.sandbox.status, pause_ms: paused.pause_ms });
    },
  );
}

function resumeSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "resume_sandbox",
    {
      title: "Resume a paused sandbox",
      description:
        "Wake a paused sandbox under the same id: its processes, files and interpreter variables are as they were. " +
        "Its lifetime starts again (lifetime_secs from now if given).",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        lifetime_secs: timeoutSecsSchema
          .optional()
          .describe("Kill it this many seconds from now (0: never)."),
      },
    },
    async ({ sandbox_id, lifetime_secs }) => {
      const resumed = await controller.resumeSandbox(
        sandbox_id,
        lifetime_secs === undefined ? {} : { timeoutMs: Math.round(lifetime_secs * 1000) },
      );
      return result({ id: resumed.id, status: resumed.status });
    },
  );
}
