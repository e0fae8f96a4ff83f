#!/usr/bin/env node
/**
 * Builds the guest payload that the image builder copies verbatim to /opt/forkd/ in every guest:
 *
 *   forkd-agent   the Go agent (src/agent/guest), static: CGO_ENABLED=0, standard library only
 *   worker.py     the warm Python worker
 *   kernels.py    its bash (and other languages') contexts, loaded on first use
 *   magics.py     IPython's `!cmd` and `%magic` lines in Python cells, loaded on first use
 *
 * Usage: node scripts/build-guest.mjs [--out <dir>]   (default dist/guest). The directory is built beside the
 * target and renamed into place, so a failed build never leaves a half-written payload behind.
 *
 * Also builds dist/tools/forkd-runas (src/image/runas, static): not part of the guest payload, the image
 * builder bind-mounts it into a build step's sandbox to run the step as the image's user.
 */
import { execFileSync } from "node:child_process";
import { realpathSync } from "node:fs";
import { cp, mkdir, rename, rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

export async function buildGuest(outDir) {
  const target = path.resolve(outDir);
  const staging = `${target}.tmp-${process.pid}`;
  await rm(staging, { recursive: true, force: true });
  await mkdir(staging, { recursive: true });
  try {
    execFileSync(
      "go",
      [
        "build",
        "-trimpath",
        // No VCS stamp: the binary (and so the image recipe hash) depends on the sources, not on the commit.
        "-buildvcs=false",
        "-ldflags",
        "-s -w",
        "-o",
        path.join(staging, "forkd-agent"),
        "./src/agent/guest",
      ],
      { cwd: root, stdio: "inherit", env: { ...process.env, CGO_ENABLED: "0" } },
    );
    for (const file of ["worker.py", "kernels.py", "magics.py"]) {
      await cp(path.join(root, "src/agent/guest", file), path.join(staging, file));
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

/** Builds the host-side build tools (dist/tools); like the payload, renamed into place when complete. */
export async function buildTools(outDir) {
  const target = path.resolve(outDir);
  const staging = `${target}.tmp-${process.pid}`;
  await rm(staging, { recursive: true, force: true });
  await mkdir(staging, { recursive: true });
  try {
    execFileSync(
      "go",
      [
        "build",
        "-trimpath",
        "-ldflags",
        "-s -w",
        "-o",
        path.join(staging, "forkd-runas"),
        "./src/image/runas",
      ],
      { cwd: root, stdio: "inherit", env: { ...process.env, CGO_ENABLED: "0" } },
    );
    await rm(target, { recursive: true, force: true });
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
  const target = await buildGuest(values.out);
  console.log(`guest agent built into ${path.relative(process.cwd(), target) || "."}`);
  const tools = await buildTools(path.join(path.dirname(target), "tools"));
  console.log(`build tools built into ${path.relative(process.cwd(), tools) || "."}`);
}
