/** `forkd workspace create|suspend|resume|list|delete`: forkd v0.5's named, suspendable sandboxes. */
import type { Command } from "commander";
import { MAX_MEMORY_LIMIT_MIB, MIN_MEMORY_LIMIT_MIB, WORKSPACE_NAME_PATTERN } from "../../common/limits.js";
import { unanchored } from "../../common/names.js";
import type { WorkspaceInfo } from "../../sdk/index.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { parseIntOption } from "../options.js";
import { printJson, printTable } from "../output.js";

function printWorkspaces(workspaces: WorkspaceInfo[]): void {
  printTable(
    ["NAME", "STATUS", "SANDBOX", "SNAPSHOT", "STATE", "LAST_ACTIVE"],
    workspaces.map((w) => [
      w.name,
      w.status,
      w.live_sandbox_id ?? "-",
      w.source_snapshot_tag,
      w.current_state_tag ?? "-",
      new Date(w.last_active_unix * 1000).toISOString(),
    ]),
  );
}

/** The workspace as JSON (--json) or as a one-row table. */
function show(workspace: WorkspaceInfo, json: boolean | undefined): undefined {
  if (json) printJson(workspace);
  else printWorkspaces([workspace]);
  return undefined;
}

export function registerWorkspace(program: Command): void {
  const workspace = program
    .command("workspace")
    .description("named sandboxes that are suspended to disk and resumed by name (daemon; forkd v0.5)");
  registerWorkspaceCreate(workspace);
  registerWorkspaceSuspend(workspace);
  registerWorkspaceResume(workspace);
  registerWorkspaceList(workspace);
  registerWorkspaceDelete(workspace);
}

function registerWorkspaceCreate(workspace: Command): void {
  addDaemonOptions(
    workspace
      .command("create")
      .description("create a workspace: a running sandbox from a snapshot, under a name")
      .argument("<name>", `a name matching ${unanchored(WORKSPACE_NAME_PATTERN)}`)
      .requiredOption("-t, --tag <tag>", "snapshot tag")
      .option(
        "--memory-limit-mib <mib>",
        "memory limit of its sandbox",
        parseIntOption("--memory-limit-mib", MIN_MEMORY_LIMIT_MIB, MAX_MEMORY_LIMIT_MIB),
      )
      .option("--json", "print the workspace as JSON"),
  ).action((name: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const created = await controller.createWorkspace({
        name,
        snapshotTag: opts.tag,
        memoryLimitMib: opts.memoryLimitMib,
        signal,
      });
      return show(created, opts.json);
    }),
  );
}

function registerWorkspaceSuspend(workspace: Command): void {
  addDaemonOptions(
    workspace
      .command("suspend")
      .description("suspend a running workspace: its sandbox paused to disk, its RAM given back")
      .argument("<name>", "workspace name")
      .option("--diff", "a layer over the previous suspend's instead of one holding everything")
      .option("--json", "print the workspace as JSON"),
  ).action((name: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const suspended = await controller.suspendWorkspace(name, { diff: opts.diff === true, signal });
      return show(suspended, opts.json);
    }),
  );
}

function registerWorkspaceResume(workspace: Command): void {
  addDaemonOptions(
    workspace
      .command("resume")
      .description("resume a suspended workspace where it was (same sandbox id, network and policy)")
      .argument("<name>", "workspace name")
      .option("--json", "print the workspace as JSON"),
  ).action((name: string, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const resumed = await controller.resumeWorkspace(name, { signal });
      return show(resumed, opts.json);
    }),
  );
}

function registerWorkspaceList(workspace: Command): void {
  addDaemonOptions(
    workspace.command("list").alias("ls").description("list workspaces").option("--json", "print JSON"),
  ).action((opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const all = await controller.listWorkspaces({ signal });
      if (opts.json) printJson(all);
      else printWorkspaces(all);
      return undefined;
    }),
  );
}

function registerWorkspaceDelete(workspace: Command): void {
  addDaemonOptions(
    workspace
      .command("delete")
      .alias("rm")
      .description(
        "delete a workspace: its sandbox is killed, its layers removed unless a snapshot uses them",
      )
      .argument("<name>", "workspace name"),
  ).action((name: string, _opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      await controller.deleteWorkspace(name, { signal });
      process.stdout.write(`${name}\n`);
      return undefined;
    }),
  );
}
