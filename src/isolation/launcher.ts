/**
 * The daemon's side of forkd-launcher (src/isolation/launcher/, Go): the argv prefix that makes a program start
 * inside a sandbox's network namespace with its tap open at a known fd. The launcher execs the program, so the
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
}

/** $FORKD_LAUNCHER, or the binary `npm run build` puts into dist/. */
export function launcherBinary(env: NodeJS.ProcessEnv = process.env): string {
  return env.FORKD_LAUNCHER ?? path.join(packageRoot(), "dist", "forkd-launcher");
}

const NETNS_PATH = /^\/run\/netns\/[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const IFNAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,14}$/;
const SYSCTL_KEY = /^net\.(ipv4|ipv6|core|netfilter)\.[A-Za-z0-9_.-]{1,100}$/;

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
  args.push("--");
  return args;
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
