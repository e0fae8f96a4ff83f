/**
 * Runs one of the host's own build tools (buildah, for Dockerfiles) on untrusted input without host root: in
 * the build range's user namespace (userns.ts; the tool is root there and holds every capability only there, so
 * it can make the namespaces and mounts its own isolation needs), inside a mount namespace whose root is an
 * empty tmpfs holding only the host's /usr (read-only, with the /bin, /lib... links or binds that lead into
 * it), a few /etc files the tool reads, fresh /proc, /dev, /tmp, /run and /var, and the directories the caller
 * names (the tool's storage and work directory read-write, the build context read-only; paths the range may
 * reach, see ownership.ts). A RUN
 * instruction that escapes the tool's own isolation (the double chroot through buildah's chroot isolation)
 * lands in that root: it sees no host file outside those, can write only the tool's storage and the build's
 * work directory, and is on the host an unprivileged id no account has.
 *
 * Networks: none (an empty namespace), the step network of the configured package indexes (network.ts), or the
 * host's (for pulling images named by the build, which runs no code of the image; as the unprivileged id, so
 * it reaches what any local user reaches and no sandbox address, which the host keeps from non-root senders).
 */
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../../common/errors.js";
import type { RunResult } from "../run.js";
import { buildIdRange, ensureBuildIdentity } from "./identity.js";
import { describeIndexes, hostPackageIndexes, indexEndpoints } from "./indexes.js";
import { openStepNetwork } from "./network.js";
import { runInUserNamespace } from "./userns.js";

/** /etc entries a tool may read (those that exist on the host), never the rest of /etc. */
const HOST_ETC = [
  "containers",
  "ssl",
  "ca-certificates",
  "ca-certificates.conf",
  "passwd",
  "group",
  "nsswitch.conf",
  "localtime",
  "pki",
];
const ROOT_LINKS = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

export interface HostToolRun {
  argv: string[];
  /** Host directories bound at `dest`: read-write ones must be the range's, all reachable by it. */
  dirs: { host: string; dest: string; writable: boolean }[];
  /** Host files bound read-only at `dest` (reachable by the range). */
  files?: { host: string; dest: string }[];
  /** A directory of the build's the range may pass through, for the files made for the tool. */
  scratchDir: string;
  network: "none" | "indexes" | "host";
  env: Record<string, string>;
  cwd: string;
  label: string;
  signal?: AbortSignal;
  stdout?: "lines" | "ignore" | "collect";
  onOutputLine?: (line: string) => void;
  tailBytes?: number;
}

async function hostView(): Promise<string[]> {
  const args = ["--ro-bind", "/usr", "/usr"];
  for (const name of ROOT_LINKS) {
    const file = `/${name}`;
    const st = await fs.lstat(file).catch(() => undefined);
    if (st?.isSymbolicLink()) args.push("--symlink", await fs.readlink(file), file);
    else if (st?.isDirectory()) args.push("--ro-bind", file, file);
  }
  for (const name of HOST_ETC) {
    const file = `/etc/${name}`;
    if (await fs.stat(file).catch(() => undefined)) args.push("--ro-bind", file, file);
  }
  return args;
}

/** Runs the tool (see the module comment); rejects with the tail of its output when it fails. */
export async function runHostTool(options: HostToolRun): Promise<RunResult> {
  const range = buildIdRange();
  await ensureBuildIdentity(range);
  let network: Awaited<ReturnType<typeof openStepNetwork>> | undefined;
  if (options.network === "indexes") {
    const indexes = await hostPackageIndexes();
    if (indexEndpoints(indexes).length === 0) {
      throw new ForkdError(
        "unavailable",
        `${options.label}: a networked build reaches only this machine's configured package indexes, and it has ${describeIndexes(indexes)}`,
      );
    }
    network = await openStepNetwork(indexes);
  }
  const scratch = await fs.mkdtemp(path.join(options.scratchDir, "tool-io-"));
  try {
    await fs.chmod(scratch, 0o755);
    const args = [
      "--die-with-parent",
      "--new-session",
      "--unshare-pid",
      "--unshare-ipc",
      "--unshare-uts",
      "--unshare-cgroup-try",
      ...(options.network === "none" ? ["--unshare-net"] : []),
      "--cap-add",
      "ALL",
      ...(await hostView()),
      "--proc",
      "/proc",
      "--dev",
      "/dev",
      "--tmpfs",
      "/tmp",
      "--tmpfs",
      "/run",
      "--tmpfs",
      "/var",
      "--dir",
      "/var/tmp",
      // buildah's chroot isolation binds /sys into a RUN's root: an empty one here.
      "--dir",
      "/sys",
    ];
    for (const dir of options.dirs) args.push(dir.writable ? "--bind" : "--ro-bind", dir.host, dir.dest);
    for (const file of options.files ?? []) args.push("--ro-bind", file.host, file.dest);
    const etc: [string, string][] =
      options.network === "host"
        ? [
            ["/etc/resolv.conf", await fs.readFile("/etc/resolv.conf", "utf8").catch(() => "")],
            ["/etc/hosts", await fs.readFile("/etc/hosts", "utf8").catch(() => "")],
          ]
        : options.network === "indexes" && network
          ? [
              ["/etc/hosts", network.hosts],
              ["/etc/resolv.conf", "options timeout:1 attempts:1\n"],
            ]
          : [];
    for (const [dest, text] of etc) {
      const file = path.join(scratch, path.basename(dest));
      await fs.writeFile(file, text, { mode: 0o644 });
      args.push("--ro-bind", file, dest);
    }
    args.push("--clearenv");
    for (const [key, value] of Object.entries(options.env)) args.push("--setenv", key, value);
    args.push("--chdir", options.cwd, "--", ...options.argv);
    return await runInUserNamespace(args, {
      range,
      netns: network?.netnsPath,
      label: options.label,
      signal: options.signal,
      stdout: options.stdout ?? "lines",
      onStderrLine: options.onOutputLine,
      tailBytes: options.tailBytes,
    });
  } finally {
    await network?.close();
    await fs.rm(scratch, { recursive: true, force: true });
  }
}
