#!/usr/bin/env node
/**
 * Builds the sandbox launcher (src/isolation/launcher, Go, standard library only) into dist/forkd-launcher:
 * a static binary (CGO_ENABLED=0) with no paths of this machine in it (-trimpath). The Go toolchain is
 * Debian's golang-go; no module is downloaded (GOPROXY=off, GOFLAGS=-mod=mod with no requirements).
 *
 * Also builds dist/forkd-netd (src/net/netd, its own Go module: the daemon's network helper, which uses the
 * netlink and netns modules pinned by its go.sum, fetched through the machine's own Go module configuration;
 * -mod=readonly, so a build never changes go.mod or go.sum), and dist/forkd-ro-ram.so (src/isolation/ro-ram/ro-ram.c, libc only, with the machine's C compiler
 * `cc` or $CC): the library confined QEMUs preload so they open their shared RAM image read-only.
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

const netd = path.join(path.dirname(target), "forkd-netd");
const netdStaging = `${netd}.tmp-${process.pid}`;
const netdEnv = { ...process.env, CGO_ENABLED: "0", GOFLAGS: "-mod=readonly", GOCACHE: env.GOCACHE };
const netdBuilt = spawnSync("go", ["build", "-trimpath", "-ldflags=-s -w", "-o", netdStaging, "."], {
  cwd: path.join(root, "src", "net", "netd"),
  env: netdEnv,
  stdio: "inherit",
});
if (netdBuilt.error || netdBuilt.status !== 0) {
  rmSync(netdStaging, { force: true });
  const why = netdBuilt.error ? String(netdBuilt.error) : `go build exited with ${netdBuilt.status}`;
  console.error(`building forkd-netd failed: ${why}`);
  process.exit(1);
}
renameSync(netdStaging, netd);
console.log(`network helper built into ${path.relative(root, netd)}`);

const library = path.join(path.dirname(target), "forkd-ro-ram.so");
const libraryStaging = `${library}.tmp-${process.pid}`;
const cc = process.env.CC ?? "cc";
const built = spawnSync(
  cc,
  [
    "-shared",
    "-fPIC",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-o",
    libraryStaging,
    "src/isolation/ro-ram/ro-ram.c",
  ],
  { cwd: root, stdio: "inherit" },
);
if (built.error || built.status !== 0) {
  rmSync(libraryStaging, { force: true });
  const why = built.error ? String(built.error) : `${cc} exited with ${built.status}`;
  console.error(`building forkd-ro-ram.so failed: ${why} (is gcc installed? scripts/install-deps.sh)`);
  process.exit(1);
}
renameSync(libraryStaging, library);
console.log(`read-only RAM preload built into ${path.relative(root, library)}`);
