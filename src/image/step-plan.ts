/**
 * The cache keys of a format-2 build: one for the base image and one per step, each the hash of everything
 * before it and the step itself (with the content of any host files it reads, never their host paths). So a
 * changed step, or a changed file a step copies, rebuilds from that step on and reuses everything before it.
 *
 * What a key does not cover, like package versions in a Debian suite or what a registry tag points to now,
 * is re-fetched only by a forced build (`--force`), as for format-1 images.
 */
import { createHash, randomUUID } from "node:crypto";
import { ForkdError } from "../common/errors.js";
import { resolveImage } from "./oci-layout.js";
import { canonicalJson, hashTree, sha256File } from "./recipe.js";
import { DEBIAN_TREE_VERSION } from "./rootfs.js";
import type { ImageSource, Template, TemplateStep } from "./template.js";

/** Bump when how a base is made or a step is applied changes (so old step entries are not reused). */
export const STEP_BUILDER_VERSION = 2;

export interface PlannedBase {
  key: string;
  source: ImageSource;
  /** Debian packages of a Debian base (with python3 for interpreter "python"). */
  packages: string[];
  description: string;
}

export interface PlannedStep {
  key: string;
  /** 1-based, as errors and the build output number steps. */
  number: number;
  step: TemplateStep;
  description: string;
}

export interface BuildPlan {
  base: PlannedBase;
  steps: PlannedStep[];
  /** The key of the last step (or of the base): the tree the image is made from. */
  finalKey: string;
}

const keyOf = (value: unknown) => createHash("sha256").update(canonicalJson(value)).digest("hex");

function shorten(text: string, max = 80): string {
  const one = text.replace(/\s+/g, " ").trim();
  return one.length > max ? `${one.slice(0, max - 3)}...` : one;
}

export function describeSource(source: ImageSource, packages: string[]): string {
  switch (source.kind) {
    case "debian":
      return `Debian ${source.suite}${packages.length > 0 ? ` (${packages.join(", ")})` : ""}`;
    case "oci-layout":
      return `OCI layout ${source.pathRelative}${source.ref ? `:${source.ref}` : ""}`;
    case "archive":
      return `archive ${source.pathRelative}${source.ref ? ` (${source.ref})` : ""}`;
    case "registry":
      return `image ${source.ref}`;
    case "dockerfile":
      return `Dockerfile ${source.fileRelative} (context ${source.contextRelative})`;
  }
}

export function describeStep(step: TemplateStep): string {
  switch (step.kind) {
    case "run": {
      const shell = step.argv.length === 3 && step.argv[0] === "/bin/sh" && step.argv[1] === "-c";
      return `run ${shorten(shell ? (step.argv[2] as string) : JSON.stringify(step.argv))}${step.network ? " (network)" : ""}`;
    }
    case "copy":
      return `copy ${step.srcRelative} -> ${step.dest}`;
    case "env":
      return `env ${shorten(Object.keys(step.env).join(" "))}`;
    case "workdir":
      return `workdir ${step.path}`;
    case "user":
      return `user ${step.user}`;
    case "pip": {
      const what = step.requirementsRelative
        ? `-r ${step.requirementsRelative}`
        : shorten(step.packages.join(" "));
      const from = step.wheels
        ? `wheels ${step.wheelsRelative}`
        : step.index
          ? `index ${step.index}`
          : "the machine's indexes";
      return `pip install ${what} (${from})`;
    }
    case "apt":
      return `apt install ${shorten(step.packages.join(" "))}`;
    case "npm":
      return `npm install${step.global ? " -g" : ""} ${shorten(step.packages.join(" "))}`;
    case "adduser":
      return `adduser ${step.name}`;
  }
}

async function sourceIdentity(source: ImageSource, packages: string[]): Promise<unknown> {
  switch (source.kind) {
    case "debian":
      return {
        kind: source.kind,
        suite: source.suite,
        packages: [...packages].sort(),
        // forkd's edits to the tree mmdebstrap made: a base made before they changed is not reused.
        forkdEdits: DEBIAN_TREE_VERSION,
      };
    case "oci-layout":
      return { kind: source.kind, manifest: (await resolveImage(source.path, source.ref)).manifestDigest };
    case "archive":
      return { kind: source.kind, sha256: await sha256File(source.path), ref: source.ref ?? null };
    case "registry":
      return { kind: source.kind, ref: source.ref };
    case "dockerfile":
      return {
        kind: source.kind,
        dockerfile: await sha256File(source.file),
        context: await hashTree(source.context, "Dockerfile context"),
        args: source.args,
        target: source.target ?? null,
        network: source.network,
      };
  }
}

async function stepIdentity(step: TemplateStep): Promise<unknown> {
  const identity = await contentIdentity(step);
  // `cache = false`: a key no earlier build had, so this step and every one after it run again.
  return step.cache ? identity : { ...(identity as object), uncached: randomUUID() };
}

async function contentIdentity(step: TemplateStep): Promise<unknown> {
  switch (step.kind) {
    case "run":
      return { kind: step.kind, argv: step.argv, network: step.network };
    case "copy":
      return {
        kind: step.kind,
        content: await hashTree(step.src, "copy source"),
        dest: step.dest,
        mode: step.mode ?? null,
        owner: step.owner ?? null,
      };
    case "env":
      return { kind: step.kind, env: step.env };
    case "workdir":
      return { kind: step.kind, path: step.path };
    case "user":
      return { kind: step.kind, user: step.user };
    case "pip":
      return {
        kind: step.kind,
        requirements: step.requirements ? await sha256File(step.requirements) : null,
        packages: step.packages,
        wheels: step.wheels ? await hashTree(step.wheels, "wheel directory") : null,
        index: step.index ?? null,
      };
    case "apt":
      return { kind: step.kind, packages: step.packages, recommends: step.recommends };
    case "npm":
      return { kind: step.kind, packages: step.packages, global: step.global };
    case "adduser":
      return { kind: step.kind, name: step.name };
  }
}

/** The keys of `template`'s base and steps; `suite` is the host's (the only one its apt sources serve). */
export async function planBuild(template: Template, suite: string, packages: string[]): Promise<BuildPlan> {
  let source = template.base;
  if (source.kind === "debian") {
    if (source.suite !== "" && source.suite !== suite) {
      throw new ForkdError(
        "invalid_argument",
        `${template.source}: field "from.debian" is ${source.suite}, but this host's apt sources serve ${suite} (images are built from the host's own sources)`,
      );
    }
    source = { kind: "debian", suite };
  }
  const baseKey = keyOf({
    builder: STEP_BUILDER_VERSION,
    base: await sourceIdentity(source, source.kind === "debian" ? packages : []),
  });
  const base: PlannedBase = {
    key: baseKey,
    source,
    packages: source.kind === "debian" ? packages : [],
    description: describeSource(source, source.kind === "debian" ? packages : []),
  };
  const steps: PlannedStep[] = [];
  let parent = baseKey;
  for (const [i, step] of template.steps.entries()) {
    const key = keyOf({ builder: STEP_BUILDER_VERSION, parent, step: await stepIdentity(step) });
    steps.push({ key, number: i + 1, step, description: describeStep(step) });
    parent = key;
  }
  return { base, steps, finalKey: parent };
}
