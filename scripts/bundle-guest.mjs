#!/usr/bin/env node
/**
 * Builds the guest agent directory that the image builder copies verbatim to /opt/forkd/ in every guest:
 *
 *   agent.mjs                     src/agent/guest/main.ts and everything it imports, one ESM file for Node 18
 *   worker.py                     the warm Python worker
 *   node_modules/koffi/...        koffi's runtime only (package.json, index.js, the linux_x64 binary)
 *
 * Usage: node scripts/bundle-guest.mjs [--out <dir>]   (default dist/guest). The directory is built beside the
 * target and renamed into place, so a failed build never leaves a half-written bundle behind.
 */
import { realpathSync } from "node:fs";
import { cp, mkdir, rename, rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { build } from "esbuild";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** Files of the koffi package the guest needs at runtime (index.js finds the binary under build/). */
const KOFFI_RUNTIME_FILES = ["package.json", "index.js", "LICENSE.txt", "build/koffi/linux_x64/koffi.node"];

export async function bundleGuest(outDir) {
  const target = path.resolve(outDir);
  const staging = `${target}.tmp-${process.pid}`;
  await rm(staging, { recursive: true, force: true });
  await mkdir(staging, { recursive: true });
  try {
    await build({
      entryPoints: [path.join(root, "src/agent/guest/main.ts")],
      outfile: path.join(staging, "agent.mjs"),
      bundle: true,
      platform: "node",
      target: "node18",
      format: "esm",
      external: ["koffi"],
      legalComments: "none",
      logLevel: "warning",
    });
    await cp(path.join(root, "src/agent/guest/worker.py"), path.join(staging, "worker.py"));
    const koffiSource = path.join(root, "node_modules/koffi");
    for (const file of KOFFI_RUNTIME_FILES) {
      const destination = path.join(staging, "node_modules/koffi", file);
      await mkdir(path.dirname(destination), { recursive: true });
      await cp(path.join(koffiSource, file), destination);
    }
    await rm(target, { recursive: true, force: true });
    await mkdir(path.dirname(target), { recursive: true });
    await rename(staging, target);
  } catch (err) {
    await rm(staging, { recursive: true, force: true });
    throw err;
  }
  return target;
}

// realpath: when run through a symlink, argv[1] is the link while import.meta.url is the target.
if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: { out: { type: "string", default: path.join(root, "dist/guest") } },
  });
  const target = await bundleGuest(values.out);
  console.log(`guest agent bundled into ${path.relative(process.cwd(), target) || "."}`);
}
