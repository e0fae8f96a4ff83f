/**
 * The guest root filesystem: a Debian minbase tree from mmdebstrap, the forkd guest payload and the
 * template's extra files on top, written into an ext4 image with `mkfs.ext4 -d` (no loop device, no mount).
 */
import { randomUUID } from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { run, runText } from "./run.js";
import type { Template } from "./template.js";

/**
 * Packages every image has on top of minbase: none. The agent is one static binary (/opt/forkd/forkd-agent)
 * that /init hands over to as PID 1; it needs nothing from the image's userland.
 */
export const BASE_PACKAGES: readonly string[] = [];
export const PYTHON_PACKAGES = ["python3"];

/** Content no guest needs; dpkg never unpacks it, which also makes the build faster. */
const DPKG_EXCLUDES = [
  "/usr/share/doc/*",
  "/usr/share/man/*",
  "/usr/share/info/*",
  "/usr/share/locale/*",
  "/usr/share/lintian/*",
];

/** Left behind by package installation; removed before the tree becomes an image. */
const TRIM_PATHS = [
  "var/cache/apt",
  "var/lib/apt/lists",
  "var/log",
  "var/cache/debconf",
  "usr/share/doc",
  "usr/share/man",
  "usr/share/info",
];

export const GUEST_HOSTNAME = "forkd";

/** mmdebstrap's "I: ..." status lines mapped to rough build fractions, so the CLI can show movement. */
const MMDEBSTRAP_STAGES: [RegExp, number][] = [
  [/running apt-get update/, 0.05],
  [/downloading packages/, 0.2],
  [/extracting archives/, 0.35],
  [/installing essential packages/, 0.5],
  [/installing remaining packages/, 0.7],
  [/cleaning package lists/, 0.95],
];

/** The Debian packages of the image (none when it is not made from Debian: an image brings its own). */
export function rootfsPackages(
  template: Pick<Template, "packages" | "interpreter"> & { base?: Template["base"] },
): string[] {
  if (template.base !== undefined && template.base.kind !== "debian") return [];
  const extra = template.interpreter === "python" ? PYTHON_PACKAGES : [];
  return [...new Set([...BASE_PACKAGES, ...extra, ...template.packages])];
}

/**
 * The host's own apt sources, passed to mmdebstrap as files (it pastes them into the chroot's sources), so
 * guests come from the same archive, mirror or proxy the host uses. No mirror is ever named by forkd.
 */
export async function hostAptSources(): Promise<string[]> {
  const out = await enabledAptSources();
  if (out.length === 0) {
    throw new ForkdError(
      "unavailable",
      "the host has no apt sources (/etc/apt/sources.list[.d]) to build images from",
    );
  }
  return out;
}

/** The host's enabled apt sources files (sources.list, sources.list.d/*.list and *.sources); maybe none. */
export async function enabledAptSources(): Promise<string[]> {
  const out: string[] = [];
  const main = "/etc/apt/sources.list";
  const mainText = await fs.readFile(main, "utf8").catch(() => "");
  if (mainText.split("\n").some((l) => /^\s*deb\s/.test(l))) out.push(main);
  const dir = "/etc/apt/sources.list.d";
  const names = await fs.readdir(dir).catch(() => [] as string[]);
  for (const name of names.sort()) {
    if (!/\.(list|sources)$/.test(name)) continue;
    const file = path.join(dir, name);
    const text = await fs.readFile(file, "utf8").catch(() => "");
    const enabled = !/^\s*Enabled:\s*no\s*$/im.test(text);
    if (enabled && /^\s*(deb\s|Types:.*\bdeb\b)/m.test(text)) out.push(file);
  }
  return out;
}

export interface DebootstrapOptions {
  suite: string;
  packages: string[];
  target: string;
  /** Scratch space for mmdebstrap (inside the build's staging directory). */
  tmpDir: string;
  signal?: AbortSignal;
  onStatus?: (message: string, fraction?: number) => void;
}

export async function debootstrap(options: DebootstrapOptions): Promise<void> {
  const sources = await hostAptSources();
  await fs.mkdir(options.tmpDir, { recursive: true });
  const args = [
    // A private mount namespace: whatever mmdebstrap mounts inside the tree (proc, sys, dev) disappears with
    // it, even if it is killed, so removing a cancelled build's tree can never reach the host's /dev.
    "--mount",
    "--propagation",
    "private",
    "--",
    "mmdebstrap",
    "--mode=root",
    "--variant=minbase",
    "--format=directory",
    ...(options.packages.length > 0 ? [`--include=${options.packages.join(",")}`] : []),
    // No fsync per unpacked file: a build that dies is thrown away anyway, and mkfs writes the real image.
    "--dpkgopt=force-unsafe-io",
    ...DPKG_EXCLUDES.map((p) => `--dpkgopt=path-exclude=${p}`),
    options.suite,
    options.target,
    ...sources,
  ];
  await run("unshare", args, {
    label: `mmdebstrap ${options.suite} (packages: ${options.packages.join(", ")})`,
    signal: options.signal,
    stdout: "ignore",
    env: { ...process.env, TMPDIR: options.tmpDir },
    onStderrLine: (line) => {
      const m = /^I: (.*)$/.exec(line);
      if (!m) return;
      const fraction = MMDEBSTRAP_STAGES.find(([re]) => re.test(m[1]!))?.[1];
      options.onStatus?.(m[1]!, fraction);
    },
  });
  await trimLoginProfiles(options.target);
}

/**
 * Bump when trimLoginProfiles (or anything else forkd changes in a tree mmdebstrap made) changes: it enters
 * format-1 recipes and the key of a format-2 Debian base, so images made the old way rebuild. Images made from
 * other bases (OCI, Dockerfiles) are never edited, so their recipes do not carry it.
 */
export const DEBIAN_TREE_VERSION = 1;

/** Debian's /etc/profile (base-files): the uid test that picks root's PATH runs `id -u`, a process. */
const PROFILE_UID_TEST = '\nif [ "$(id -u)" -eq 0 ]; then\n  PATH="/usr/local/sbin:';
const PROFILE_UID_TEST_FAST =
  "\n# forkd: bash knows its uid ($EUID) without a process; other shells ask id(1).\n" +
  // biome-ignore lint/suspicious/noTemplateCurlyInString: shell text for the guest, not a template.
  'if { [ "${BASH_VERSION-}" ] && [ "$EUID" -eq 0 ]; } || { [ -z "${BASH_VERSION-}" ] && [ "$(id -u)" -eq 0 ]; }; then\n  PATH="/usr/local/sbin:';
/** Root's ~/.profile (base-files): `mesg n` does nothing without a terminal on stdin but is a process. */
const ROOT_PROFILE_MESG = "\nmesg n 2> /dev/null || true\n";
const ROOT_PROFILE_MESG_FAST =
  "\n# forkd: mesg(1) only acts on a terminal on stdin; without one it is a process that fails.\n" +
  "if [ -t 0 ]; then\n  mesg n 2> /dev/null || true\nfi\n";

/**
 * A login shell (`bash -l -c cmd`, how E2B's SDKs run every command) in forkd's Debian images without the two
 * processes Debian's profiles start for nothing in a sandbox: `id -u` (under bash; other shells still run it)
 * and `mesg n` without a terminal. Under TCG each costs a process creation. The same PATH for root and for
 * other users, and mesg on a terminal, as before. A file that is not Debian's text as known is left as it is.
 */
export async function trimLoginProfiles(root: string): Promise<void> {
  const edit = async (guestPath: string, rewrite: (text: string) => string) => {
    const file = await resolveInRoot(root, guestPath);
    const st = await fs.lstat(file).catch(() => undefined);
    if (!st?.isFile()) return;
    const text = await fs.readFile(file, "utf8");
    const next = rewrite(text);
    if (next !== text) await writeGuestFile(root, guestPath, next, st.mode & 0o7777);
  };
  await edit("/etc/profile", (text) => text.replace(PROFILE_UID_TEST, () => PROFILE_UID_TEST_FAST));
  await edit("/root/.profile", (text) => text.replace(ROOT_PROFILE_MESG, () => ROOT_PROFILE_MESG_FAST));
}

/**
 * `guestPath` inside `root`, resolving symlinks as the guest would (absolute targets are relative to `root`,
 * ".." stops at `root`), so a link in the tree can never make us read or write outside it. The last component
 * is followed only with `followLast` (to replace a link rather than write through it).
 */
export async function resolveInRoot(root: string, guestPath: string, followLast = false): Promise<string> {
  const queue = guestPath.split("/").filter((p) => p !== "" && p !== ".");
  let current: string[] = [];
  let hops = 0;
  while (queue.length > 0) {
    const part = queue.shift()!;
    if (part === "..") {
      current.pop();
      continue;
    }
    const candidate = path.join(root, ...current, part);
    const isLast = queue.length === 0;
    const st = isLast && !followLast ? undefined : await fs.lstat(candidate).catch(() => undefined);
    if (st?.isSymbolicLink()) {
      if (++hops > 40) throw new ForkdError("invalid_argument", `too many symlinks resolving ${guestPath}`);
      const target = await fs.readlink(candidate);
      if (target.startsWith("/")) current = [];
      queue.unshift(...target.split("/").filter((p) => p !== "" && p !== "."));
      continue;
    }
    current.push(part);
  }
  return path.join(root, ...current);
}

/** Writes a regular file at `guestPath` in the tree, replacing whatever (even a symlink) was there. */
async function writeGuestFile(
  root: string,
  guestPath: string,
  data: string | Buffer,
  mode: number,
  newOwner: { uid: number; gid: number } = { uid: 0, gid: 0 },
): Promise<void> {
  const dest = await resolveInRoot(root, guestPath);
  if (dest === root) throw new ForkdError("invalid_argument", `bad guest path ${guestPath}`);
  await fs.mkdir(path.dirname(dest), { recursive: true, mode: 0o755 });
  const existing = await fs.lstat(dest).catch(() => undefined);
  if (existing?.isDirectory())
    throw new ForkdError("invalid_argument", `${guestPath} is a directory in the guest`);
  if (existing) await fs.rm(dest);
  await fs.writeFile(dest, data, { flag: "wx", mode });
  await fs.chmod(dest, mode);
  // A replaced file keeps its owner (/etc/shadow's group); a new one gets the tree's root.
  const owner = existing ?? newOwner;
  await fs.chown(dest, owner.uid, owner.gid);
}

export interface CustomizeOptions {
  root: string;
  template: Template;
  payloadDir: string;
  /**
   * The image's own environment and working directory (format 2): written to template.json, where the agent
   * takes them as every process's defaults.
   */
  settings?: { env: Record<string, string>; workdir: string };
}

/** Directories /init mounts over or moves into the new root: an image from elsewhere may lack them. */
const MOUNT_POINTS: [string, number][] = [
  ["/proc", 0o555],
  ["/sys", 0o555],
  ["/dev", 0o755],
  ["/run", 0o755],
  ["/tmp", 0o1777],
  ["/etc", 0o755],
];

/** Puts forkd's payload, the template's files and the guest identity into a root filesystem tree. */
export async function customizeTree({
  root,
  template,
  payloadDir,
  settings,
}: CustomizeOptions): Promise<void> {
  for (const [dir, mode] of MOUNT_POINTS) {
    const at = await resolveInRoot(root, dir, true);
    const st = await fs.lstat(at).catch(() => undefined);
    if (st?.isDirectory()) continue;
    if (st)
      throw new ForkdError("invalid_argument", `${template.source}: ${dir} in the image is not a directory`);
    await fs.mkdir(at, { recursive: true });
    await fs.chmod(at, mode);
  }
  const forkdDir = await resolveInRoot(root, "/opt/forkd", true);
  await fs.rm(forkdDir, { recursive: true, force: true });
  await fs.mkdir(forkdDir, { recursive: true, mode: 0o755 });
  await fs.cp(payloadDir, forkdDir, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
  await fs.chmod(forkdDir, 0o755);
  const templateJson = {
    name: template.name,
    interpreter: template.interpreter,
    ...(settings ? { env: settings.env, workdir: settings.workdir } : {}),
  };
  await fs.writeFile(path.join(forkdDir, "template.json"), `${JSON.stringify(templateJson, null, 2)}\n`, {
    mode: 0o644,
  });

  for (const file of template.files) {
    try {
      await writeGuestFile(root, file.dest, await fs.readFile(file.src), file.mode);
    } catch (err) {
      if (!(err instanceof ForkdError)) throw err;
      throw new ForkdError("invalid_argument", `${template.source}: files dest ${file.dest}: ${err.message}`);
    }
  }

  await addDefaultUser(root);
  await writeGuestFile(root, "/etc/hostname", `${GUEST_HOSTNAME}\n`, 0o644);
  const hosts = `127.0.0.1\tlocalhost\n127.0.1.1\t${GUEST_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n`;
  await writeGuestFile(root, "/etc/hosts", hosts, 0o644);

  for (const rel of TRIM_PATHS) {
    const dir = await resolveInRoot(root, rel, true);
    const entries = await fs.readdir(dir).catch(() => [] as string[]);
    for (const entry of entries) await fs.rm(path.join(dir, entry), { recursive: true, force: true });
  }

  for (const required of [GUEST_AGENT_PATH]) {
    const st = await fs.lstat(await resolveInRoot(root, required, true)).catch(() => undefined);
    if (!st?.isFile()) throw new ForkdError("internal", `root filesystem tree lacks ${required}`);
  }
  await fs.chmod(await resolveInRoot(root, GUEST_AGENT_PATH, true), 0o755);
}

/** The guest agent binary in every image (GUEST_AGENT_COMMAND of initramfs.ts starts it). */
export const GUEST_AGENT_PATH = "/opt/forkd/forkd-agent";

/** E2B's default user, which every image has: processes and files of the E2B surface act as it. */
export const DEFAULT_USER = { name: "user", uid: 1000, gid: 1000, home: "/home/user" } as const;

/**
 * An image without accounts (`scratch`, busybox, distroless) gets root's: the agent's processes run as root
 * by default and tools that look up uid 0 (id, ps, a shell's prompt) find a name for it.
 */
async function addRootIfMissing(
  root: string,
  read: (guestPath: string) => Promise<string>,
  lines: (text: string) => string[],
): Promise<void> {
  const passwd = await read("/etc/passwd");
  if (lines(passwd).some((l) => l.split(":")[2] === "0")) return;
  const bash = await fs.lstat(await resolveInRoot(root, "/bin/bash", true)).catch(() => undefined);
  const append = (text: string, line: string) =>
    `${text}${text === "" || text.endsWith("\n") ? "" : "\n"}${line}\n`;
  await writeGuestFile(
    root,
    "/etc/passwd",
    append(passwd, `root:x:0:0:root:/root:${bash ? "/bin/bash" : "/bin/sh"}`),
    0o644,
  );
  const group = await read("/etc/group");
  if (!lines(group).some((l) => l.split(":")[2] === "0")) {
    await writeGuestFile(root, "/etc/group", append(group, "root:x:0:"), 0o644);
  }
  const shadow = await read("/etc/shadow");
  if (!lines(shadow).some((l) => l.split(":")[0] === "root")) {
    await writeGuestFile(root, "/etc/shadow", append(shadow, "root:*::0:99999:7:::"), 0o640);
  }
  await fs.mkdir(await resolveInRoot(root, "/root", true), { recursive: true, mode: 0o700 });
}

/**
 * Adds DEFAULT_USER to the tree's /etc/passwd, /etc/group and /etc/shadow (and /etc/gshadow when the image
 * has one) by editing the files directly: no useradd, no userland tools assumed. Shell: /bin/bash when the
 * image has it, else /bin/sh. A tree that already has the user keeps its own entry; a taken uid or gid moves
 * to the next free number.
 */
export function addDefaultUser(root: string): Promise<{ uid: number; gid: number }> {
  return addAccount(root, DEFAULT_USER);
}

/**
 * Adds an account (`adduser` steps, E2B's default user) the same way: `name` with uid/gid `uid` or the next
 * free number, home `home` (made, owned by it). An existing account of that name is left as it is.
 */
export async function addAccount(
  root: string,
  account: { name: string; uid: number; gid: number; home: string },
  /** The host id of an image id: a build step's tree is owned by the build range's shifted ids. */
  hostIdOf: (id: number) => number = (id) => id,
): Promise<{ uid: number; gid: number }> {
  const treeRoot = { uid: hostIdOf(0), gid: hostIdOf(0) };
  const read = async (guestPath: string) =>
    fs.readFile(await resolveInRoot(root, guestPath), "utf8").catch(() => "");
  const lines = (text: string) => text.split("\n").filter((l) => l !== "");
  await addRootIfMissing(root, read, lines);
  const passwd = await read("/etc/passwd");
  const group = await read("/etc/group");
  const existing = lines(passwd).find((l) => l.split(":")[0] === account.name);
  if (existing !== undefined) {
    const [, , uid, gid] = existing.split(":");
    return { uid: Number(uid), gid: Number(gid) };
  }
  const takenUids = new Set(lines(passwd).map((l) => Number(l.split(":")[2])));
  const takenGids = new Set(lines(group).map((l) => Number(l.split(":")[2])));
  let uid: number = account.uid;
  while (takenUids.has(uid)) uid++;
  const groupLine = lines(group).find((l) => l.split(":")[0] === account.name);
  let gid: number = account.gid;
  if (groupLine !== undefined) gid = Number(groupLine.split(":")[2]);
  else while (takenGids.has(gid)) gid++;
  const bash = await fs.lstat(await resolveInRoot(root, "/bin/bash", true)).catch(() => undefined);
  const shell = bash ? "/bin/bash" : "/bin/sh";
  const append = (text: string, line: string) =>
    `${text}${text === "" || text.endsWith("\n") ? "" : "\n"}${line}\n`;
  await writeGuestFile(
    root,
    "/etc/passwd",
    append(passwd, `${account.name}:x:${uid}:${gid}::${account.home}:${shell}`),
    0o644,
    treeRoot,
  );
  if (groupLine === undefined)
    await writeGuestFile(root, "/etc/group", append(group, `${account.name}:x:${gid}:`), 0o644, treeRoot);
  // A locked password ("*"): E2B's user logs in through the agent, never with a password.
  await writeGuestFile(
    root,
    "/etc/shadow",
    append(await read("/etc/shadow"), `${account.name}:*::0:99999:7:::`),
    0o640,
    treeRoot,
  );
  const gshadow = await read("/etc/gshadow");
  if (gshadow !== "" && groupLine === undefined) {
    await writeGuestFile(root, "/etc/gshadow", append(gshadow, `${account.name}:!::`), 0o640, treeRoot);
  }
  const home = await resolveInRoot(root, account.home);
  await fs.mkdir(home, { recursive: true, mode: 0o750 });
  await fs.chown(home, hostIdOf(uid), hostIdOf(gid));
  return { uid, gid };
}

async function treeSizeMib(root: string, signal?: AbortSignal): Promise<number> {
  const out = await runText("du", ["-s", "-x", "--block-size=1M", root], { signal });
  return Number.parseInt(out, 10);
}

export interface Ext4Result {
  uuid: string;
  /** Space the files take, before any guest writes. */
  usedMib: number;
}

/** An ext4 image of `diskMib` holding `root`, checked with e2fsck. */
export async function makeExt4(
  root: string,
  image: string,
  diskMib: number,
  templateSource: string,
  signal?: AbortSignal,
): Promise<Ext4Result> {
  const usedMib = await treeSizeMib(root, signal);
  // Metadata (inode tables, journal) needs room too; an image filled to the brim also leaves guests no space.
  const neededMib = Math.ceil(usedMib * 1.1) + 64;
  if (neededMib > diskMib) {
    throw new ForkdError(
      "invalid_argument",
      `${templateSource}: disk_mib = ${diskMib} is too small: the root filesystem holds ${usedMib} MiB of files, ` +
        `so disk_mib must be at least ${neededMib}`,
    );
  }
  const uuid = randomUUID();
  const handle = await fs.open(image, "wx", 0o644);
  try {
    await handle.truncate(diskMib * 1024 * 1024);
  } finally {
    await handle.close();
  }
  await run(
    "mkfs.ext4",
    [
      "-q",
      "-F",
      "-L",
      "forkd-root",
      "-U",
      uuid,
      "-m",
      "0",
      // Initialize everything now: otherwise the guest kernel zeroes inode tables in the background after
      // boot, writing into every VM's disk overlay and burning CPU under TCG.
      "-E",
      "root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0",
      "-d",
      root,
      image,
    ],
    { signal, stdout: "ignore" },
  );
  await run("e2fsck", ["-f", "-n", image], { signal, stdout: "ignore" });
  return { uuid, usedMib };
}

const DEFAULT_GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** Whether `program` is an executable file on `pathVar` (the image's PATH), resolved inside the tree. */
export async function onGuestPath(
  root: string,
  pathVar: string | undefined,
  program: string,
): Promise<boolean> {
  for (const dir of (pathVar ?? DEFAULT_GUEST_PATH).split(":")) {
    if (!dir.startsWith("/")) continue;
    const st = await fs.stat(await resolveInRoot(root, `${dir}/${program}`, true)).catch(() => undefined);
    if (st?.isFile() && (st.mode & 0o111) !== 0) return true;
  }
  return false;
}
