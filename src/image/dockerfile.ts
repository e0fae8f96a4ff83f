/**
 * `dockerfile` templates: Debian's buildah builds the Dockerfile without a daemon and the result is pushed
 * into an OCI layout, which the builder then treats like any other image (its layers are checked before
 * they are unpacked). What works on a Debian 12 host without a container runtime, and what forkd uses:
 *
 *   buildah --root <images>/.buildah/storage --runroot <images>/.buildah/run --storage-driver vfs
 *     build --isolation chroot --layers ...
 *
 * rootful (the daemon's uid 0), the vfs storage driver (no overlay mounts), chroot isolation (no runc or crun;
 * buildah's chroot isolation cannot create a network namespace, so the whole build runs under
 * `unshare --net` and has no network unless `dockerfile.network = true`), and `--layers` so unchanged
 * instructions come from buildah's own cache. buildah's storage lives in forkd's image cache, apart from any
 * other containers storage on the host. buildah runs in the context directory, so a relative
 * `FROM oci-archive:base.tar` names a file beside the Dockerfile.
 */

import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { GUEST_PLATFORM, ociLayoutName } from "./containers.js";
import { run, runText } from "./run.js";
import type { ImageSource } from "./template.js";

export type DockerfileSource = Extract<ImageSource, { kind: "dockerfile" }>;

export function buildahGlobalArgs(cacheDir: string): string[] {
  return [
    "--root",
    path.join(cacheDir, ".buildah", "storage"),
    "--runroot",
    path.join(cacheDir, ".buildah", "run"),
    "--storage-driver",
    "vfs",
  ];
}

export interface DockerfileBuild {
  imageId: string;
  /** Seconds from the build's start to each instruction's start, as buildah reported them. */
  instructions: { text: string; startedS: number }[];
}

/** Builds `source` with buildah and pushes the result to `<layout>:image`. */
export async function buildDockerfile(opts: {
  source: DockerfileSource;
  cacheDir: string;
  workDir: string;
  layout: string;
  signal?: AbortSignal;
  onLine?: (line: string) => void;
  /** A forced build: no instruction from buildah's layer cache. */
  noCache?: boolean;
}): Promise<DockerfileBuild> {
  const { source } = opts;
  const global = buildahGlobalArgs(opts.cacheDir);
  const iidFile = path.join(opts.workDir, "dockerfile.iid");
  const args = [
    ...global,
    "build",
    "--isolation",
    "chroot",
    "--layers",
    "--platform",
    `${GUEST_PLATFORM.os}/${GUEST_PLATFORM.arch}`,
    "--iidfile",
    iidFile,
    ...(opts.noCache ? ["--no-cache"] : []),
    "-f",
    source.file,
  ];
  for (const [name, value] of Object.entries(source.args)) args.push("--build-arg", `${name}=${value}`);
  if (source.target !== undefined) args.push("--target", source.target);
  args.push("--", source.context);
  const started = performance.now();
  const instructions: DockerfileBuild["instructions"] = [];
  const label = `buildah build ${source.fileRelative}`;
  const onLine = (line: string) => {
    const step = /^STEP \d+\/\d+: (.*)$/.exec(line);
    if (step) instructions.push({ text: step[1] as string, startedS: (performance.now() - started) / 1000 });
    opts.onLine?.(line);
  };
  try {
    if (source.network) {
      await run("buildah", args, {
        cwd: source.context,
        signal: opts.signal,
        stdout: "lines",
        onStderrLine: onLine,
        label,
      });
    } else {
      await run("unshare", ["--net", "--", "buildah", ...args], {
        cwd: source.context,
        signal: opts.signal,
        stdout: "lines",
        onStderrLine: onLine,
        label: `${label} (no network)`,
      });
    }
  } catch (err) {
    if (
      err instanceof ForkdError &&
      !source.network &&
      /dial|lookup|network is unreachable/i.test(err.message)
    ) {
      throw new ForkdError(
        err.code,
        `${err.message}\n(the build has no network; set dockerfile.network = true if it must pull or download)`,
      );
    }
    throw err;
  }
  const imageId = (await fs.readFile(iidFile, "utf8")).trim().replace(/^sha256:/, "");
  if (!/^[0-9a-f]{64}$/.test(imageId))
    throw new ForkdError("internal", `buildah wrote an odd image id ${imageId}`);
  await run("buildah", [...global, "push", "--quiet", imageId, ociLayoutName(opts.layout, "image")], {
    signal: opts.signal,
    stdout: "ignore",
    label: "buildah push (to an OCI layout)",
  });
  return { imageId, instructions };
}

/** buildah's version, for doctor and error messages. */
export async function buildahVersion(signal?: AbortSignal): Promise<string> {
  return (await runText("buildah", ["--version"], { signal })).trim();
}
