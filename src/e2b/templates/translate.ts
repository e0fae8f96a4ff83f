/**
 * E2B's template build (what `Template.build` sends to POST /v2/templates/{id}/builds/{buildID}: a base, a list
 * of RUN / COPY / ENV / WORKDIR / USER instructions, a start and a ready command) as a format-2 recipe
 * (docs/templates.md) for the daemon's template builds. The SDKs turn every builder method into one of those five
 * instructions (aptInstall, pipInstall, npmInstall, gitClone, makeDir, remove, rename, makeSymlink are RUN; a
 * Dockerfile is parsed into them on the client), so five mappings cover them all (docs/e2b.md has the table):
 *
 *   base       fromImage -> from.image (pulled with skopeo), then `adduser user` and `user root`: E2B's builds
 *              run steps as root, with its default account `user` already there
 *   RUN        run (network: the machine's package indexes only), as args[1] when given (user steps around it)
 *   COPY       copy of the uploaded archive `filesHash` (the source with its glob part stripped, as E2B's
 *              builder does), owner args[2] or the current user, mode args[3]; a relative dest is the
 *              working directory's (or the user's home when none was set)
 *   ENV        env;  WORKDIR  workdir (relative: against the current one);  USER  user
 *   startCmd   start (as the last user, in the last working directory); readyCmd  ready
 *
 * Every format-2 step carries the E2B step it came from (stepLabels): "base", "1".."n" (the SDK's step index,
 * which it maps back to the caller's source line), "finalize" for the start/ready commands.
 */
import path from "node:path/posix";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { GUEST_USER_NAME_PATTERN } from "../../common/limits.js";
import type { BuildRecipe, RecipeCopy } from "../../controller/builds/contract.js";

export interface E2bTemplateStep {
  type: string;
  args?: string[] | null;
  filesHash?: string | null;
  force?: boolean | null;
}

export interface E2bBuildStart {
  fromImage?: string | null;
  fromTemplate?: string | null;
  fromImageRegistry?: Record<string, unknown> | null;
  force?: boolean | null;
  steps?: E2bTemplateStep[] | null;
  startCmd?: string | null;
  readyCmd?: string | null;
}

/** E2B's default account, made in every image before the steps run. */
export const E2B_USER = "user";
const BUILD_USER = "root";
export const FINALIZE = "finalize";
/** How long a ready command may take to succeed (E2B gives none; forkd's ready needs one). */
const READY_TIMEOUT_S = 600;
const GLOB = /[*?[{]/;
const GUEST_USER_NAME = new RegExp(GUEST_USER_NAME_PATTERN);

function homeOf(user: string): string {
  return user === "root" || user === "0" ? "/root" : `/home/${user.split(":")[0]}`;
}

/** The part of a COPY source before its first glob segment (E2B's builder copies from there). */
export function stripGlob(source: string): { path: string; glob: boolean } {
  const parts = source.replace(/\\/g, "/").split("/");
  const at = parts.findIndex((p) => GLOB.test(p));
  if (at < 0) return { path: path.normalize(source).replace(/\/+$/, ""), glob: false };
  const prefix = parts.slice(0, at).join("/");
  return { path: prefix === "" ? "" : path.normalize(prefix), glob: true };
}

function args(step: E2bTemplateStep, index: number, min: number): string[] {
  const list = step.args ?? [];
  if (!Array.isArray(list) || list.some((a) => typeof a !== "string") || list.length < min) {
    throw invalidArgument(`step ${index} (${step.type}) needs at least ${min} string argument(s)`);
  }
  return list;
}

interface State {
  user: string;
  workdir: string | undefined;
}

function absolute(state: State, dest: string): string {
  if (dest.startsWith("/")) return path.normalize(dest);
  return path.join(state.workdir ?? homeOf(state.user), dest);
}

function trimDest(dest: string): string {
  const clean = path.normalize(dest).replace(/\/+$/, "");
  return clean === "" ? "/" : clean;
}

/** The recipe being written: its steps with their E2B labels, the copies, and the user and directory so far. */
interface RecipeDraft {
  steps: Record<string, unknown>[];
  labels: string[];
  copies: RecipeCopy[];
  state: State;
}

function push(draft: RecipeDraft, step: Record<string, unknown>, label: string): void {
  draft.steps.push(step);
  draft.labels.push(label);
}

/**
 * The recipe of `start`. `base`, when the build is fromTemplate, is the recipe of the template it names: its base
 * and steps come first (cached), labelled "base".
 */
export function recipeOf(start: E2bBuildStart, base?: BuildRecipe): BuildRecipe {
  if (start.fromImageRegistry) {
    throw new ForkdError(
      "not_implemented",
      "fromImageRegistry (registry credentials) is not supported: forkd pulls with skopeo's own auth files (docs/e2b.md)",
    );
  }
  if (start.fromImage && start.fromTemplate)
    throw invalidArgument("give fromImage or fromTemplate, not both");
  // Every E2B build starts its steps as root (fromTemplate too: the base's last user is not carried).
  const draft: RecipeDraft = {
    steps: [],
    labels: ["base"],
    copies: [],
    state: { user: BUILD_USER, workdir: undefined },
  };
  const template = baseTemplate(draft, start, base);
  push(draft, { user: BUILD_USER }, "base");
  for (const [i, step] of (start.steps ?? []).entries()) translateStep(draft, step, i + 1);
  template.steps = draft.steps;
  setStartAndReady(template, start, base, draft.state);
  return {
    template,
    copies: draft.copies,
    stepLabels: draft.labels,
    finishLabel: FINALIZE,
    force: start.force === true,
  };
}

/** The template the steps build on: the base template's (its steps first), or fromImage with E2B's account. */
function baseTemplate(
  draft: RecipeDraft,
  start: E2bBuildStart,
  base: BuildRecipe | undefined,
): Record<string, unknown> {
  if (base) {
    const template = { ...base.template };
    for (const step of (base.template.steps ?? []) as Record<string, unknown>[])
      push(draft, { ...step }, "base");
    draft.copies.push(...base.copies);
    return template;
  }
  if (!start.fromImage) throw invalidArgument("fromImage or fromTemplate is required");
  push(draft, { adduser: E2B_USER }, "base");
  return { format: 2, from: { image: start.fromImage }, disk_mib: 4096 };
}

/** One E2B instruction (`number` is the SDK's 1-based step index) as format-2 steps. */
function translateStep(draft: RecipeDraft, step: E2bTemplateStep, number: number): void {
  const { state } = draft;
  const label = String(number);
  const cache = step.force ? { cache: false } : {};
  switch (String(step.type).toUpperCase()) {
    case "RUN": {
      const [command, runAs] = args(step, number, 1);
      const as = runAs && runAs !== state.user ? runAs : undefined;
      if (as) push(draft, { user: as }, label);
      push(draft, { run: command, network: true, ...cache }, label);
      if (as) push(draft, { user: state.user }, label);
      return;
    }
    case "COPY":
      translateCopy(draft, step, number, cache);
      return;
    case "ENV": {
      const list = args(step, number, 2);
      const env: Record<string, string> = {};
      for (let k = 0; k + 1 < list.length; k += 2) env[list[k] as string] = list[k + 1] as string;
      push(draft, { env, ...cache }, label);
      return;
    }
    case "WORKDIR": {
      const [dir = ""] = args(step, number, 1);
      state.workdir = trimDest(absolute(state, dir));
      push(draft, { workdir: state.workdir, ...cache }, label);
      return;
    }
    case "USER": {
      const [user = ""] = args(step, number, 1);
      state.user = user;
      push(draft, { user, ...cache }, label);
      return;
    }
    default:
      throw invalidArgument(`step ${number}: unknown step type ${JSON.stringify(step.type)}`);
  }
}

function translateCopy(
  draft: RecipeDraft,
  step: E2bTemplateStep,
  number: number,
  cache: { cache?: boolean },
): void {
  const [src = "", dest = "", owner, mode] = args(step, number, 2);
  if (!step.filesHash) throw invalidArgument(`step ${number} (COPY ${src}) has no filesHash`);
  const source = stripGlob(src);
  if (source.path.startsWith("..") || source.path.startsWith("/")) {
    throw invalidArgument(`step ${number} (COPY ${src}): the source must stay inside the context`);
  }
  const into = dest.endsWith("/") || dest === "." || source.glob;
  draft.copies.push({ step: draft.steps.length, files: step.filesHash, source: source.path, into });
  push(
    draft,
    {
      dest: trimDest(absolute(draft.state, dest === "" ? "." : dest)),
      owner: owner && owner !== "" ? owner : draft.state.user,
      ...(mode && mode !== "" ? { mode } : {}),
      ...cache,
    },
    String(number),
  );
}

/** The start and ready commands, as the last user in the last working directory; a base's stay unless replaced. */
function setStartAndReady(
  template: Record<string, unknown>,
  start: E2bBuildStart,
  base: BuildRecipe | undefined,
  state: State,
): void {
  const named = GUEST_USER_NAME.test(state.user) ? { user: state.user } : {};
  const where = state.workdir ? { cwd: state.workdir } : {};
  if (start.startCmd) template.start = { command: start.startCmd, ...named, ...where };
  else if (!base) delete template.start;
  if (start.readyCmd) {
    template.ready = { command: start.readyCmd, timeout_s: READY_TIMEOUT_S, ...named, ...where };
  } else if (start.startCmd) delete template.ready;
}
