/**
 * The boot chain: kernel package -> module order -> boot and probe initramfs. Its output depends only on the
 * kernel and busybox versions (not on the template), so it is also kept in `<cache>/.boot/<key>/` and reused
 * by every recipe with the same kernel: building a second template skips the download and unpacking.
 */
import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { type BootPackages, downloadPackages } from "./apt.js";
import { IMAGE_FILES, type Staging } from "./cache.js";
import { bootRecipeDigest, buildBootInitramfs, buildProbeInitramfs } from "./initramfs.js";
import { extractKernel, moduleLoadOrder } from "./kernel.js";
import { type Emit, step } from "./progress.js";
import { BUILDER_VERSION, canonicalJson, sha256File } from "./recipe.js";
import { run } from "./run.js";

export interface BootParts {
  /** `uname -r` of the kernel. */
  release: string;
  /** Module file names the boot initramfs loads, in order. */
  modules: string[];
}

const BOOT_FILES = [IMAGE_FILES.kernel, IMAGE_FILES.initrd, IMAGE_FILES.probeInitrd];
const BOOT_MANIFEST = "boot.json";

interface BootManifest extends BootParts {
  key: string;
  files: Record<string, { size: number; sha256: string }>;
}

export function bootKey(boot: BootPackages, arch: string): string {
  const inputs = { builderVersion: BUILDER_VERSION, bootRecipe: bootRecipeDigest(), arch, ...boot };
  return createHash("sha256").update(canonicalJson(inputs)).digest("hex");
}

async function readBootCache(dir: string, key: string): Promise<BootManifest | undefined> {
  try {
    const manifest = JSON.parse(await fs.readFile(path.join(dir, BOOT_MANIFEST), "utf8")) as BootManifest;
    if (manifest.key !== key || !Array.isArray(manifest.modules) || typeof manifest.release !== "string") {
      return undefined;
    }
    // The files are small (~15 MB together): check their content, not just their size.
    for (const name of BOOT_FILES) {
      if ((await sha256File(path.join(dir, name))) !== manifest.files?.[name]?.sha256) return undefined;
    }
    return manifest;
  } catch {
    return undefined;
  }
}

async function buildFresh(boot: BootPackages, staging: Staging, emit: Emit, signal: AbortSignal) {
  const { kernel, busybox, modules } = await step(
    emit,
    "kernel",
    `kernel ${boot.kernelPackage}`,
    async () => {
      const debDir = path.join(staging.work, "debs");
      await fs.mkdir(debDir, { mode: 0o755 });
      const debs = await downloadPackages(
        [
          { name: boot.kernelPackage, version: boot.kernelVersion },
          { name: "busybox-static", version: boot.busyboxVersion },
        ],
        debDir,
        signal,
      );
      emit({ step: "kernel", phase: "progress", message: "extracting the kernel package", fraction: 0.3 });
      const kernel = await extractKernel(
        debs.get(boot.kernelPackage)!,
        path.join(staging.work, "kernel"),
        signal,
      );
      if (`linux-image-${kernel.release}` !== boot.kernelPackage) {
        throw new ForkdError("internal", `${boot.kernelPackage} contains kernel ${kernel.release}`);
      }
      const busyboxRoot = path.join(staging.work, "busybox");
      await run("dpkg-deb", ["-x", debs.get("busybox-static")!, busyboxRoot], { signal, stdout: "ignore" });
      const busybox = path.join(busyboxRoot, "bin", "busybox");
      if (!(await fs.stat(busybox).catch(() => undefined))?.isFile()) {
        throw new ForkdError("internal", "busybox-static has no bin/busybox");
      }
      emit({ step: "kernel", phase: "progress", message: "computing module order", fraction: 0.8 });
      const modules = await moduleLoadOrder(kernel, undefined, signal);
      return { kernel, busybox, modules };
    },
  );
  await step(emit, "initramfs", `initramfs (${modules.length} modules)`, async () => {
    await fs.copyFile(kernel.vmlinuz, path.join(staging.out, IMAGE_FILES.kernel));
    await buildBootInitramfs(
      path.join(staging.out, IMAGE_FILES.initrd),
      staging.work,
      busybox,
      modules,
      signal,
    );
    await buildProbeInitramfs(path.join(staging.out, IMAGE_FILES.probeInitrd), staging.work, busybox, signal);
  });
  return { release: kernel.release, modules: modules.map((m) => m.name) };
}

/** Copies `BOOT_FILES` of staging.out into the shared boot cache (published by rename, like images). */
async function storeBootCache(
  cacheDir: string,
  key: string,
  parts: BootParts,
  staging: Staging,
): Promise<void> {
  const tmp = path.join(staging.dir, "boot");
  await fs.mkdir(tmp);
  const files: BootManifest["files"] = {};
  for (const name of BOOT_FILES) {
    await fs.copyFile(path.join(staging.out, name), path.join(tmp, name));
    files[name] = {
      size: (await fs.stat(path.join(tmp, name))).size,
      sha256: await sha256File(path.join(tmp, name)),
    };
  }
  const manifest: BootManifest = { key, ...parts, files };
  await fs.writeFile(path.join(tmp, BOOT_MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`);
  await fs.mkdir(path.join(cacheDir, ".boot"), { recursive: true });
  const target = path.join(cacheDir, ".boot", key);
  await fs.rm(target, { recursive: true, force: true }); // only reached when it was missing or broken
  try {
    await fs.rename(tmp, target);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENOTEMPTY" && code !== "EEXIST") throw err; // a concurrent build stored it first
  }
}

/** Puts vmlinuz, initrd.img and probe-initrd.img into `staging.out`, from the boot cache when possible. */
export async function buildBootParts(opts: {
  boot: BootPackages;
  arch: string;
  cacheDir: string;
  staging: Staging;
  emit: Emit;
  signal: AbortSignal;
  force: boolean;
}): Promise<BootParts> {
  const { boot, cacheDir, staging, emit, signal } = opts;
  const key = bootKey(boot, opts.arch);
  const cacheEntry = path.join(cacheDir, ".boot", key);
  const cached = opts.force ? undefined : await readBootCache(cacheEntry, key);
  if (cached) {
    await step(emit, "kernel", `kernel ${boot.kernelPackage} and initramfs (cached)`, async () => {
      for (const name of BOOT_FILES)
        await fs.copyFile(path.join(cacheEntry, name), path.join(staging.out, name));
    });
    return { release: cached.release, modules: cached.modules };
  }
  const parts = await buildFresh(boot, staging, emit, signal);
  await storeBootCache(cacheDir, key, parts, staging);
  return parts;
}
