/**
 * Builds a guest image from a template, or returns the cached one. Two chains run side by side: the boot
 * chain (kernel package -> modules -> initramfs images) and the root filesystem chain (mmdebstrap -> payload
 * and files -> ext4). Both write inside one staging directory, which is renamed into the cache when
 * everything succeeded and removed in every case.
 */
import { randomUUID } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { abortError } from "../common/deadline.js";
import { ForkdError } from "../common/errors.js";
import { resolvePaths } from "../common/paths.js";
import {
  type BootPackages,
  type HostDistro,
  hostDistro,
  resolveBootPackages,
  unknownPackages,
} from "./apt.js";
import { buildBootParts } from "./boot.js";
import {
  type BuiltImage,
  createStaging,
  IMAGE_FILES,
  type ImageManifest,
  MANIFEST_FORMAT,
  publish,
  readImageDir,
  removeStaging,
  type Staging,
  sweepStaleStaging,
} from "./cache.js";
import { bootRecipeDigest, KERNEL_CMDLINE } from "./initramfs.js";
import { buildLayeredTree, type StepReport } from "./layered-build.js";
import { envRecord } from "./oci-layout.js";
import { defaultGuestPayloadDir } from "./package-root.js";
import { type BuildProgressEvent, type Emit, step } from "./progress.js";
import {
  BUILDER_VERSION,
  hashPayloadDir,
  imageTemplate,
  type Recipe,
  recipeHash,
  sha256File,
} from "./recipe.js";
import {
  customizeTree,
  DEBIAN_TREE_VERSION,
  debootstrap,
  type Ext4Result,
  makeExt4,
  onGuestPath,
  rootfsPackages,
} from "./rootfs.js";
import { type BuildPlan, planBuild } from "./step-plan.js";
import type { Template } from "./template.js";

export type { BuildProgressEvent, BuildStep } from "./progress.js";

export interface ImageOptions {
  /** Where images are cached (default: resolvePaths().images, i.e. FORKD_IMAGE_CACHE). */
  cacheDir?: string;
  /** The guest agent payload copied to /opt/forkd (default: dist/guest of the forkd package). */
  payloadDir?: string;
  signal?: AbortSignal;
}

export interface BuildOptions extends ImageOptions {
  onProgress?: (event: BuildProgressEvent) => void;
  /** Rebuild even if the recipe is cached; the new image replaces the old one. */
  force?: boolean;
}

export interface ResolvedRecipe {
  recipe: Recipe;
  hash: string;
  distro: HostDistro;
  boot: BootPackages;
  /** Format 2: the base and step keys. */
  plan?: BuildPlan;
}

const cacheDirOf = (options: ImageOptions) => path.resolve(options.cacheDir ?? resolvePaths().images);

/** The recipe a build of `template` would use now (asks apt only when its state changed since last time). */
export async function resolveRecipe(template: Template, options: ImageOptions = {}): Promise<ResolvedRecipe> {
  const distro = await hostDistro();
  const payloadHash = await hashPayloadDir(options.payloadDir ?? defaultGuestPayloadDir());
  const plan =
    template.format === 2 ? await planBuild(template, distro.suite, rootfsPackages(template)) : undefined;
  const normalized = await imageTemplate(template, plan?.finalKey);
  const boot = await resolveBootPackages(cacheDirOf(options), distro.arch, options.signal);
  const recipe: Recipe = {
    builderVersion: BUILDER_VERSION,
    bootRecipe: bootRecipeDigest(),
    suite: distro.suite,
    arch: distro.arch,
    kernelPackage: boot.kernelPackage,
    kernelVersion: boot.kernelVersion,
    busyboxVersion: boot.busyboxVersion,
    payloadHash,
    template: normalized,
    ...(plan ? {} : { debianTree: DEBIAN_TREE_VERSION }),
  };
  return { recipe, hash: recipeHash(recipe), distro, boot, plan };
}

/** The cached image for `template`'s current recipe, or undefined. Never builds. */
export async function findCachedImage(
  template: Template,
  options: ImageOptions = {},
): Promise<BuiltImage | undefined> {
  const { hash } = await resolveRecipe(template, options);
  return readImageDir(cacheDirOf(options), hash);
}

/** A cached image by its hash (e.g. the one a snapshot was made from), or undefined. */
export async function readImage(hash: string, options: ImageOptions = {}): Promise<BuiltImage | undefined> {
  return readImageDir(cacheDirOf(options), hash);
}

interface RootfsResult extends Ext4Result {
  /** Format 2: each base/step, cached or how long it took. */
  steps?: StepReport[];
  settings?: ImageManifest["settings"];
}

/** Format 1: mmdebstrap of the host's suite with the template's packages. */
async function debianTree(
  template: Template,
  resolved: ResolvedRecipe,
  tree: string,
  staging: Staging,
  emit: Emit,
  signal: AbortSignal,
): Promise<void> {
  const packages = rootfsPackages(template);
  await debootstrap({
    suite: resolved.distro.suite,
    packages,
    target: tree,
    tmpDir: path.join(staging.work, "tmp"),
    signal,
    onStatus: (message, fraction) => emit({ step: "rootfs", phase: "progress", message, fraction }),
  });
}

async function buildRootfsChain(
  template: Template,
  resolved: ResolvedRecipe,
  payloadDir: string,
  cacheDir: string,
  staging: Staging,
  emit: Emit,
  signal: AbortSignal,
  force: boolean,
): Promise<RootfsResult> {
  const plan = resolved.plan;
  let tree = path.join(staging.work, "rootfs");
  let steps: StepReport[] | undefined;
  let imageSettings: ImageManifest["settings"];
  const title = plan
    ? `root filesystem from ${plan.base.description}${plan.steps.length > 0 ? ` + ${plan.steps.length} steps` : ""}`
    : `Debian ${resolved.distro.suite} root filesystem (${rootfsPackages(template).join(", ")})`;
  await step(emit, "rootfs", title, async () => {
    let settings: { env: Record<string, string>; workdir: string } | undefined;
    if (plan) {
      const layered = await buildLayeredTree({ plan, cacheDir, staging, emit, signal, fresh: force });
      tree = layered.root;
      steps = layered.steps;
      settings = { env: envRecord(layered.settings.env), workdir: layered.settings.workdir };
      imageSettings = { ...settings, user: layered.settings.user };
      // The agent starts "python3" from its PATH, which is the image's.
      if (template.interpreter === "python" && !(await onGuestPath(tree, settings.env.PATH, "python3"))) {
        throw new ForkdError(
          "invalid_argument",
          `${template.source}: interpreter = "python", but the image has no python3 on its PATH ` +
            '(install it in a step, or use interpreter = "none")',
        );
      }
    } else {
      await debianTree(template, resolved, tree, staging, emit, signal);
    }
    emit({ step: "rootfs", phase: "progress", message: "adding the guest agent and template files" });
    await customizeTree({ root: tree, template, payloadDir, settings });
  });
  if (steps) emit({ step: "rootfs", phase: "progress", message: "step timings", steps });
  const ext4 = await step(emit, "filesystem", `ext4 image (${template.diskMib} MiB)`, async () => {
    const result = await makeExt4(
      tree,
      path.join(staging.out, IMAGE_FILES.rootfs),
      template.diskMib,
      template.source,
      signal,
    );
    await fs.rm(tree, { recursive: true, force: true });
    return result;
  });
  return { ...ext4, steps, settings: imageSettings };
}

/** Runs both chains; the first failure cancels the other, and both have stopped before this returns. */
async function runChains<A, B>(
  signal: AbortSignal | undefined,
  a: (signal: AbortSignal) => Promise<A>,
  b: (signal: AbortSignal) => Promise<B>,
): Promise<[A, B]> {
  const stop = new AbortController();
  const combined = signal ? AbortSignal.any([signal, stop.signal]) : stop.signal;
  let firstError: unknown;
  const guard = <T>(p: Promise<T>) =>
    p.catch((err: unknown) => {
      if (firstError === undefined) firstError = err;
      stop.abort(err);
      throw err;
    });
  const [ra, rb] = await Promise.allSettled([guard(a(combined)), guard(b(combined))]);
  if (signal?.aborted) throw abortError(signal, "image build");
  if (ra.status === "rejected" || rb.status === "rejected") throw firstError;
  return [ra.value, rb.value];
}

async function fileInfo(file: string): Promise<{ size: number; sha256: string }> {
  const st = await fs.stat(file);
  return { size: st.size, sha256: await sha256File(file) };
}

/** Builds the image for `template`, or returns it from the cache. */
export async function buildImage(template: Template, options: BuildOptions = {}): Promise<BuiltImage> {
  const emit: Emit = (event) => options.onProgress?.(event);
  const cacheDir = cacheDirOf(options);
  const payloadDir = path.resolve(options.payloadDir ?? defaultGuestPayloadDir());
  const { signal } = options;

  const resolved = await step(emit, "resolve", `template ${template.name}: resolving the recipe`, () =>
    resolveRecipe(template, { ...options, payloadDir }),
  );
  const { hash, boot } = resolved;
  const existing = await readImageDir(cacheDir, hash);
  if (existing && !options.force) {
    emit({ step: "finalize", phase: "done", message: `cached image ${hash.slice(0, 12)}`, fraction: 1 });
    return existing;
  }
  await assertBuildable(template, signal);
  await sweepStaleStaging(cacheDir);
  const started = performance.now();
  const staging = await createStaging(cacheDir, hash);
  try {
    const [bootParts, ext4] = await runChains(
      signal,
      (s) =>
        buildBootParts({
          boot,
          arch: resolved.distro.arch,
          cacheDir,
          staging,
          emit,
          signal: s,
          force: options.force === true,
        }),
      (s) =>
        buildRootfsChain(template, resolved, payloadDir, cacheDir, staging, emit, s, options.force === true),
    );
    return await step(emit, "finalize", `publishing image ${hash.slice(0, 12)}`, async () => {
      const manifest = await imageManifest({ template, resolved, staging, started, bootParts, ext4 });
      await fs.writeFile(
        path.join(staging.out, IMAGE_FILES.manifest),
        `${JSON.stringify(manifest, null, 2)}\n`,
      );
      if (signal?.aborted) throw abortError(signal, "image build");
      const outcome = await publish(staging, cacheDir, hash, options.force === true);
      const image = await readImageDir(cacheDir, hash);
      if (!image)
        throw new ForkdError("internal", `image ${hash} is incomplete after publishing (${outcome})`);
      return { ...image, cached: outcome === "lost-race", steps: ext4.steps };
    });
  } finally {
    await removeStaging(staging.dir);
  }
}

/** Refuses a build that cannot succeed here: not root, or packages the host's apt sources do not have. */
async function assertBuildable(template: Template, signal: AbortSignal | undefined): Promise<void> {
  if (process.geteuid?.() !== 0) {
    throw new ForkdError(
      "unavailable",
      "building an image needs root (mmdebstrap --mode=root creates device nodes and owns files as root)",
    );
  }
  const unknown = await unknownPackages(rootfsPackages(template), signal);
  if (unknown.length > 0) {
    throw new ForkdError(
      "invalid_argument",
      `${template.source}: field "packages": not found in the host's apt sources: ${unknown.join(", ")} ` +
        "(check the names; run apt-get update if they are new)",
    );
  }
}

/** The manifest of a built image, with the size and digest of each of its files in the staging directory. */
async function imageManifest(built: {
  template: Template;
  resolved: ResolvedRecipe;
  staging: Staging;
  started: number;
  bootParts: Awaited<ReturnType<typeof buildBootParts>>;
  ext4: Awaited<ReturnType<typeof buildRootfsChain>>;
}): Promise<ImageManifest> {
  const { template, resolved, bootParts, ext4 } = built;
  const { hash, recipe, boot } = resolved;
  const files: ImageManifest["files"] = {};
  for (const name of [IMAGE_FILES.kernel, IMAGE_FILES.initrd, IMAGE_FILES.probeInitrd, IMAGE_FILES.rootfs]) {
    files[name] = await fileInfo(path.join(built.staging.out, name));
  }
  return {
    format: MANIFEST_FORMAT,
    hash,
    buildId: randomUUID(),
    builtAt: new Date().toISOString(),
    buildSeconds: Math.round((performance.now() - built.started) / 100) / 10,
    recipe,
    kernel: {
      release: bootParts.release,
      package: boot.kernelPackage,
      version: boot.kernelVersion,
      cmdline: KERNEL_CMDLINE,
    },
    modules: bootParts.modules,
    rootfs: {
      uuid: ext4.uuid,
      usedMib: ext4.usedMib,
      diskMib: template.diskMib,
      packages: rootfsPackages(template),
    },
    files,
    origin: "built",
    ...(ext4.steps ? { steps: ext4.steps, settings: ext4.settings } : {}),
  };
}
