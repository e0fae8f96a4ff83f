/**
 * What each kind of format-2 build step does to the image's tree and settings (layered-build.ts runs them in
 * order, caches and repacks): run, pip, apt and npm in the step sandbox (step-sandbox/: a user namespace mapped to
 * the build's id range; networked, only the machine's configured package indexes reachable), adduser and copy
 * on the shifted tree, env, workdir and user on the settings.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { type ImageSettings, withEnv } from "./oci-layout.js";
import { PACKAGE_INPUT, stepPackageEnvironment } from "./package-config.js";
import type { Emit } from "./progress.js";
import { addAccount, DEFAULT_USER, onGuestPath, resolveInRoot } from "./rootfs.js";
import type { PlannedStep } from "./step-plan.js";
import {
  assertConfiguredIndex,
  type BuildIdRange,
  type Credentials,
  hostId,
  resolveCredentials,
  runInImage,
  SANDBOX_INPUTS,
} from "./step-sandbox/index.js";
import type { TemplateStep } from "./template-v2.js";
import { copyIntoTree } from "./tree-copy.js";

/** What of a build's context a step needs. */
export interface StepRunContext {
  staging: { work: string };
  emit: Emit;
  signal: AbortSignal | undefined;
  range: BuildIdRange;
}

export interface StepRun {
  ctx: StepRunContext;
  /** The tree the step works on (owned by the build range's shifted ids). */
  root: string;
  planned: PlannedStep;
  label: string;
  /** The image's settings before the step. */
  settings: ImageSettings;
  /** One line of the step's output, for the build's progress. */
  output: (line: string) => void;
}

/** The image's settings after a step, and whether it changed the tree (then the tree is repacked). */
export interface StepOutcome {
  settings: ImageSettings;
  changedTree: boolean;
}

type KindOf<K extends TemplateStep["kind"]> = Extract<TemplateStep, { kind: K }>;

export async function applyStepKind(run: StepRun): Promise<StepOutcome> {
  const { step } = run.planned;
  const tree = async (work: Promise<void>) => {
    await work;
    return { settings: run.settings, changedTree: true };
  };
  switch (step.kind) {
    case "run":
      return tree(runCommand(run, step));
    case "pip":
      return tree(pipInstall(run, step));
    case "apt":
      return tree(aptInstall(run, step));
    case "npm":
      return tree(npmInstall(run, step));
    case "adduser":
      return tree(addUser(run, step));
    case "copy":
      return tree(copyFiles(run, step));
    case "env":
      return setEnv(run, step);
    case "workdir":
      return setWorkdir(run, step);
    case "user":
      return setUser(run, step);
  }
}

/** A command in the image (networked: only the configured package indexes reachable). */
async function runCommand(run: StepRun, step: KindOf<"run">): Promise<void> {
  const credentials = await credentialsFor(run.root, run.settings.user);
  await runInStep(run, step.timeoutS, {
    argv: step.argv,
    cwd: run.settings.workdir,
    credentials,
    network: step.network,
  });
}

/** pip install with the image's own pip: local wheels (no network) or the configured indexes. */
async function pipInstall(run: StepRun, step: KindOf<"pip">): Promise<void> {
  const { root, settings } = run;
  await requireTool(root, settings, "python3", "pip steps use the image's own pip (python3 -m pip)");
  const inputs: StepInput[] = [];
  const args = ["python3", "-m", "pip", "install"];
  if (step.requirements) {
    inputs.push({ host: step.requirements, name: "requirements.txt" });
    args.push("-r", `${SANDBOX_INPUTS}/requirements.txt`);
  }
  args.push(...step.packages);
  if (step.wheels) {
    inputs.push({ host: step.wheels, name: "wheels" });
    args.push("--no-index", "--find-links", `${SANDBOX_INPUTS}/wheels`);
  } else if (step.index) {
    // Only an index the machine is configured to use: a networked step reaches nothing else.
    await assertConfiguredIndex(step.index, "the pip step's index");
    args.push("--index-url", step.index);
  }
  await runInStep(run, step.timeoutS, {
    argv: args,
    // Environment rather than flags: a pip too old to know one ignores the variable instead of failing.
    env: {
      PIP_NO_CACHE_DIR: "1",
      PIP_DISABLE_PIP_VERSION_CHECK: "1",
      PIP_ROOT_USER_ACTION: "ignore",
      PIP_BREAK_SYSTEM_PACKAGES: "1",
    },
    cwd: settings.workdir,
    credentials: await credentialsFor(root, settings.user),
    network: step.wheels === undefined,
    inputs,
  });
}

/** apt-get install with the image's own apt, from the machine's apt sources (as root, whatever the user). */
async function aptInstall(run: StepRun, step: KindOf<"apt">): Promise<void> {
  await requireTool(run.root, run.settings, "apt-get", "apt steps use the image's own apt-get");
  // The names are argv ("$@"), never part of the script; lists and caches go with the step.
  const script =
    'apt-get update -q && apt-get install -y -q $FORKD_APT_RECOMMENDS "$@" && apt-get clean && rm -rf /var/lib/apt/lists/*';
  await runInStep(run, step.timeoutS, {
    argv: ["/bin/sh", "-c", script, "forkd-apt", ...step.packages],
    env: {
      DEBIAN_FRONTEND: "noninteractive",
      DEBCONF_NOWARNINGS: "yes",
      FORKD_APT_RECOMMENDS: step.recommends ? "" : "--no-install-recommends",
    },
    cwd: "/",
    credentials: null,
    network: true,
  });
}

/** npm install with the image's own npm, from the machine's npm registry. */
async function npmInstall(run: StepRun, step: KindOf<"npm">): Promise<void> {
  const { root, settings } = run;
  await requireTool(root, settings, "npm", "npm steps use the image's own npm");
  await runInStep(run, step.timeoutS, {
    argv: [
      "npm",
      "install",
      ...(step.global ? ["--global"] : []),
      "--no-fund",
      "--no-audit",
      ...step.packages,
    ],
    env: { NPM_CONFIG_UPDATE_NOTIFIER: "false", NPM_CONFIG_CACHE: "/tmp/forkd-npm-cache" },
    cwd: settings.workdir,
    credentials: await credentialsFor(root, settings.user),
    network: true,
  });
}

type StepInput = { host: string; name: string };

/** What a run, pip, apt or npm step runs in the image. */
interface StepCommand {
  argv: string[];
  /** Variables on top of the image's and the package configuration's. */
  env?: Record<string, string>;
  cwd: string;
  /** Who it runs as (null: root). */
  credentials: Credentials | null;
  /** Networked: the machine's configured package indexes reachable, and the tools pointed at them. */
  network: boolean;
  /** Read-only host files, each at `${SANDBOX_INPUTS}/<name>`. */
  inputs?: StepInput[];
}

/**
 * Runs `command` in the step sandbox the same way for every step kind: the image's environment (HOME for its
 * user), and for a networked step the machine's package configuration (package-config.ts) as variables and
 * read-only inputs, whatever program the step runs (an `apt` step, or a `run` step calling apt-get or pip).
 */
async function runInStep(run: StepRun, timeoutS: number, command: StepCommand): Promise<void> {
  const { ctx, root, planned, label, output, settings } = run;
  const packages = command.network ? await packageEnvironment(ctx, root, planned, label) : undefined;
  const inputs = [...(command.inputs ?? [])];
  if (packages) inputs.push({ host: packages.inputDir, name: PACKAGE_INPUT });
  await runInImage({
    root,
    argv: command.argv,
    env: withEnv(envFor(settings, command.credentials), { ...packages?.env, ...command.env }),
    cwd: command.cwd,
    credentials: command.credentials,
    network: command.network,
    inputs,
    scratchDir: ctx.staging.work,
    timeoutS,
    label,
    signal: ctx.signal,
    onOutputLine: output,
  });
}

/** An account, written with the build range's shifted ids. */
async function addUser(run: StepRun, step: KindOf<"adduser">): Promise<void> {
  const { ctx, root } = run;
  await addAccount(
    root,
    {
      name: step.name,
      uid: DEFAULT_USER.uid,
      gid: DEFAULT_USER.gid,
      home: step.name === DEFAULT_USER.name ? DEFAULT_USER.home : `/home/${step.name}`,
    },
    (id) => hostId(ctx.range, id),
  );
}

/** Host files into the tree, owned by the step's user (shifted). */
async function copyFiles(run: StepRun, step: KindOf<"copy">): Promise<void> {
  const { ctx, root } = run;
  const owner = step.owner ? await credentialsFor(root, step.owner) : null;
  const shifted = (uid: number, gid: number) => ({
    uid: hostId(ctx.range, uid),
    gid: hostId(ctx.range, gid),
  });
  await copyIntoTree({
    root,
    src: step.src,
    dest: step.dest,
    mode: step.mode,
    owner: owner ? shifted(owner.uid, owner.gid) : shifted(0, 0),
    rootOwner: shifted(0, 0),
  });
}

/** Environment variables of the image (its settings only). */
async function setEnv(run: StepRun, step: KindOf<"env">): Promise<StepOutcome> {
  const { settings } = run;
  const next = { ...settings, env: withEnv(settings.env, step.env) };
  return { settings: next, changedTree: false };
}

/** The working directory (made when missing, owned by the image's root). */
async function setWorkdir(run: StepRun, step: KindOf<"workdir">): Promise<StepOutcome> {
  const { ctx, root, settings } = run;
  const dir = await resolveInRoot(root, step.path, true);
  const existing = await fs.lstat(dir).catch(() => undefined);
  if (existing && !existing.isDirectory()) {
    throw new ForkdError("invalid_argument", `${step.path} exists in the image and is not a directory`);
  }
  const changedTree = !existing;
  if (!existing) {
    const made = await fs.mkdir(dir, { recursive: true, mode: 0o755 });
    // Every directory made belongs to the image's root (shifted, as the whole tree is).
    const root0 = hostId(ctx.range, 0);
    for (let d = dir; made !== undefined && d.length >= made.length; d = path.dirname(d)) {
      await fs.lchown(d, root0, root0);
    }
  }
  const next = { ...settings, workdir: step.path };
  return { settings: next, changedTree: changedTree };
}

/** The user later steps and the sandbox run as (must exist). */
async function setUser(run: StepRun, step: KindOf<"user">): Promise<StepOutcome> {
  const { root, settings } = run;
  await credentialsFor(root, step.user);
  const next = { ...settings, user: step.user };
  return { settings: next, changedTree: false };
}

async function credentialsFor(root: string, user: string): Promise<Credentials | null> {
  return user === "root" || user === "0" || user === "0:0" ? null : resolveCredentials(root, user);
}

function envFor(settings: ImageSettings, credentials: Credentials | null): string[] {
  const home = credentials ? (credentials.home ?? "/") : "/root";
  return settings.env.some((e) => e.startsWith("HOME=")) ? settings.env : [...settings.env, `HOME=${home}`];
}

/** Refuses a step whose tool the image lacks, naming what the step needs. */
async function requireTool(root: string, settings: ImageSettings, tool: string, why: string): Promise<void> {
  const pathVar = settings.env.find((e) => e.startsWith("PATH="))?.slice(5);
  if (!(await onGuestPath(root, pathVar, tool))) {
    throw new ForkdError("invalid_argument", `the image has no ${tool} on its PATH (${why})`);
  }
}

/** The machine's package configuration for one networked step (package-config.ts), noted in the build log. */
async function packageEnvironment(ctx: StepRunContext, root: string, planned: PlannedStep, label: string) {
  const dir = path.join(ctx.staging.work, `packages-${planned.number}`);
  await fs.rm(dir, { recursive: true, force: true });
  const found = await stepPackageEnvironment(root, dir, `${SANDBOX_INPUTS}/${PACKAGE_INPUT}`);
  if (found.notes.length > 0) {
    ctx.emit({
      step: "rootfs",
      phase: "progress",
      message: `${label}: package indexes: ${found.notes.join(", ")}`,
    });
  }
  return found;
}
