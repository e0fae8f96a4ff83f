/**
 * Runs a build step's program inside the image's own root with bubblewrap, as a container runtime would:
 *
 *   - the tree is the root of a private mount namespace (pivot_root, the host's root is unmounted), mounted
 *     nosuid and nodev, with a fresh /proc, a minimal /dev, and empty tmpfs on /tmp and /run;
 *   - own PID, IPC, UTS and cgroup namespaces; no network (an empty network namespace with loopback) unless
 *     the step asks for it (then the host's network and, over the image's own, the host's resolv.conf);
 *   - no_new_privs, and only a container's usual capabilities (chown, dac_override, fowner, fsetid, kill,
 *     setgid, setuid, setpcap, net_bind_service, sys_chroot, setfcap, audit_write): no mknod, no mounts, no
 *     raw devices, no module loading; setuid bits and file capabilities in the image give nothing;
 *   - the environment is exactly the image's (plus what the step sets), the working directory the image's;
 *   - a non-root user runs through forkd-runas (static; bind-mounted read-only under /run, so it never lands
 *     in the image), which sets the groups, gid and uid before it becomes the step's program.
 *
 * The whole process group is killed when the step is cancelled or times out (run.ts), and bwrap dies with us.
 */
import fs from "node:fs/promises";
import path from "node:path";
import { abortError } from "../common/deadline.js";
import { ForkdError } from "../common/errors.js";
import { isValidTag } from "../common/names.js";
import { defaultToolsDir } from "./package-root.js";
import { resolveInRoot } from "./rootfs.js";
import { run } from "./run.js";

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

export interface Credentials {
  uid: number;
  gid: number;
  groups: number[];
  home: string | undefined;
}

export interface SandboxRun {
  root: string;
  argv: string[];
  /** KEY=VALUE. */
  env: string[];
  cwd: string;
  /** Who the program runs as (null: root). */
  credentials: Credentials | null;
  network: boolean;
  /** Read-only host files or directories, each at `${SANDBOX_INPUTS}/<name>`. */
  inputs?: { host: string; name: string }[];
  /** With network: the host's /etc/resolv.conf over the image's (set by runInImage when the image has one). */
  hostResolver?: boolean;
  timeoutS: number;
  label: string;
  signal?: AbortSignal;
  onOutputLine?: (line: string) => void;
  /** Bytes of output kept for the error message of a failed step. */
  tailBytes?: number;
}

export function bwrapArgs(options: SandboxRun, runasBinary: string): string[] {
  const args = [
    "--die-with-parent",
    "--new-session",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
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
    "--tmpfs",
    "/tmp",
    "--tmpfs",
    "/run",
  ];
  for (const input of options.inputs ?? []) {
    // Input names follow the tag rule: one safe path component.
    if (!isValidTag(input.name)) throw new Error(`bad input name ${input.name}`);
    args.push("--ro-bind", input.host, `${SANDBOX_INPUTS}/${input.name}`);
  }
  if (options.credentials) args.push("--ro-bind", runasBinary, RUNAS);
  if (options.network && options.hostResolver) args.push("--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf");
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
  // A step with network resolves names as the host does; only over a regular file (never through a link).
  const resolver = await fs
    .lstat(await resolveInRoot(options.root, "/etc/resolv.conf"))
    .catch(() => undefined);
  const hostResolver = options.network && resolver?.isFile() === true;
  const timeout = AbortSignal.timeout(options.timeoutS * 1000);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  try {
    await run("bwrap", bwrapArgs({ ...options, hostResolver }, runas), {
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
      throw new ForkdError("unprocessable", err.message, { cause: err });
    }
    throw err;
  }
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

async function readGuestLines(root: string, file: string): Promise<string[][]> {
  const text = await fs.readFile(await resolveInRoot(root, file, true), "utf8").catch(() => "");
  return text
    .split("\n")
    .filter((l) => l !== "" && !l.startsWith("#"))
    .map((l) => l.split(":"));
}

/**
 * The credentials `user` ("name", "uid", "name:group", "uid:gid") stands for in the image at `root`, read from
 * its own /etc/passwd and /etc/group (never the host's). Root (uid 0) is null: no forkd-runas needed.
 */
export async function resolveCredentials(root: string, user: string): Promise<Credentials | null> {
  const [userPart = "", groupPart] = user.split(":");
  const passwd: PasswdEntry[] = (await readGuestLines(root, "/etc/passwd")).map((f) => ({
    name: f[0] ?? "",
    uid: Number(f[2]),
    gid: Number(f[3]),
    home: f[5] ?? "/",
  }));
  const groups = await readGuestLines(root, "/etc/group");
  const numeric = /^[0-9]+$/.test(userPart);
  const entry = numeric
    ? passwd.find((p) => p.uid === Number(userPart))
    : passwd.find((p) => p.name === userPart);
  if (!entry && !numeric) {
    throw new ForkdError(
      "invalid_argument",
      `user ${JSON.stringify(userPart)} is not in the image's /etc/passwd`,
    );
  }
  const uid = entry?.uid ?? Number(userPart);
  let gid = entry?.gid ?? uid;
  if (groupPart !== undefined) {
    if (/^[0-9]+$/.test(groupPart)) gid = Number(groupPart);
    else {
      const g = groups.find((f) => f[0] === groupPart);
      if (!g)
        throw new ForkdError(
          "invalid_argument",
          `group ${JSON.stringify(groupPart)} is not in the image's /etc/group`,
        );
      gid = Number(g[2]);
    }
  }
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) {
    throw new ForkdError(
      "invalid_argument",
      `user ${JSON.stringify(user)}: the image's passwd entry is malformed`,
    );
  }
  if (uid === 0 && gid === 0) return null;
  const supplementary =
    entry === undefined || groupPart !== undefined
      ? []
      : groups
          .filter((f) => (f[3] ?? "").split(",").includes(entry.name))
          .map((f) => Number(f[2]))
          .filter((g) => Number.isInteger(g) && g !== gid);
  return { uid, gid, groups: [...new Set(supplementary)], home: entry?.home };
}
