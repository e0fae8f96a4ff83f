/**
 * The daemon's side of forkd-launcher (src/isolation/launcher/, Go): the argv prefix that makes a program start
 * inside a sandbox's network namespace with its tap open at a known fd, in its cgroups, and confined (its own
 * uid, no capabilities, a mount namespace showing only what it needs). The launcher execs the program, so the
 * program keeps the launcher's pid. Everything is validated here too, so a bad plan fails with a clear
 * `invalid_argument` before anything is spawned.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { invalidArgument } from "../common/errors.js";
import { packageRoot } from "../common/package-root.js";

export interface LaunchPlan {
  /** Join the named network namespace (`/run/netns/<name>`), or give the program a fresh empty one. */
  netns?: { join: string } | "new";
  /** net.* sysctls written inside that namespace before the program starts. */
  sysctls?: Readonly<Record<string, string | number>>;
  /** Attach to (or create) tap `name` in the namespace and leave it open at `fd` for the program. */
  tap?: { name: string; fd: number; vnetHdr: boolean };
  /** Inherited fds (besides 0-2) the program keeps; the launcher closes every other one at exec. */
  keepFds?: readonly number[];
  /** A unix socket the launcher binds and listens on, handed to the program at `fd` (QEMU's monitor). */
  listen?: { path: string; fd: number };
  /** Cgroup directories the launcher joins before exec (the limits hold from the program's first instruction). */
  cgroups?: readonly string[];
  /** RLIMIT_FSIZE in bytes: no file the program writes grows past it (writes fail with EFBIG). */
  fileSizeLimitBytes?: number;
  /** SIGKILL the program when this process exits (PR_SET_PDEATHSIG): for VMs that must not outlive it. */
  dieWithParent?: boolean;
  /** Run the program unprivileged in a mount namespace of its own (see Confinement). */
  confine?: Confinement;
}

/**
 * The program runs as uid = gid = `uidBase` + its pid, with no capabilities and no_new_privs, and sees only its
 * run directory (root's, mode 0710 with the program's gid: it opens what it was given there and creates
 * nothing), the `own` files (handed over to it: read-write), the `readOnly` paths (symlinks followed and kept),
 * /usr, a few /dev nodes and a /proc of its own processes.
 */
export interface Confinement {
  uidBase: number;
  runDir: string;
  own?: readonly string[];
  readOnly?: readonly string[];
  /** Read-only and executable: libraries the program preloads. */
  libraries?: readonly string[];
  /** Extra /dev nodes (the program gets each node's group). */
  devices?: readonly "kvm"[];
}

/** The launcher's bounds for `uidBase` (uid = base + pid must stay below 2^31-1). */
export const MIN_UID_BASE = 65_536;
export const MAX_UID = 2 ** 31 - 2;

/** $FORKD_LAUNCHER, or the binary `npm run build` puts into dist/. */
export function launcherBinary(env: NodeJS.ProcessEnv = process.env): string {
  return env.FORKD_LAUNCHER ?? path.join(packageRoot(), "dist", "forkd-launcher");
}

/**
 * The library a confined QEMU preloads so that it opens its (shared, read-only) RAM image read-only
 * (src/isolation/ro-ram/ro-ram.c), and the environment that tells it which files those are.
 */
export function readOnlyRamPreload(files: readonly string[]): {
  library: string;
  env: Record<string, string>;
} {
  for (const file of files) {
    if (file.includes(":") || !path.isAbsolute(file)) {
      throw invalidArgument(
        `read-only RAM file ${JSON.stringify(file)} must be an absolute path without ':'`,
      );
    }
  }
  const library = path.join(packageRoot(), "dist", "forkd-ro-ram.so");
  return { library, env: { LD_PRELOAD: library, FORKD_RO_RAM: files.join(":") } };
}

const NETNS_PATH = /^\/run\/netns\/[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const IFNAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,14}$/;
const SYSCTL_KEY = /^net\.(ipv4|ipv6|core|netfilter)\.[A-Za-z0-9_.-]{1,100}$/;
const CGROUP_DIR = /^\/sys\/fs\/cgroup\/[A-Za-z0-9._/:-]+$/;
const MAX_PATH = 4000;

/** The launcher and its flags up to and including "--": the program and its arguments follow. */
export function launcherPrefix(plan: LaunchPlan, binary = launcherBinary()): string[] {
  const args = [binary];
  if (plan.netns === "new") args.push("--new-netns");
  else if (plan.netns) {
    if (!NETNS_PATH.test(plan.netns.join)) {
      throw invalidArgument(`launcher: netns ${JSON.stringify(plan.netns.join)} is not /run/netns/<name>`);
    }
    args.push("--netns", plan.netns.join);
  }
  for (const [key, value] of Object.entries(plan.sysctls ?? {})) {
    if (!SYSCTL_KEY.test(key) || key.includes("..") || !/^\d{1,10}$/.test(String(value))) {
      throw invalidArgument(`launcher: sysctl ${key}=${value} is not a net.* key with an integer value`);
    }
    args.push("--sysctl", `${key}=${value}`);
  }
  if (plan.tap) {
    if (!IFNAME.test(plan.tap.name)) throw invalidArgument(`launcher: bad tap name ${plan.tap.name}`);
    if (!Number.isInteger(plan.tap.fd) || plan.tap.fd < 3 || plan.tap.fd > 1023) {
      throw invalidArgument(`launcher: tap fd ${plan.tap.fd} must be an integer in 3..1023`);
    }
    if (!plan.netns) throw invalidArgument("launcher: a tap needs a network namespace");
    args.push("--tap", plan.tap.name, "--tap-fd", String(plan.tap.fd));
    if (plan.tap.vnetHdr) args.push("--tap-vnet-hdr");
  }
  for (const fd of plan.keepFds ?? []) {
    if (!Number.isInteger(fd) || fd < 3 || fd > 1023 || fd === plan.tap?.fd) {
      throw invalidArgument(`launcher: keep fd ${fd} must be an integer in 3..1023 other than the tap's`);
    }
    args.push("--keep-fd", String(fd));
  }
  if (plan.listen) {
    const { fd } = plan.listen;
    if (!Number.isInteger(fd) || fd < 3 || fd > 1023 || fd === plan.tap?.fd || plan.keepFds?.includes(fd)) {
      throw invalidArgument(`launcher: listen fd ${fd} must be a free integer in 3..1023`);
    }
    if (Buffer.byteLength(plan.listen.path) > 107) {
      throw invalidArgument(`launcher: socket path ${plan.listen.path} is too long for a unix socket`);
    }
    args.push("--listen-socket", confinedPath(plan.listen.path), "--listen-fd", String(fd));
  }
  for (const dir of plan.cgroups ?? []) {
    if (!CGROUP_DIR.test(dir) || !isCleanAbsolute(dir)) {
      throw invalidArgument(
        `launcher: cgroup ${JSON.stringify(dir)} is not a clean path under /sys/fs/cgroup`,
      );
    }
    args.push("--cgroup", dir);
  }
  if (plan.fileSizeLimitBytes !== undefined) {
    const bytes = plan.fileSizeLimitBytes;
    if (!Number.isSafeInteger(bytes) || bytes < 2 ** 20 || bytes > 2 ** 50) {
      throw invalidArgument(`launcher: file size limit ${bytes} must be a byte count in 1 MiB..1 PiB`);
    }
    args.push("--fsize-limit", String(bytes));
  }
  if (plan.dieWithParent) args.push("--die-with-parent", String(process.pid));
  if (plan.confine) args.push(...confineArgs(plan.confine));
  args.push("--");
  return args;
}

function confineArgs(confine: Confinement): string[] {
  const { uidBase } = confine;
  if (!Number.isInteger(uidBase) || uidBase < MIN_UID_BASE || uidBase > MAX_UID) {
    throw invalidArgument(`launcher: uid base ${uidBase} must be an integer in ${MIN_UID_BASE}..${MAX_UID}`);
  }
  const args = ["--uid-base", String(uidBase), "--run-dir", confinedPath(confine.runDir)];
  for (const file of confine.own ?? []) args.push("--own", confinedPath(file));
  for (const file of confine.readOnly ?? []) args.push("--ro", confinedPath(file));
  for (const file of confine.libraries ?? []) args.push("--ro-exec", confinedPath(file));
  for (const device of confine.devices ?? []) {
    if (device !== "kvm") throw invalidArgument(`launcher: device ${JSON.stringify(device)} is not allowed`);
    args.push("--dev", device);
  }
  return args;
}

/** What the launcher accepts for its paths: clean, absolute, not / and not under what it provides itself. */
function confinedPath(file: string): string {
  if (!isCleanAbsolute(file) || file === "/" || file.length > MAX_PATH || file.includes("\0")) {
    throw invalidArgument(`launcher: ${JSON.stringify(file)} is not a clean absolute path`);
  }
  // /dev/shm is a tmpfs (a live_fork RAM image lives there), not device nodes.
  if (/^\/(proc|dev|sys)(\/|$)/.test(file) && !file.startsWith("/dev/shm/")) {
    throw invalidArgument(`launcher: ${file} is provided by the launcher itself`);
  }
  return file;
}

function isCleanAbsolute(file: string): boolean {
  return (
    path.isAbsolute(file) &&
    path.normalize(file) === file &&
    !file.endsWith("/") &&
    !file.split("/").some((segment) => segment === "." || segment === "..")
  );
}

let privateNetnsProbe: Promise<string | null> | undefined;

/**
 * Whether the launcher can give a program a fresh network namespace with a tap (root, a kernel with network
 * namespaces, /dev/net/tun, the launcher built): null if it can, else why not. Tried once per process.
 */
export function privateNetnsUnavailable(): Promise<string | null> {
  privateNetnsProbe ??= new Promise((resolve) => {
    const [binary, ...args] = launcherPrefix({ netns: "new", tap: { name: "tap0", fd: 4, vnetHdr: true } });
    execFile(binary as string, [...args, "true"], { timeout: 30_000 }, (err, _stdout, stderr) => {
      if (!err) resolve(null);
      else if ((err as NodeJS.ErrnoException).code === "ENOENT")
        resolve(`${binary} is missing (npm run build)`);
      else resolve(String(stderr).trim() || err.message);
    });
  });
  return privateNetnsProbe;
}
