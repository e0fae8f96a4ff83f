/**
 * The tools of forkd v0.5's MCP server (its sdk/mcp/forkd_mcp/server.py), with the same names and argument names,
 * so an MCP configuration written for it keeps working: list_snapshots (tools.ts), spawn_sandboxes,
 * branch_sandbox, create_snapshot, wait_for_text, list_sandboxes, get_sandbox, kill_sandbox, exec_command,
 * eval_code, ping_sandbox. Their answers are the daemon's documents as v0.5 returned them (plus forkd's fields),
 * with long output cut like every tool's.
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import {
  DEFAULT_EXEC_TIMEOUT_SECS,
  DEFAULT_MEMORY_OVERHEAD_MIB,
  MAX_EVAL_CODE_CHARS,
  MAX_EXEC_ARG_CHARS,
  MAX_EXEC_ARGS,
  MAX_GUEST_TIMEOUT_MS,
  MAX_MEMORY_LIMIT_MIB,
  MAX_PATH_CHARS,
  MAX_SPAWN_N,
  MIN_MEMORY_LIMIT_MIB,
} from "../common/limits.js";
import { NotFoundError } from "../sdk/index.js";
import {
  commandResult,
  guestPathSchema,
  MAX_MARKER_CHARS,
  result,
  sandboxIdSchema,
  type ToolContext,
  tagSchema,
} from "./tools.js";

/** How much of the file's end wait_for_text reports (v0.5: "the last ~256 bytes"). */
const EXCERPT_CHARS = 256;
/** wait_for_text reads at most this much of the file per poll (its end). */
const WAIT_READ_BYTES = 4 * 1024 * 1024;

export function registerV05Tools(server: McpServer, context: ToolContext): void {
  for (const register of [
    spawnSandboxesTool,
    branchSandboxTool,
    createSnapshotTool,
    waitForTextTool,
    listSandboxesTool,
    getSandboxTool,
    killSandboxTool,
    execCommandTool,
    evalCodeTool,
    pingSandboxTool,
  ]) {
    register(server, context);
  }
}

function spawnSandboxesTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "spawn_sandboxes",
    {
      title: "Spawn sandboxes (forkd v0.5)",
      description:
        "Fork n children from a snapshot (forkd v0.5's tool; create_sandboxes is the same with a lifetime). " +
        "per_child_netns is accepted (every networked sandbox has its own namespace); prewarm is a v0.5 feature " +
        "this forkd refuses when true.",
      inputSchema: {
        snapshot_tag: tagSchema,
        n: z.number().int().min(1).max(MAX_SPAWN_N).default(1),
        per_child_netns: z.boolean().default(false),
        memory_limit_mib: z
          .number()
          .int()
          .min(MIN_MEMORY_LIMIT_MIB)
          .max(MAX_MEMORY_LIMIT_MIB)
          .optional()
          .describe(
            `Memory limit per child (v0.5 defaulted to 256; here: the daemon's default, guest RAM + ${DEFAULT_MEMORY_OVERHEAD_MIB} MiB where the host has the memory controller).`,
          ),
        prewarm: z.boolean().default(false),
        live_fork: z.boolean().default(false).describe("RAM on tmpfs, so branch_sandbox can use mode live."),
      },
    },
    async ({ snapshot_tag, n, per_child_netns, memory_limit_mib, prewarm, live_fork }) => {
      const spawned = await controller.spawnSandboxes({
        snapshotTag: snapshot_tag,
        n,
        perChildNetns: per_child_netns,
        prewarm,
        ...(memory_limit_mib === undefined ? {} : { memoryLimitMib: memory_limit_mib }),
        ...(live_fork ? { liveFork: true } : {}),
      });
      return result({ result: spawned });
    },
  );
}

function branchSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "branch_sandbox",
    {
      title: "Branch a sandbox",
      description:
        "Snapshot a running sandbox mid-work into a new tag (it keeps running); create_sandboxes/spawn_sandboxes " +
        "from that tag continue from this point. mode: full (default: stands alone), diff (only what changed, on " +
        "top of its base), live (needs live_fork). Returns the snapshot, pause_ms and, with diff or measure_diff, " +
        "diff_ms and diff_*_bytes.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        tag: tagSchema.optional(),
        diff: z.boolean().default(false).describe("Legacy form of mode=diff."),
        measure_diff: z.boolean().default(false),
        mode: z.enum(["full", "diff", "live"]).optional(),
        wait: z.boolean().default(true).describe("live only: false answers once the sandbox runs again."),
      },
    },
    async ({ sandbox_id, tag, diff, measure_diff, mode, wait }) => {
      const branch = await controller.branchSandbox(sandbox_id, {
        ...(tag === undefined ? {} : { tag }),
        ...(mode !== undefined ? { mode } : diff ? { diff: true } : {}),
        ...(measure_diff ? { measureDiff: true } : {}),
        ...(wait ? {} : { wait: false }),
      });
      return result(branch);
    },
  );
}

function createSnapshotTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "create_snapshot",
    {
      title: "Create a snapshot",
      description:
        "Build a warm snapshot: from a template (template, default the tag: image built if needed, booted, " +
        "warmed), or forkd v0.5's form, the kernel and rootfs of a built forkd image on the daemon's host. Takes " +
        "minutes the first time.",
      inputSchema: {
        tag: tagSchema,
        template: tagSchema
          .optional()
          .describe("Template name (default: the tag when kernel/rootfs are absent)."),
        kernel: z
          .string()
          .min(1)
          .max(MAX_PATH_CHARS)
          .optional()
          .describe("v0.5: host path of a forkd image's vmlinuz."),
        rootfs: z
          .string()
          .min(1)
          .max(MAX_PATH_CHARS)
          .optional()
          .describe("v0.5: host path of that image's rootfs.ext4."),
        rw: z.boolean().optional().describe("v0.5 field; ignored."),
        tap: z.string().optional().describe("v0.5 field; not supported (refused)."),
        boot_wait_secs: z.number().int().min(0).max(60).optional().describe("v0.5 field; ignored."),
      },
    },
    async ({ tag, template, kernel, rootfs, tap }) => {
      if (tap !== undefined)
        throw new Error("tap is not supported by this forkd: the daemon attaches every NIC itself");
      const created = await controller.createSnapshot({
        tag,
        ...(template === undefined ? {} : { template }),
        ...(kernel === undefined ? {} : { kernel }),
        ...(rootfs === undefined ? {} : { rootfs }),
      });
      return result(created);
    },
  );
}

function waitForTextTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "wait_for_text",
    {
      title: "Wait for text in a file",
      description:
        "Poll a file inside a sandbox until it contains marker (e.g. a progress log line), then answer. " +
        "Returns found, elapsed_ms and the file's last ~256 characters.",
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        path: guestPathSchema,
        marker: z.string().min(1).max(MAX_MARKER_CHARS),
        timeout_secs: z.number().min(0).max(3600).default(60),
        poll_interval_ms: z.number().int().min(10).max(60_000).default(200),
      },
      annotations: { readOnlyHint: true },
    },
    async ({ sandbox_id, path, marker, timeout_secs, poll_interval_ms }, extra) => {
      const started = performance.now();
      const deadline = started + timeout_secs * 1000;
      let excerpt = "";
      for (;;) {
        // Read through the files API: the path never becomes part of a command line.
        const text = await readTail(controller, sandbox_id, path);
        if (text !== undefined) {
          excerpt = text;
          if (text.includes(marker)) {
            return result({
              found: true,
              elapsed_ms: Math.round(performance.now() - started),
              last_excerpt: text.slice(-EXCERPT_CHARS),
            });
          }
        }
        if (performance.now() + poll_interval_ms > deadline || extra.signal.aborted) break;
        await new Promise((resolve) => setTimeout(resolve, poll_interval_ms));
      }
      return result({
        found: false,
        elapsed_ms: Math.round(performance.now() - started),
        last_excerpt: excerpt.slice(-EXCERPT_CHARS),
      });
    },
  );
}

function listSandboxesTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "list_sandboxes",
    {
      title: "List sandboxes",
      description: "List the sandboxes the daemon runs (id, snapshot_tag, status, expiry, ...).",
      annotations: { readOnlyHint: true },
    },
    async () => result({ result: await controller.listSandboxes() }),
  );
}

function getSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "get_sandbox",
    {
      title: "Get a sandbox",
      description: "One sandbox's record: snapshot, status, expiry, branch count.",
      inputSchema: { sandbox_id: sandboxIdSchema },
      annotations: { readOnlyHint: true },
    },
    async ({ sandbox_id }) => result(await controller.getSandbox(sandbox_id)),
  );
}

function killSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "kill_sandbox",
    {
      title: "Kill a sandbox",
      description: "Terminate a sandbox and free its resources.",
      inputSchema: { sandbox_id: sandboxIdSchema },
      annotations: { destructiveHint: true },
    },
    async ({ sandbox_id }) => {
      await controller.killSandbox(sandbox_id);
      return result({ id: sandbox_id, killed: true });
    },
  );
}

function execCommandTool(server: McpServer, { controller, outputs }: ToolContext): void {
  server.registerTool(
    "exec_command",
    {
      title: "Exec a command (forkd v0.5)",
      description:
        "Run a program with arguments (no shell) in a sandbox and return stdout, stderr and exit_code " +
        '(forkd v0.5\'s tool; run_command takes a shell command line). Example args: ["python3", "-c", "print(2+2)"].',
      inputSchema: {
        sandbox_id: sandboxIdSchema,
        args: z.array(z.string().max(MAX_EXEC_ARG_CHARS)).min(1).max(MAX_EXEC_ARGS),
        timeout_secs: z
          .number()
          .int()
          .min(1)
          .max(MAX_GUEST_TIMEOUT_MS / 1000)
          .default(DEFAULT_EXEC_TIMEOUT_SECS),
      },
    },
    async ({ sandbox_id, args, timeout_secs }) => {
      const ran = await controller.execCommand(sandbox_id, args, { timeoutMs: timeout_secs * 1000 });
      const shown = commandResult(
        outputs,
        {
          stdout: ran.stdout,
          stderr: ran.stderr,
          exit_code: ran.exit_code,
          signal: ran.signal ?? null,
          timed_out: ran.timed_out === true,
          duration_ms: Math.round(ran.duration_ms ?? 0),
        },
        `${args[0]} in ${sandbox_id}`,
      );
      return result(shown);
    },
  );
}

function evalCodeTool(server: McpServer, { controller, outputs }: ToolContext): void {
  server.registerTool(
    "eval_code",
    {
      title: "Eval Python (forkd v0.5)",
      description:
        "Evaluate Python in the sandbox's warm interpreter (forkd v0.5's tool; run_code is the same with a " +
        "structured error). Returns result (repr of the last expression), error ('Type: message' or null) and " +
        "exit_code.",
      inputSchema: { sandbox_id: sandboxIdSchema, code: z.string().max(MAX_EVAL_CODE_CHARS) },
    },
    async ({ sandbox_id, code }) => {
      const answer = await controller.evalCode(sandbox_id, code);
      const value =
        answer.result === null
          ? null
          : outputs.shorten(answer.result, `result of code in ${sandbox_id}`).text;
      return result({ ...answer, result: value });
    },
  );
}

function pingSandboxTool(server: McpServer, { controller }: ToolContext): void {
  server.registerTool(
    "ping_sandbox",
    {
      title: "Ping a sandbox",
      description: "Round trip to the sandbox's guest agent: its version, template and uptime.",
      inputSchema: { sandbox_id: sandboxIdSchema },
      annotations: { readOnlyHint: true },
    },
    async ({ sandbox_id }) => result(await controller.pingSandbox(sandbox_id)),
  );
}

/** The file's text (its last WAIT_READ_BYTES), or undefined if it does not exist yet. */
async function readTail(
  controller: ToolContext["controller"],
  sandboxId: string,
  path: string,
): Promise<string | undefined> {
  try {
    const info = await controller.statFile(sandboxId, path);
    if (info.size > WAIT_READ_BYTES) {
      const tail = await controller.execCommand(sandboxId, [
        "tail",
        "-c",
        String(WAIT_READ_BYTES),
        "--",
        path,
      ]);
      return tail.stdout;
    }
    return (await controller.readFile(sandboxId, path)).toString("utf8");
  } catch (err) {
    // The file may not exist yet; a sandbox that is gone is reported by the stat's own error.
    if (err instanceof NotFoundError && !/sandbox .* not found/.test(err.message)) return undefined;
    throw err;
  }
}
