/**
 * `dockerfile` templates: Debian's buildah builds the Dockerfile without a daemon and the result is pushed
 * into an OCI layout, which the builder then treats like any other image (its layers are checked before
 * they are unpacked). buildah never runs as host root: it runs in the build-step sandbox's host-tool mode
 * (step-sandbox/host-tool.ts), root only of a user namespace mapped to the build range's unprivileged ids,
 * in a mount namespace holding only the host's /usr, a few /etc files, its storage, the build's work
 * directory and the context (read-only). What it is given:
 *
 *   buildah --root /forkd/storage --runroot /run/buildah --storage-driver vfs
 *     build --isolation chroot --layers --pull=false ...
 *
 * the vfs storage driver (no overlay mounts), chroot isolation for RUN (no runc or crun; a RUN that escapes it
 * with a double chroot lands in the sandbox above, not on the host), and `--layers` so unchanged instructions
 * come from buildah's own cache. Its storage lives in the image cache under `.buildah-userns/<key>/`, one per
 * Dockerfile location (its directory and file): a RUN that escaped could alter the cached layers of builds
 * of the same Dockerfile only. RUN has no network unless `dockerfile.network = true`, and then only the
 * machine's configured package indexes (step-sandbox/network.ts); the images its FROM lines name are pulled
 * first, by buildah in the host's network (pulling runs no code of the image). buildah runs in the context
 * directory, so a relative `FROM oci-archive:base.tar` names a file beside the Dockerfile.
 */

import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { GUEST_PLATFORM, isLoopbackRegistry, ociLayoutName, registryHost } from "./containers.js";
import { runText } from "./run.js";
import {
  assertReachableByBuildRange,
  buildIdRange,
  giveAllToBuildRange,
  giveToBuildRange,
  type HostToolRun,
  openToBuildRange,
  runHostTool,
  takeFromBuildRange,
} from "./step-sandbox/index.js";
import type { ImageSource } from "./template.js";

export type DockerfileSource = Extract<ImageSource, { kind: "dockerfile" }>;

/** Where things are inside buildah's sandbox. */
const IN = {
  storage: "/forkd/storage",
  run: "/run/buildah",
  context: "/forkd/context",
  dockerfile: "/forkd/Dockerfile",
  work: "/forkd/work",
} as const;

export function buildahGlobalArgs(): string[] {
  return ["--root", IN.storage, "--runroot", IN.run, "--storage-driver", "vfs"];
}

/** buildah's storage for Dockerfiles at `source`'s location. */
export function buildahStorageDir(
  cacheDir: string,
  source: Pick<DockerfileSource, "context" | "file">,
): string {
  const key = createHash("sha256").update(`${source.context}\0${source.file}`).digest("hex").slice(0, 16);
  return path.join(cacheDir, ".buildah-userns", key);
}

export interface DockerfileBuild {
  imageId: string;
  /** Seconds from the build's start to each instruction's start, as buildah reported them. */
  instructions: { text: string; startedS: number }[];
}

/**
 * The registry images a Dockerfile's FROM lines name (`${ARG}` and `$ARG` expanded from the template's args
 * and the ARG defaults before them), leaving out earlier stages, `scratch` and local transports
 * (oci-archive:, docker-archive:, oci:, dir:).
 */
export function registryImagesOf(dockerfile: string, args: Readonly<Record<string, string>>): string[] {
  const lines = dockerfile.replace(/\\\r?\n/g, " ").split(/\r?\n/);
  const values: Record<string, string> = {};
  const stages = new Set<string>();
  const images: string[] = [];
  const expand = (text: string) =>
    text.replace(
      /\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g,
      (_, a?: string, b?: string) => {
        const name = (a ?? b) as string;
        return args[name] ?? values[name] ?? "";
      },
    );
  for (const raw of lines) {
    const line = raw.trim();
    const arg = /^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?/i.exec(line);
    if (arg) {
      values[arg[1] as string] = expand((arg[2] ?? "").replace(/^"(.*)"$/, "$1"));
      continue;
    }
    const from = /^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?/i.exec(line);
    if (!from) continue;
    const image = expand(from[1] as string).replace(/^docker:\/\//, "");
    const local =
      image === "" ||
      image === "scratch" ||
      stages.has(image.toLowerCase()) ||
      /^(oci-archive|docker-archive|oci|dir|containers-storage):/.test(image);
    if (!local) images.push(image);
    if (from[2]) stages.add(from[2].toLowerCase());
  }
  return [...new Set(images)];
}

/** Registry credentials forkd's own pulls use (skopeo's usual files), for the pulls only, never for RUN. */
async function registryAuthFile(): Promise<string | undefined> {
  const candidates = [
    process.env.REGISTRY_AUTH_FILE,
    process.env.XDG_RUNTIME_DIR && path.join(process.env.XDG_RUNTIME_DIR, "containers", "auth.json"),
    "/run/containers/0/auth.json",
    process.env.HOME && path.join(process.env.HOME, ".docker", "config.json"),
  ];
  for (const file of candidates) {
    if (file && (await fs.stat(file).catch(() => undefined))?.isFile()) return file;
  }
  return undefined;
}

export interface DockerfileBuildOptions {
  source: DockerfileSource;
  cacheDir: string;
  workDir: string;
  layout: string;
  signal?: AbortSignal;
  onLine?: (line: string) => void;
  /** A forced build: no instruction from buildah's layer cache, FROM images pulled again. */
  noCache?: boolean;
}

/** Builds `source` with buildah (sandboxed) and pushes the result to `<layout>:image`. */
export async function buildDockerfile(opts: DockerfileBuildOptions): Promise<DockerfileBuild> {
  const { source } = opts;
  const workspace = await prepareWorkspace(opts);
  const sandbox = buildahSandbox(workspace, opts.signal);
  if (source.network) await pullFromImages(sandbox, workspace, source, opts.noCache === true);
  const started = performance.now();
  const instructions: DockerfileBuild["instructions"] = [];
  const onLine = (line: string) => {
    const step = /^STEP \d+\/\d+: (.*)$/.exec(line);
    if (step) instructions.push({ text: step[1] as string, startedS: (performance.now() - started) / 1000 });
    opts.onLine?.(line);
  };
  await runBuild(sandbox, source, buildArgs(source, opts.noCache === true), onLine);
  const imageId = (await fs.readFile(path.join(workspace.work, "iid"), "utf8"))
    .trim()
    .replace(/^sha256:/, "");
  if (!/^[0-9a-f]{64}$/.test(imageId))
    throw new ForkdError("internal", `buildah wrote an odd image id ${imageId}`);
  await sandbox(
    "none",
    ["push", "--quiet", imageId, ociLayoutName(`${IN.work}/out`, "image")],
    "buildah push (to an OCI layout)",
  );
  // The layout becomes forkd's: root's, and nothing the build range's ids could still change.
  const out = path.join(workspace.work, "out");
  await takeFromBuildRange(out);
  await fs.rename(out, opts.layout);
  return { imageId, instructions };
}

/** Host paths of one build, all the build range's. */
interface Workspace {
  range: ReturnType<typeof buildIdRange>;
  storage: string;
  work: string;
  context: string;
  dockerfile: string;
}

/** One buildah command in the sandbox, with the workspace mounted (see the module comment). */
type BuildahRun = (
  network: HostToolRun["network"],
  argv: string[],
  label: string,
  extra?: Partial<HostToolRun>,
) => ReturnType<typeof runHostTool>;

/** Gives buildah its storage and a work directory, with copies of the context and the Dockerfile. */
async function prepareWorkspace(opts: DockerfileBuildOptions): Promise<Workspace> {
  const range = buildIdRange();
  const storage = buildahStorageDir(opts.cacheDir, opts.source);
  const work = path.join(opts.workDir, "dockerfile");
  // buildah (the range's first id) must reach its storage and the build's work directory; nobody else may.
  await assertReachableByBuildRange(path.dirname(opts.workDir), range, "the build's staging directory");
  await openToBuildRange(path.dirname(storage), range);
  await giveToBuildRange(storage, range);
  await openToBuildRange(path.dirname(opts.workDir), range);
  await giveToBuildRange(work, range);
  // The context and the Dockerfile, copied where the range can read them (never a host path of the template's).
  const context = path.join(work, "context");
  const dockerfile = path.join(work, "Dockerfile");
  await fs.cp(opts.source.context, context, { recursive: true, verbatimSymlinks: true });
  await fs.copyFile(opts.source.file, dockerfile);
  await giveAllToBuildRange(context, range);
  await giveAllToBuildRange(dockerfile, range);
  return { range, storage, work, context, dockerfile };
}

function buildahSandbox(workspace: Workspace, signal: AbortSignal | undefined): BuildahRun {
  const { storage, work, context, dockerfile } = workspace;
  return (network, argv, label, extra = {}) =>
    runHostTool({
      argv: ["buildah", ...buildahGlobalArgs(), ...argv],
      dirs: [
        { host: storage, dest: IN.storage, writable: true },
        { host: work, dest: IN.work, writable: true },
        { host: context, dest: IN.context, writable: false },
      ],
      files: [{ host: dockerfile, dest: IN.dockerfile }, ...(extra.files ?? [])],
      scratchDir: work,
      network,
      env: { HOME: IN.work, TMPDIR: IN.work, ...extra.env },
      cwd: IN.context,
      label,
      signal,
      stdout: "lines",
      onOutputLine: extra.onOutputLine,
    });
}

/** Pulls the registry images the FROM lines name, in the host's network, with forkd's registry credentials. */
async function pullFromImages(
  sandbox: BuildahRun,
  workspace: Workspace,
  source: DockerfileSource,
  noCache: boolean,
): Promise<void> {
  const text = await fs.readFile(source.file, "utf8");
  const auth = await registryAuthFile();
  const authCopy = path.join(workspace.work, "auth.json");
  if (auth) {
    await fs.copyFile(auth, authCopy);
    await fs.chmod(authCopy, 0o600);
    await giveAllToBuildRange(authCopy, workspace.range);
  }
  try {
    for (const image of registryImagesOf(text, source.args)) {
      const host = registryHost(image);
      await sandbox(
        "host",
        [
          "pull",
          "--quiet",
          "--policy",
          noCache ? "always" : "missing",
          "--platform",
          `${GUEST_PLATFORM.os}/${GUEST_PLATFORM.arch}`,
          ...(host && isLoopbackRegistry(image) ? ["--tls-verify=false"] : []),
          "--",
          image,
        ],
        `buildah pull ${image}`,
        auth
          ? {
              files: [{ host: authCopy, dest: "/forkd/auth.json" }],
              env: { REGISTRY_AUTH_FILE: "/forkd/auth.json" },
            }
          : {},
      );
    }
  } finally {
    // The credentials are for the pulls, never for RUN.
    await fs.rm(authCopy, { force: true });
  }
}

/** `buildah build`'s arguments: chroot isolation, buildah's layer cache, nothing pulled, the image id to a file. */
function buildArgs(source: DockerfileSource, noCache: boolean): string[] {
  const args = [
    "build",
    "--isolation",
    "chroot",
    "--layers",
    "--pull=false",
    "--platform",
    `${GUEST_PLATFORM.os}/${GUEST_PLATFORM.arch}`,
    "--iidfile",
    `${IN.work}/iid`,
    ...(noCache ? ["--no-cache"] : []),
    "-f",
    IN.dockerfile,
  ];
  for (const [name, value] of Object.entries(source.args)) args.push("--build-arg", `${name}=${value}`);
  if (source.target !== undefined) args.push("--target", source.target);
  args.push("--", IN.context);
  return args;
}

/** Runs the build; a network failure says what network RUN has. */
async function runBuild(
  sandbox: BuildahRun,
  source: DockerfileSource,
  args: string[],
  onLine: (line: string) => void,
): Promise<void> {
  const label = `buildah build ${source.fileRelative}${source.network ? "" : " (no network)"}`;
  try {
    await sandbox(source.network ? "indexes" : "none", args, label, { onOutputLine: onLine });
  } catch (err) {
    if (err instanceof ForkdError && /dial|lookup|network is unreachable|no such host/i.test(err.message)) {
      throw new ForkdError(
        err.code,
        `${err.message}\n(${
          source.network
            ? "RUN reaches only this machine's configured package indexes"
            : "the build has no network; set dockerfile.network = true if it must download from the package indexes"
        })`,
      );
    }
    throw err;
  }
}

/** buildah's version, for doctor and error messages. */
export async function buildahVersion(signal?: AbortSignal): Promise<string> {
  return (await runText("buildah", ["--version"], { signal })).trim();
}
