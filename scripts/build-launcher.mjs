#!/usr/bin/env node
/**
 * Builds the sandbox launcher (src/isolation/launcher, Go, standard library only) into dist/forkd-launcher:
 * a static binary (CGO_ENABLED=0) with no paths of this machine in it (-trimpath). The Go toolchain is
 * Debian's golang-go; no module is downloaded (GOPROXY=off, GOFLAGS=-mod=mod with no requirements).
 *
 * Usage: node scripts/build-launcher.mjs [--out <file>]   (default dist/forkd-launcher). Written beside the
 * target and renamed into place, so a failed build never leaves a half-written binary.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, renameSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { values } = parseArgs({ options: { out: { type: "string" } } });
const target = path.resolve(values.out ?? path.join(root, "dist", "forkd-launcher"));
const staging = `${target}.tmp-${process.pid}`;
mkdirSync(path.dirname(target), { recursive: true });

const env = {
  ...process.env,
  CGO_ENABLED: "0",
  GOPROXY: "off",
  GOFLAGS: "-mod=mod",
  GOCACHE: process.env.GOCACHE ?? path.join(os.tmpdir(), "forkd-go-build-cache"),
};
const result = spawnSync(
  "go",
  ["build", "-trimpath", "-ldflags=-s -w", "-o", staging, "./src/isolation/launcher"],
  { cwd: root, env, stdio: "inherit" },
);
if (result.error || result.status !== 0) {
  rmSync(staging, { force: true });
  const why = result.error ? String(result.error) : `go build exited with ${result.status}`;
  console.error(`building the launcher failed: ${why} (is golang-go installed? scripts/install-deps.sh)`);
  process.exit(1);
}
renameSync(staging, target);
console.log(`launcher built into ${path.relative(root, target)}`);
