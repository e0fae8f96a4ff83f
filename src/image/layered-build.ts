/**
 * The root filesystem of a format-2 template: the base image, then each build step, each cached under its
 * key (step-plan.ts) as an OCI layout (step-cache.ts). A build looks for the deepest cached step, unpacks
 * it with umoci and applies only the steps after it; every step it runs is repacked into a new layer and
 * published before the next one starts, so a failure later keeps what came before.
 *
 *   base        Debian (mmdebstrap into an empty umoci bundle), or an image copied by skopeo from an OCI
 *               layout, an OCI/Docker archive or a registry, or a Dockerfile built by buildah; every layer
 *               from elsewhere is checked (layer-check.ts) before umoci unpacks it
 *   run, pip    in the image's own root, in bubblewrap, as root of a user namespace mapped to an unprivileged
 *               id range (step-sandbox/): the tree steps work on is unpacked with its owners shifted into that
 *               range and repacked shifted back, and the image's tree with its own ids is unpacked again from
 *               the last step's layout (so no setuid-root file a step made exists on the host before then,
 *               and then only inside the build's root-only staging directory)
 *   copy        host files into the tree (tree-copy.ts)
 *   env, workdir, user   the image's settings (a workdir is also created)
 *
 * A failing step's error names it (number and what it does) and ends with the tail of its output.
 */

import { createReadStream } from "node:fs";
import fs from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { Parser, type ReadEntry } from "tar";
import { errorMessage, ForkdError } from "../common/errors.js";
import type { Staging } from "./cache.js";
import {
  type ArchiveKind,
  archiveName,
  ociLayoutName,
  registryTlsVerify,
  skopeoCopy,
  umociInitLayout,
  umociRepack,
  umociUnpack,
} from "./containers.js";
import { buildDockerfile } from "./dockerfile.js";
import { checkLayers } from "./layer-check.js";
import { cloneLayout, DEFAULT_SETTINGS, type ImageSettings, resolveImage, settingsOf } from "./oci-layout.js";
import type { Emit } from "./progress.js";
import { debootstrap } from "./rootfs.js";
import { beginStep, type PendingStep, publishStep, readStepEntry, type StepEntry } from "./step-cache.js";
import { applyStepKind } from "./step-kinds.js";
import type { BuildPlan, PlannedBase, PlannedStep } from "./step-plan.js";
import {
  assertReachableByBuildRange,
  type BuildIdRange,
  buildIdRange,
  openToBuildRange,
  umociIdMap,
} from "./step-sandbox/index.js";

export interface StepReport {
  /** 0 for the base, then 1..n. */
  number: number;
  description: string;
  key: string;
  cached: boolean;
  /** Time this build spent on it (0 when cached). */
  seconds: number;
}

export interface LayeredTree {
  /** The image's tree, ready for forkd's payload (inside the staging directory). */
  root: string;
  settings: ImageSettings;
  steps: StepReport[];
}

interface Context {
  cacheDir: string;
  staging: Staging;
  bundle: string;
  emit: Emit;
  signal: AbortSignal | undefined;
  total: number;
  /** Replace existing cache entries (a forced build) instead of keeping the first one published. */
  replace: boolean;
  /** The ids steps run as; the working bundle's tree is owned by them (shifted) while steps run. */
  range: BuildIdRange;
}

const seconds = (since: number) => Math.round((performance.now() - since) / 100) / 10;

function stepLabel(ctx: Context, number: number, description: string): string {
  return number === 0 ? `base: ${description}` : `step ${number}/${ctx.total}: ${description}`;
}

export async function buildLayeredTree(opts: {
  plan: BuildPlan;
  cacheDir: string;
  staging: Staging;
  emit: Emit;
  signal?: AbortSignal;
  /** Use no cached step: fetch the base and run every step again, replacing their cache entries. */
  fresh?: boolean;
}): Promise<LayeredTree> {
  const { plan } = opts;
  const ctx: Context = {
    cacheDir: opts.cacheDir,
    staging: opts.staging,
    bundle: path.join(opts.staging.work, "bundle"),
    emit: opts.emit,
    signal: opts.signal,
    total: plan.steps.length,
    replace: opts.fresh === true,
    range: buildIdRange(),
  };
  const links = [plan.base, ...plan.steps];
  const cached = opts.fresh ? undefined : await deepestCachedStep(ctx, links);
  const reports: StepReport[] = [];
  let entry: StepEntry;
  let resumeAt: number;
  let unpacked = false;
  if (!cached) {
    const made = await makeBase(ctx, plan.base);
    entry = made.entry;
    unpacked = made.unpacked;
    reports.push({
      number: 0,
      description: plan.base.description,
      key: plan.base.key,
      cached: false,
      seconds: made.seconds,
    });
    resumeAt = 0;
  } else {
    ({ entry, resumeAt } = cached);
    reports.push(...reportCached(ctx, links.slice(0, resumeAt + 1)));
  }
  const toRun = plan.steps.slice(resumeAt);
  await prepareWorkingTree(ctx, entry, unpacked, toRun.length > 0);
  let settings = entry.record.settings;
  for (const planned of toRun) {
    const started = performance.now();
    const label = stepLabel(ctx, planned.number, planned.description);
    ctx.emit({ step: "rootfs", phase: "progress", message: `${label} ...`, buildStep: planned.number });
    const result = await applyStep(ctx, planned, entry, settings);
    entry = result.entry;
    settings = result.settings;
    const s = seconds(started);
    reports.push({
      number: planned.number,
      description: planned.description,
      key: planned.key,
      cached: false,
      seconds: s,
    });
    ctx.emit({ step: "rootfs", phase: "progress", message: `${label} (${s} s)`, buildStep: planned.number });
  }
  if (toRun.length === 0) return { root: path.join(ctx.bundle, "rootfs"), settings, steps: reports };
  // The image's tree with its own ids (the payload and mkfs take it from here), from the last step's layout.
  ctx.emit({ step: "rootfs", phase: "progress", message: "unpacking the built image (umoci)" });
  const imageBundle = path.join(ctx.staging.work, "image-bundle");
  await umociUnpack(entry.layout, imageBundle, ctx.signal);
  await fs.rm(ctx.bundle, { recursive: true, force: true });
  return { root: path.join(imageBundle, "rootfs"), settings, steps: reports };
}

/** The deepest link (base or step) whose layer is cached, and its index in `links`. */
async function deepestCachedStep(
  ctx: Context,
  links: (PlannedBase | PlannedStep)[],
): Promise<{ entry: StepEntry; resumeAt: number } | undefined> {
  for (let i = links.length - 1; i >= 0; i--) {
    const entry = await readStepEntry(ctx.cacheDir, (links[i] as PlannedBase | PlannedStep).key);
    if (entry) return { entry, resumeAt: i };
  }
  return undefined;
}

/** Reports (and announces) the links taken from the cache. */
function reportCached(ctx: Context, links: (PlannedBase | PlannedStep)[]): StepReport[] {
  return links.map((link, i) => {
    const number = i === 0 ? 0 : (link as PlannedStep).number;
    ctx.emit({
      step: "rootfs",
      phase: "progress",
      message: `${stepLabel(ctx, number, link.description)} (cached)`,
      buildStep: number,
    });
    return { number, description: link.description, key: link.key, cached: true, seconds: 0 };
  });
}

/**
 * Unpacks `entry` as the working bundle (unless the Debian base left it there and no step runs), with the ids
 * shifted into the build range when steps will run, and opens it to their sandboxes.
 */
async function prepareWorkingTree(
  ctx: Context,
  entry: StepEntry,
  unpacked: boolean,
  stepsToRun: boolean,
): Promise<void> {
  if (unpacked && stepsToRun) {
    // The Debian base was made with the image's own ids; steps need the tree with the shifted ones.
    await fs.rm(ctx.bundle, { recursive: true, force: true });
    unpacked = false;
  }
  if (!unpacked) {
    ctx.emit({ step: "rootfs", phase: "progress", message: "unpacking the image (umoci)" });
    await umociUnpack(entry.layout, ctx.bundle, ctx.signal, stepsToRun ? umociIdMap(ctx.range) : undefined);
  }
  if (stepsToRun) {
    // The steps' sandboxes (the range's first id) must reach the tree; no local user may.
    await assertReachableByBuildRange(ctx.staging.dir, ctx.range, "the build's staging directory");
    await openToBuildRange(ctx.staging.dir, ctx.range);
    await openToBuildRange(ctx.bundle, ctx.range);
  }
}

// ---- the base ----

/** Whether an archive is an OCI archive (has oci-layout) or a `docker save` one (has manifest.json). */
export async function archiveKind(file: string, signal?: AbortSignal): Promise<ArchiveKind> {
  let kind: ArchiveKind | undefined;
  const parser = new Parser({ strict: true });
  parser.on("entry", (entry: ReadEntry) => {
    const name = entry.path.replace(/^\.\//, "");
    if (name === "oci-layout") kind = "oci-archive";
    else if (name === "manifest.json" && kind === undefined) kind = "docker-archive";
    entry.resume();
  });
  try {
    await pipeline(createReadStream(file), parser as unknown as NodeJS.WritableStream, { signal });
  } catch (err) {
    throw new ForkdError("invalid_argument", `${file} is not a readable tar archive: ${errorMessage(err)}`);
  }
  if (!kind) {
    throw new ForkdError(
      "invalid_argument",
      `${file} is neither an OCI archive (no oci-layout) nor a Docker archive (no manifest.json)`,
    );
  }
  return kind;
}

/** A link to `target` in the staging directory, so a host path with ':' in it never reaches skopeo. */
async function transportLink(ctx: Context, name: string, target: string): Promise<string> {
  const link = path.join(ctx.staging.work, name);
  await fs.symlink(target, link);
  return link;
}

async function makeBase(
  ctx: Context,
  base: PlannedBase,
): Promise<{ entry: StepEntry; unpacked: boolean; seconds: number }> {
  const started = performance.now();
  const label = stepLabel(ctx, 0, base.description);
  const emitBase = (message: string) =>
    ctx.emit({ step: "rootfs", phase: "progress", message, buildStep: 0 });
  emitBase(`${label} ...`);
  const pending = await beginStep(ctx.staging.work, base.key);
  const job: BaseJob = { ctx, base, pending, label, started, emitBase };
  const source = base.source;
  const fail = (err: unknown): never => {
    if (ctx.signal?.aborted) throw err;
    const code = err instanceof ForkdError ? err.code : "internal";
    throw new ForkdError(code, `${label} failed: ${errorMessage(err)}`, {
      cause: err,
      detail: { buildStep: 0 },
    });
  };
  try {
    if (source.kind === "debian") {
      await debianBase(job, source);
      const entry = await publishBase(job, DEFAULT_SETTINGS);
      return { entry, unpacked: true, seconds: seconds(started) };
    }
    await copyBaseImage(job, source);
    const image = await resolveImage(pending.layout, "image");
    emitBase(`${label}: checking ${image.manifest.layers.length} layers`);
    await checkLayers(pending.layout, image.manifest.layers, ctx.signal);
    const entry = await publishBase(job, settingsOf(image.config));
    return { entry, unpacked: false, seconds: seconds(started) };
  } catch (err) {
    return fail(err);
  }
}

/** One base being made: where it goes and how it reports. */
interface BaseJob {
  ctx: Context;
  base: PlannedBase;
  pending: PendingStep;
  label: string;
  started: number;
  emitBase(message: string): void;
}

type BaseSource = PlannedBase["source"];

/** Debian by mmdebstrap into an empty umoci bundle, repacked into the pending layout (left unpacked). */
async function debianBase(job: BaseJob, source: Extract<BaseSource, { kind: "debian" }>): Promise<void> {
  const { ctx, base, pending, label } = job;
  await umociInitLayout(pending.layout, ctx.signal);
  await umociUnpack(pending.layout, ctx.bundle, ctx.signal);
  await debootstrap({
    suite: source.suite,
    packages: base.packages,
    target: path.join(ctx.bundle, "rootfs"),
    tmpDir: path.join(ctx.staging.work, "tmp"),
    signal: ctx.signal,
    onStatus: (message) => job.emitBase(`${label}: ${message}`),
  });
  await umociRepack(pending.layout, ctx.bundle, `forkd base: ${base.description}`, ctx.signal);
}

/** An image from elsewhere into the pending layout: skopeo for layouts, archives and registries, buildah for a Dockerfile. */
async function copyBaseImage(job: BaseJob, source: Exclude<BaseSource, { kind: "debian" }>): Promise<void> {
  const { ctx, pending, label, started, emitBase } = job;
  const dest = ociLayoutName(pending.layout, "image");
  switch (source.kind) {
    case "oci-layout":
      await skopeoCopy(
        ociLayoutName(await transportLink(ctx, "source-layout", source.path), source.ref),
        dest,
        {
          signal: ctx.signal,
        },
      );
      break;
    case "archive": {
      const kind = await archiveKind(source.path, ctx.signal);
      const link = await transportLink(ctx, "source-archive.tar", source.path);
      await skopeoCopy(archiveName(kind, link, source.ref), dest, { signal: ctx.signal });
      break;
    }
    case "registry":
      await skopeoCopy(`docker://${source.ref}`, dest, {
        signal: ctx.signal,
        srcTlsVerify: registryTlsVerify(source.ref, source.insecure),
      });
      break;
    case "dockerfile": {
      const built = await buildDockerfile({
        source,
        cacheDir: ctx.cacheDir,
        workDir: ctx.staging.work,
        layout: pending.layout,
        signal: ctx.signal,
        noCache: ctx.replace,
        onLine: (line) => {
          if (/^STEP \d+\/\d+:/.test(line)) emitBase(`${label}: ${line} (at ${seconds(started)} s)`);
        },
      });
      emitBase(
        `${label}: ${built.instructions.length} instructions built (image ${built.imageId.slice(0, 12)})`,
      );
      break;
    }
  }
}

function publishBase(job: BaseJob, settings: ImageSettings): Promise<StepEntry> {
  const { ctx, base } = job;
  return publishStep(
    ctx.cacheDir,
    job.pending,
    {
      key: base.key,
      parent: null,
      description: base.description,
      settings,
      seconds: seconds(job.started),
    },
    ctx.replace,
  );
}

// ---- steps ----

async function applyStep(
  ctx: Context,
  planned: PlannedStep,
  parent: StepEntry,
  before: ImageSettings,
): Promise<{ entry: StepEntry; settings: ImageSettings }> {
  const root = path.join(ctx.bundle, "rootfs");
  const label = stepLabel(ctx, planned.number, planned.description);
  const pending = await beginStep(ctx.staging.work, planned.key);
  await cloneLayout(parent.layout, pending.layout);
  let settings = before;
  const started = performance.now();
  const output = (line: string) =>
    ctx.emit({ step: "rootfs", phase: "progress", message: `${label}: ${line}`, buildStep: planned.number });
  try {
    const outcome = await applyStepKind({ ctx, root, planned, label, settings: before, output });
    settings = outcome.settings;
    if (outcome.changedTree) await umociRepack(pending.layout, ctx.bundle, `forkd ${label}`, ctx.signal);
  } catch (err) {
    if (ctx.signal?.aborted) throw err;
    const code = err instanceof ForkdError ? err.code : "internal";
    const message = errorMessage(err);
    throw new ForkdError(code, message.startsWith(label) ? message : `${label}: ${message}`, {
      cause: err,
      detail: { buildStep: planned.number },
    });
  }
  const entry = await publishStep(
    ctx.cacheDir,
    pending,
    {
      key: planned.key,
      parent: parent.record.key,
      description: planned.description,
      settings,
      seconds: seconds(started),
    },
    ctx.replace,
  );
  return { entry, settings };
}
