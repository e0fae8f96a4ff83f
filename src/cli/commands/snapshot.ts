/**
 * `forkd snapshot`: from a template (engine-local: boot, warm, save), or `--from-sandbox ID` (BRANCH a running
 * sandbox through the daemon, which owns it).
 */
import { type Command, Option } from "commander";
import { invalidArgument } from "../../common/errors.js";
import { resolvePaths } from "../../common/paths.js";
import { createSnapshot } from "../../controller/snapshots/create.js";
import { addDaemonOptions, connectDaemon, daemonError } from "../daemon-connection.js";
import { printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

export function registerSnapshot(program: Command): void {
  addDaemonOptions(
    program
      .command("snapshot")
      .description(
        "save a snapshot children fork from: boot and warm a template's parent, or BRANCH a running sandbox " +
          "(--from-sandbox) mid-work while it keeps running",
      )
      .option("-t, --tag <tag>", "tag of the new snapshot (required from a template; generated for a branch)")
      .option("--template <name|file>", "template name or .toml file (default: the tag)")
      .option("--replace", "replace an existing snapshot with this tag (template snapshots)")
      .option("--from-sandbox <id>", "BRANCH this running sandbox (through the daemon)")
      .addOption(
        new Option("--diff", "branch: store only the pages the sandbox changed (default)").conflicts([
          "full",
          "live",
        ]),
      )
      .addOption(
        new Option(
          "--full",
          "branch: a snapshot that stands alone (flat memory, one disk layer, no parent)",
        ).conflicts(["live"]),
      )
      .option("--live", "branch: capture memory while the guest runs (sandbox spawned with --live-fork)")
      .option(
        "--no-wait",
        "branch --live: return once the sandbox runs again; the snapshot is written in the background",
      )
      .option("--json", "print the result as JSON"),
  ).action((opts, command: Command) =>
    runCommand(async (signal) => {
      if (opts.fromSandbox !== undefined) await branchFromSandbox(opts.fromSandbox, opts, command, signal);
      else await snapshotTemplate(opts, signal);
      return undefined;
    }),
  );
}

/** The options `forkd snapshot` declares, as commander parses them. */
interface SnapshotOptions {
  tag?: string;
  template?: string;
  replace?: boolean;
  fromSandbox?: string;
  diff?: boolean;
  full?: boolean;
  live?: boolean;
  wait?: boolean;
  json?: boolean;
}

async function branchFromSandbox(
  source: string,
  opts: SnapshotOptions,
  command: Command,
  signal: AbortSignal,
): Promise<void> {
  if (opts.template !== undefined || opts.replace) {
    throw invalidArgument("--template and --replace are for template snapshots, not --from-sandbox");
  }
  const mode = opts.live ? "live" : opts.full ? "full" : "diff";
  if (opts.wait === false && mode !== "live") throw invalidArgument("--no-wait needs --live");
  const progress = opts.json ? undefined : startProgress(`branching ${source} (${mode})`);
  const daemon = connectDaemon(command);
  try {
    const result = await daemon.controller.branchSandbox(source, {
      ...(opts.tag ? { tag: opts.tag } : {}),
      mode,
      ...(opts.wait === false ? { wait: false } : {}),
      signal,
    });
    progress?.succeed(
      `snapshot ${result.tag} ${result.status} (${mode}; source paused ${result.pause_ms} ms; ` +
        `${(result.bytes_captured / 2 ** 20).toFixed(1)} MiB captured; parent ${result.parent_tag})`,
    );
    if (opts.json) printJson(result);
  } catch (err) {
    progress?.fail(`branch of ${source} failed`);
    throw daemonError(err, daemon.url);
  }
}

async function snapshotTemplate(opts: SnapshotOptions, signal: AbortSignal): Promise<void> {
  if (!opts.tag) throw invalidArgument("--tag is required (or --from-sandbox ID to BRANCH a sandbox)");
  if (opts.diff || opts.full || opts.live || opts.wait === false) {
    throw invalidArgument("--diff/--full/--live/--no-wait need --from-sandbox");
  }
  const progress = startProgress(`snapshot ${opts.tag}`);
  try {
    const created = await createSnapshot(resolvePaths(), {
      tag: opts.tag,
      template: opts.template,
      templateFiles: true,
      replace: opts.replace,
      signal,
      onProgress: (e) => progress.update(`${e.step}: ${e.message}`),
    });
    const t = created.manifest.timings;
    progress.succeed(
      `snapshot ${created.tag} ready (${created.manifest.machine.accel}; boot ${(t.bootMs / 1000).toFixed(1)} s, ` +
        `warm-up ${(t.warmupMs / 1000).toFixed(1)} s, pause+save ${t.saveMs} ms)`,
    );
    if (opts.json) printJson({ dir: created.dir, ...created.manifest });
  } catch (err) {
    progress.fail(`snapshot ${opts.tag} failed`);
    throw err;
  }
}
