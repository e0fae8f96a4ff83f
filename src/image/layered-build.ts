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
import {
  cloneLayout,
  DEFAULT_SETTINGS,
  type ImageSettings,
  resolveImage,
  settingsOf,
  withEnv,
} from "./oci-layout.js";
import { PACKAGE_INPUT, stepPackageEnvironment } from "./package-config.js";
import type { Emit } from "./progress.js";
import { addAccount, DEFAULT_USER, debootstrap, onGuestPath, resolveInRoot } from "./rootfs.js";
import { beginStep, publishStep, readStepEntry, type StepEntry } from "./step-cache.js";
import type { BuildPlan, PlannedBase, PlannedStep } from "./step-plan.js";
import {
  assertConfiguredIndex,
  assertReachableByBuildRange,
  type BuildIdRange,
  buildIdRange,
  type Credentials,
  hostId,
  openToBuildRange,
  resolveCredentials,
  runInImage,
  SANDBOX_INPUTS,
  umociIdMap,
} from "./step-sandbox/index.js";
import { copyIntoTree } from "./tree-copy.js";

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
  let resumeAt = -1;
  let entry: StepEntry | undefined;
  for (let i = links.length - 1; i >= 0 && !entry && !opts.fresh; i--) {
    entry = await readStepEntry(ctx.cacheDir, (links[i] as PlannedBase | PlannedStep).key);
    if (entry) resumeAt = i;
  }
  const reports: StepReport[] = [];
  let unpacked = false;
  if (!entry) {
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
    for (let i = 0; i <= resumeAt; i++) {
      const link = links[i] as PlannedBase | PlannedStep;
      const number = i === 0 ? 0 : (link as PlannedStep).number;
      reports.push({ number, description: link.description, key: link.key, cached: true, seconds: 0 });
      ctx.emit({
        step: "rootfs",
        phase: "progress",
        message: `${stepLabel(ctx, number, link.description)} (cached)`,
        buildStep: number,
      });
    }
  }
  const toRun = plan.steps.slice(resumeAt);
  if (unpacked && toRun.length > 0) {
    // The Debian base was made with the image's own ids; steps need the tree with the shifted ones.
    await fs.rm(ctx.bundle, { recursive: true, force: true });
    unpacked = false;
  }
  if (!unpacked) {
    ctx.emit({ step: "rootfs", phase: "progress", message: "unpacking the image (umoci)" });
    await umociUnpack(
      entry.layout,
      ctx.bundle,
      ctx.signal,
      toRun.length > 0 ? umociIdMap(ctx.range) : undefined,
    );
  }
  if (toRun.length > 0) {
    // The steps' sandboxes (the range's first id) must reach the tree; no local user may.
    await assertReachableByBuildRange(ctx.staging.dir, ctx.range, "the build's staging directory");
    await openToBuildRange(ctx.staging.dir, ctx.range);
    await openToBuildRange(ctx.bundle, ctx.range);
  }
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
      await umociInitLayout(pending.layout, ctx.signal);
      await umociUnpack(pending.layout, ctx.bundle, ctx.signal);
      await debootstrap({
        suite: source.suite,
        packages: base.packages,
        target: path.join(ctx.bundle, "rootfs"),
        tmpDir: path.join(ctx.staging.work, "tmp"),
        signal: ctx.signal,
        onStatus: (message) => emitBase(`${label}: ${message}`),
      });
      await umociRepack(pending.layout, ctx.bundle, `forkd base: ${base.description}`, ctx.signal);
      const entry = await publishStep(
        ctx.cacheDir,
        pending,
        {
          key: base.key,
          parent: null,
          description: base.description,
          settings: DEFAULT_SETTINGS,
          seconds: seconds(started),
        },
        ctx.replace,
      );
      return { entry, unpacked: true, seconds: seconds(started) };
    }
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
    const image = await resolveImage(pending.layout, "image");
    emitBase(`${label}: checking ${image.manifest.layers.length} layers`);
    await checkLayers(pending.layout, image.manifest.layers, ctx.signal);
    const entry = await publishStep(
      ctx.cacheDir,
      pending,
      {
        key: base.key,
        parent: null,
        description: base.description,
        settings: settingsOf(image.config),
        seconds: seconds(started),
      },
      ctx.replace,
    );
    return { entry, unpacked: false, seconds: seconds(started) };
  } catch (err) {
    return fail(err);
  }
}

// ---- steps ----

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
async function packageEnvironment(ctx: Context, root: string, planned: PlannedStep, label: string) {
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

async function applyStep(
  ctx: Context,
  planned: PlannedStep,
  parent: StepEntry,
  before: ImageSettings,
): Promise<{ entry: StepEntry; settings: ImageSettings }> {
  const { step } = planned;
  const root = path.join(ctx.bundle, "rootfs");
  const label = stepLabel(ctx, planned.number, planned.description);
  const pending = await beginStep(ctx.staging.work, planned.key);
  await cloneLayout(parent.layout, pending.layout);
  let settings = before;
  let changedTree = true;
  const started = performance.now();
  const output = (line: string) =>
    ctx.emit({ step: "rootfs", phase: "progress", message: `${label}: ${line}`, buildStep: planned.number });
  try {
    switch (step.kind) {
      case "run": {
        const credentials = await credentialsFor(root, settings.user);
        const packages = step.network ? await packageEnvironment(ctx, root, planned, label) : undefined;
        await runInImage({
          root,
          argv: step.argv,
          env: withEnv(envFor(settings, credentials), packages?.env ?? {}),
          cwd: settings.workdir,
          credentials,
          network: step.network,
          scratchDir: ctx.staging.work,
          inputs: packages ? [{ host: packages.inputDir, name: PACKAGE_INPUT }] : [],
          timeoutS: step.timeoutS,
          label,
          signal: ctx.signal,
          onOutputLine: output,
        });
        break;
      }
      case "pip": {
        await requireTool(root, settings, "python3", "pip steps use the image's own pip (python3 -m pip)");
        const credentials = await credentialsFor(root, settings.user);
        const inputs: { host: string; name: string }[] = [];
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
        const network = step.wheels === undefined;
        const packages = network ? await packageEnvironment(ctx, root, planned, label) : undefined;
        // Environment rather than flags: a pip too old to know one ignores the variable instead of failing.
        const pipEnv = withEnv(envFor(settings, credentials), {
          ...packages?.env,
          PIP_NO_CACHE_DIR: "1",
          PIP_DISABLE_PIP_VERSION_CHECK: "1",
          PIP_ROOT_USER_ACTION: "ignore",
          PIP_BREAK_SYSTEM_PACKAGES: "1",
        });
        await runInImage({
          root,
          argv: args,
          env: pipEnv,
          cwd: settings.workdir,
          credentials,
          network,
          inputs: [...inputs, ...(packages ? [{ host: packages.inputDir, name: PACKAGE_INPUT }] : [])],
          scratchDir: ctx.staging.work,
          timeoutS: step.timeoutS,
          label,
          signal: ctx.signal,
          onOutputLine: output,
        });
        break;
      }
      case "apt": {
        await requireTool(root, settings, "apt-get", "apt steps use the image's own apt-get");
        const packages = await packageEnvironment(ctx, root, planned, label);
        // The names are argv ("$@"), never part of the script; lists and caches go with the step.
        const script =
          'apt-get update -q && apt-get install -y -q $FORKD_APT_RECOMMENDS "$@" && apt-get clean && rm -rf /var/lib/apt/lists/*';
        await runInImage({
          root,
          argv: ["/bin/sh", "-c", script, "forkd-apt", ...step.packages],
          env: withEnv(envFor(settings, null), {
            ...packages.env,
            DEBIAN_FRONTEND: "noninteractive",
            DEBCONF_NOWARNINGS: "yes",
            FORKD_APT_RECOMMENDS: step.recommends ? "" : "--no-install-recommends",
          }),
          cwd: "/",
          credentials: null,
          network: true,
          inputs: [{ host: packages.inputDir, name: PACKAGE_INPUT }],
          scratchDir: ctx.staging.work,
          timeoutS: step.timeoutS,
          label,
          signal: ctx.signal,
          onOutputLine: output,
        });
        break;
      }
      case "npm": {
        await requireTool(root, settings, "npm", "npm steps use the image's own npm");
        const credentials = await credentialsFor(root, settings.user);
        const packages = await packageEnvironment(ctx, root, planned, label);
        await runInImage({
          root,
          argv: [
            "npm",
            "install",
            ...(step.global ? ["--global"] : []),
            "--no-fund",
            "--no-audit",
            ...step.packages,
          ],
          env: withEnv(envFor(settings, credentials), {
            ...packages.env,
            NPM_CONFIG_UPDATE_NOTIFIER: "false",
            NPM_CONFIG_CACHE: "/tmp/forkd-npm-cache",
          }),
          cwd: settings.workdir,
          credentials,
          network: true,
          inputs: [{ host: packages.inputDir, name: PACKAGE_INPUT }],
          scratchDir: ctx.staging.work,
          timeoutS: step.timeoutS,
          label,
          signal: ctx.signal,
          onOutputLine: output,
        });
        break;
      }
      case "adduser":
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
        break;
      case "copy": {
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
        break;
      }
      case "env":
        settings = { ...settings, env: withEnv(settings.env, step.env) };
        changedTree = false;
        break;
      case "workdir": {
        const dir = await resolveInRoot(root, step.path, true);
        const existing = await fs.lstat(dir).catch(() => undefined);
        if (existing && !existing.isDirectory()) {
          throw new ForkdError("invalid_argument", `${step.path} exists in the image and is not a directory`);
        }
        changedTree = !existing;
        if (!existing) {
          const made = await fs.mkdir(dir, { recursive: true, mode: 0o755 });
          // Every directory made belongs to the image's root (shifted, as the whole tree is).
          const root0 = hostId(ctx.range, 0);
          for (let d = dir; made !== undefined && d.length >= made.length; d = path.dirname(d)) {
            await fs.lchown(d, root0, root0);
          }
        }
        settings = { ...settings, workdir: step.path };
        break;
      }
      case "user":
        await credentialsFor(root, step.user);
        settings = { ...settings, user: step.user };
        changedTree = false;
        break;
    }
    if (changedTree) await umociRepack(pending.layout, ctx.bundle, `forkd ${label}`, ctx.signal);
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
