/**
 * Runs a build step's program inside the image's own root with bubblewrap, as a container runtime would, and
 * without host root:
 *
 *   - in a user namespace whose root is the build range's first id (identity.ts, userns.ts): the step is root
 *     only over the image's tree (owned by the shifted ids on disk) and holds capabilities only in its own
 *     namespaces; on the host it is an unprivileged id no account has;
 *   - the tree (inside the build's staging directory, which only root and the range may enter) is the root of
 *     a private mount namespace (pivot_root, the host's root is unmounted, so a double chroot ends at the
 *     tree's root), mounted nosuid and nodev, with a fresh /proc, a minimal /dev, and empty tmpfs on /tmp and
 *     /run;
 *   - own PID, IPC, UTS and cgroup namespaces; no network (an empty network namespace with loopback) unless the
 *     step asks for it, and then a namespace of its own that reaches the machine's configured package indexes
 *     and nothing else (network.ts), names resolved through an /etc/hosts of its own;
 *   - no_new_privs, and only a container's usual capabilities (chown, dac_override, fowner, fsetid, kill,
 *     setgid, setuid, setpcap, net_bind_service, sys_chroot, setfcap, audit_write), all of them in its own user
 *     namespace: no mknod, no mounts, no raw devices, no module loading; setuid bits and file capabilities in
 *     the image give nothing;
 *   - the environment is exactly the image's (plus what the step sets), the working directory the image's;
 *   - a non-root user runs through forkd-runas (static; bind-mounted read-only under /run, so it never lands
 *     in the image), which sets the groups, gid and uid before it becomes the step's program;
 *   - the step's host-side inputs (wheels, requirements, forkd-runas) are copied for it into a directory of the
 *     range's in the staging directory and bound read-only from there, so the range never needs a host path of
 *     the template's.
 *
 * The whole process group is killed when the step is cancelled or times out (run.ts), and bwrap dies with us.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { abortError } from "../../common/deadline.js";
import { ForkdError } from "../../common/errors.js";
import { isValidTag } from "../../common/names.js";
import { defaultToolsDir } from "../package-root.js";
import { resolveInRoot } from "../rootfs.js";
import type { Credentials } from "./credentials.js";
import { type BuildIdRange, buildIdRange, ensureBuildIdentity, hostId } from "./identity.js";
import { describeIndexes, hostPackageIndexes, indexEndpoints, type PackageIndex } from "./indexes.js";
import { openStepNetwork, type StepNetwork } from "./network.js";
import { giveAllToBuildRange, giveToBuildRange } from "./ownership.js";
import { runInUserNamespace } from "./userns.js";

const CAPABILITIES = [
  "CAP_CHOWN",
  "CAP_DAC_OVERRIDE",
  "CAP_FOWNER",
  "CAP_FSETID",
  "CAP_KILL",
  "CAP_SETGID",
  "CAP_SETUID",
  "CAP_SETPCAP",
  "CAP_NET_BIND_SERVICE",
  "CAP_SYS_CHROOT",
  "CAP_SETFCAP",
  "CAP_AUDIT_WRITE",
];

/** Where read-only inputs of a step (wheels, a requirements file, forkd-runas) appear inside the sandbox. */
export const SANDBOX_INPUTS = "/run/forkd-build";
const RUNAS = `${SANDBOX_INPUTS}/forkd-runas`;
export const BUILD_HOSTNAME = "forkd-build";

export interface SandboxRun {
  /** The image's tree, owned by the build range's shifted ids (umoci unpacked it with the mapping). */
  root: string;
  /** A directory of the build's (root's, which the range may pass through) for the step's copied inputs. */
  scratchDir: string;
  argv: string[];
  /** KEY=VALUE. */
  env: string[];
  cwd: string;
  /** Who the program runs as (null: root). */
  credentials: Credentials | null;
  /** Reach the machine's configured package indexes (and nothing else). */
  network: boolean;
  /** Read-only host files or directories, each at `${SANDBOX_INPUTS}/<name>`. */
  inputs?: { host: string; name: string }[];
  timeoutS: number;
  label: string;
  signal?: AbortSignal;
  onOutputLine?: (line: string) => void;
  /** Bytes of output kept for the error message of a failed step. */
  tailBytes?: number;
}

/** Read-only binds of what the step is given: a copy in its scratch directory, and where the step sees it. */
export type StepBinds = { host: string; dest: string }[];

export function bwrapArgs(options: SandboxRun, binds: StepBinds): string[] {
  const args = [
    "--die-with-parent",
    "--new-session",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    // A networked step's namespace is entered before bwrap starts (userns.ts); any other has none.
    ...(options.network ? [] : ["--unshare-net"]),
    "--hostname",
    BUILD_HOSTNAME,
    "--bind",
    options.root,
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    // Sticky and world-writable as a real /tmp (bwrap's default is 0755): apt's download and gpgv methods run
    // as _apt and write their temporaries there.
    "--perms",
    "1777",
    "--tmpfs",
    "/tmp",
    "--tmpfs",
    "/run",
    // Searchable by every user of the image (bwrap would make it 0700, root's): a step's program may drop to
    // another user that reads its inputs, as apt's gpgv does as _apt with the sources' keyrings (NO_PUBKEY
    // otherwise) and a `user` step's pip with its requirements. The inputs are copies, bound read-only.
    "--perms",
    "0755",
    "--dir",
    SANDBOX_INPUTS,
  ];
  for (const bind of binds) args.push("--ro-bind", bind.host, bind.dest);
  args.push("--cap-drop", "ALL");
  for (const cap of CAPABILITIES) args.push("--cap-add", cap);
  args.push("--clearenv");
  for (const entry of options.env) {
    const at = entry.indexOf("=");
    if (at <= 0) continue;
    args.push("--setenv", entry.slice(0, at), entry.slice(at + 1));
  }
  args.push("--chdir", options.cwd, "--");
  if (options.credentials) {
    const { uid, gid, groups } = options.credentials;
    args.push(RUNAS, String(uid), String(gid), groups.join(","), "--");
  }
  args.push(...options.argv);
  return args;
}

/** Whether `file` in the tree is a regular file (never a link: nothing is bound through one). */
async function regularFileIn(root: string, file: string): Promise<boolean> {
  const target = await resolveInRoot(root, file).catch(() => undefined);
  return target !== undefined && (await fs.lstat(target).catch(() => undefined))?.isFile() === true;
}

/**
 * Makes an empty `file` (owned by the image's root, shifted) where the tree has nothing at that path, so a
 * bind has a mount point; false when something else is there or its directory is missing.
 */
async function placeholderIn(root: string, file: string, range: BuildIdRange): Promise<boolean> {
  const target = await resolveInRoot(root, file).catch(() => undefined);
  if (target === undefined || (await fs.lstat(target).catch(() => undefined)) !== undefined) return false;
  if (!(await fs.stat(path.dirname(target)).catch(() => undefined))?.isDirectory()) return false;
  await fs.writeFile(target, "", { flag: "wx", mode: 0o644 });
  await fs.lchown(target, hostId(range, 0), hostId(range, 0));
  return true;
}

async function removePlaceholder(root: string, file: string): Promise<void> {
  const target = await resolveInRoot(root, file).catch(() => undefined);
  const left = target === undefined ? undefined : await fs.lstat(target).catch(() => undefined);
  // Only the empty file it made; a step that replaced it with something of its own keeps that.
  if (target !== undefined && left?.isFile() && left.size === 0) await fs.rm(target, { force: true });
}

/** The package indexes a networked step reaches, refused when there are none to reach. */
async function stepIndexes(label: string): Promise<PackageIndex[]> {
  const indexes = await hostPackageIndexes();
  if (indexEndpoints(indexes).length === 0) {
    throw new ForkdError(
      "unavailable",
      `${label}: a networked step reaches only this machine's configured package indexes, and it has ${describeIndexes(indexes)}`,
    );
  }
  return indexes;
}

/** Runs the step; rejects with the tail of its output when it fails, times out or cannot start. */
export async function runInImage(options: SandboxRun): Promise<void> {
  const runas = path.join(defaultToolsDir(), "forkd-runas");
  if (options.credentials && !(await fs.stat(runas).catch(() => undefined))?.isFile()) {
    throw new ForkdError("unavailable", `${runas} is missing (run \`npm run build\`)`);
  }
  const cwd = await fs.lstat(await resolveInRoot(options.root, options.cwd, true)).catch(() => undefined);
  if (!cwd?.isDirectory()) {
    throw new ForkdError(
      "invalid_argument",
      `${options.label}: working directory ${options.cwd} does not exist in the image`,
    );
  }
  for (const input of options.inputs ?? []) {
    // Input names follow the tag rule: one safe path component.
    if (!isValidTag(input.name)) throw new Error(`bad input name ${input.name}`);
  }
  const range = buildIdRange();
  await ensureBuildIdentity(range);
  const network = options.network ? await openStepNetwork(await stepIndexes(options.label)) : undefined;
  const io = await fs.mkdtemp(path.join(options.scratchDir, "step-io-"));
  const placeholders: string[] = [];
  try {
    await giveToBuildRange(io, range);
    const binds: StepBinds = [];
    const give = async (host: string, name: string, dest: string) => {
      const copy = path.join(io, name);
      await fs.cp(host, copy, { recursive: true, verbatimSymlinks: true, errorOnExist: true });
      await giveAllToBuildRange(copy, range);
      binds.push({ host: copy, dest });
    };
    for (const input of options.inputs ?? []) {
      await give(input.host, input.name, `${SANDBOX_INPUTS}/${input.name}`);
    }
    if (options.credentials) await give(runas, ".forkd-runas", RUNAS);
    if (network) {
      // The indexes' names, and a resolver with no server to ask (one that tries fails at once).
      const files: [string, string][] = [
        ["/etc/hosts", network.hosts],
        ["/etc/resolv.conf", "options timeout:1 attempts:1\n"],
      ];
      for (const [guest, text] of files) {
        if (!(await regularFileIn(options.root, guest))) {
          // An image without the file (OCI images often ship none: their runtime binds it): a mount point for
          // the step only, removed before the tree is repacked. A symlink or anything else stays untouched.
          if (!(await placeholderIn(options.root, guest, range))) continue;
          placeholders.push(guest);
        }
        const file = path.join(io, `.${path.basename(guest)}`);
        await fs.writeFile(file, text, { mode: 0o644 });
        binds.push({ host: file, dest: guest });
      }
    }
    await runStep(options, range, binds, network);
  } finally {
    for (const guest of placeholders) await removePlaceholder(options.root, guest);
    await network?.close();
    await fs.rm(io, { recursive: true, force: true });
  }
}

async function runStep(
  options: SandboxRun,
  range: BuildIdRange,
  binds: StepBinds,
  network: StepNetwork | undefined,
): Promise<void> {
  const timeout = AbortSignal.timeout(options.timeoutS * 1000);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  try {
    await runInUserNamespace(bwrapArgs(options, binds), {
      range,
      netns: network?.netnsPath,
      label: options.label,
      signal,
      stdout: "lines",
      onStderrLine: options.onOutputLine,
      tailBytes: options.tailBytes ?? 4096,
    });
  } catch (err) {
    if (timeout.aborted && !options.signal?.aborted) {
      throw new ForkdError(
        "timeout",
        `${options.label}: did not finish within ${options.timeoutS} s (timeout_s)`,
      );
    }
    if (options.signal?.aborted) throw abortError(options.signal, options.label);
    // The template's own command failed (its exit status and output tail are in the message): the template
    // cannot be built as written, which is the caller's to fix, not forkd's fault.
    if (err instanceof ForkdError && err.code === "internal") {
      const reach = network
        ? `\n(the step could reach only: ${network.reachable.join(", ") || "nothing"})`
        : "";
      throw new ForkdError("unprocessable", `${err.message}${reach}`, { cause: err });
    }
    throw err;
  }
}
