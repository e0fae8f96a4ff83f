/**
 * One build, from its recipe to its snapshot: the uploaded archives unpacked into the build's own directory
 * (`<home>/builds/work/<buildId>/files/<step>`), the recipe written there as a format-2 template.toml whose copy
 * steps name those files, then the daemon's own snapshot creation on that file (the image built in the build
 * step sandbox, exactly as `forkd image build`; the parent booted, started, made ready, snapshotted). Every
 * progress event becomes a log entry naming its step; a failure names the step that failed.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { stringify } from "smol-toml";
import { errorMessage, ForkdError, invalidArgument } from "../../common/errors.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { BuildFiles } from "./build-files.js";
import { entryPathProblem } from "./build-files.js";
import type { BuildLogEntry, BuildRecipe, LogLevel } from "./contract.js";

export interface BuildRun {
  buildId: string;
  /** The snapshot to write (and the template's TOML name). */
  tag: string;
  owner: string | null;
  recipe: BuildRecipe;
  /** `<home>/builds`: the build's work directory is made below it. */
  buildsDir: string;
  files: BuildFiles;
  snapshots: DaemonSnapshots;
  log: (entry: Omit<BuildLogEntry, "timestamp">) => void;
  signal: AbortSignal;
}

export class BuildFailure extends Error {
  constructor(
    message: string,
    readonly step: string | undefined,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Where the copy step's source lands once its archive is unpacked, and its dest (`into`: dest/<name>). */
async function placeCopy(
  workDir: string,
  step: Record<string, unknown>,
  copy: BuildRecipe["copies"][number],
): Promise<void> {
  const source = copy.source.replace(/^\.\/?/, "").replace(/\/+$/, "");
  const problem = entryPathProblem(source);
  if (problem) throw invalidArgument(`copy source ${JSON.stringify(copy.source)} ${problem}`);
  const relative = path.posix.join("files", String(copy.step), source === "" ? "." : source);
  const found = await fs.lstat(path.join(workDir, relative)).catch(() => undefined);
  if (!found) {
    throw invalidArgument(
      `the files uploaded under ${copy.files.slice(0, 12)} have no ${JSON.stringify(source)}`,
    );
  }
  step.copy = relative === `files/${copy.step}/.` ? `files/${copy.step}` : relative;
  if (copy.into && !found.isDirectory()) {
    const dest = String(step.dest ?? "/");
    step.dest = path.posix.join(dest, path.posix.basename(source));
  }
}

/** Writes the build's directory: unpacked archives and template.toml. Returns the template file. */
async function stage(run: BuildRun, workDir: string): Promise<string> {
  const template = structuredClone(run.recipe.template);
  const steps = (template.steps ?? []) as Record<string, unknown>[];
  for (const copy of run.recipe.copies) {
    const step = steps[copy.step];
    if (!step) throw invalidArgument(`copy ${copy.step} names no step of the recipe`);
    run.log({
      level: "debug",
      message: `unpacking the files of ${copy.files.slice(0, 12)}`,
      step: run.recipe.stepLabels[copy.step + 1],
    });
    await run.files.unpack(copy.files, run.owner, path.join(workDir, "files", String(copy.step)), run.signal);
    await placeCopy(workDir, step, copy);
  }
  template.name = run.tag;
  const file = path.join(workDir, "template.toml");
  await fs.writeFile(file, `${stringify(template)}\n`, { mode: 0o644 });
  return file;
}

const FINISH_STEPS = new Set(["accelerator", "boot", "ready", "warmup", "save", "commit"]);

/** Builds the recipe into snapshot `run.tag`; throws a BuildFailure naming the failed step. */
export async function runBuild(run: BuildRun): Promise<void> {
  const workDir = path.join(run.buildsDir, "work", run.buildId);
  const state: { phase: "stage" | "image" | "finish" } = { phase: "stage" };
  let lastStep: number | undefined;
  const labelOf = (n: number | undefined) =>
    n === undefined ? undefined : (run.recipe.stepLabels[n] ?? run.recipe.finishLabel);
  try {
    await fs.rm(workDir, { recursive: true, force: true });
    await fs.mkdir(workDir, { recursive: true, mode: 0o755 });
    const file = await stage(run, workDir);
    const toml = await fs.readFile(file, "utf8");
    run.log({ level: "debug", message: `format-2 template:\n${toml}` });
    state.phase = "image";
    await run.snapshots.createFromBuild({
      tag: run.tag,
      templateFile: file,
      buildsDir: run.buildsDir,
      owner: run.owner,
      force: run.recipe.force,
      signal: run.signal,
      onProgress: (event) => {
        if (event.buildStep !== undefined) lastStep = event.buildStep;
        if (FINISH_STEPS.has(event.step)) state.phase = "finish";
        const level: LogLevel = /\bwarn(ing)?\b/i.test(event.message) ? "warn" : "info";
        run.log({
          level,
          message: event.message,
          step: state.phase === "finish" ? run.recipe.finishLabel : labelOf(event.buildStep),
        });
      },
    });
  } catch (err) {
    if (run.signal.aborted) throw new BuildFailure("the build was cancelled", undefined, { cause: err });
    const detail = err instanceof ForkdError ? err.detail : undefined;
    const failed = typeof detail?.buildStep === "number" ? detail.buildStep : undefined;
    const step =
      state.phase === "finish"
        ? run.recipe.finishLabel
        : state.phase === "image"
          ? labelOf(failed ?? lastStep)
          : undefined;
    throw new BuildFailure(errorMessage(err), step, { cause: err });
  } finally {
    await fs.rm(workDir, { recursive: true, force: true }).catch(() => {});
  }
}
