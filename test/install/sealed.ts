/**
 * Where the install tests run an installed forkd: a mount namespace of their own, held open by a `sleep`
 * process, in which no checkout exists (/work is an empty tmpfs) and commands start with a clean environment
 * (`env -i`), the PATH given, and a working directory outside any checkout.
 *
 *  - `sealedHost()`: the host's own filesystem (for `npm install -g --prefix`), with /work and /dev/shm hidden.
 *  - `sealedRoot()`: a root for dpkg: an overlay whose lower layer is the host's / (so the .deb's dependencies
 *    are the host's real packages) and whose upper layer is a tmpfs that records every change install,
 *    removal and purge make; /dev, /proc, /sys bound in, /run, /dev/shm and /work fresh tmpfs, commands run
 *    chrooted into it. Nothing written in it reaches the host's filesystem.
 *
 * Processes started inside share the host's network namespace (bridges, rules, veths are real host state, which
 * the tests check is removed) and are told apart from everyone else's by their mount namespace.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdir, readdir, readFile, readlink, rm } from "node:fs/promises";
import path from "node:path";

const DEFAULT_TIMEOUT_MS = 20 * 60_000;

export const SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export interface RunResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  env?: Record<string, string>;
  cwd?: string;
  input?: string;
  /** Shell `umask` before the command (the unit's UMask). */
  umask?: string;
  /** Only PATH and `env` (as systemd gives a service), not the HOME and LANG a login shell has. */
  bareEnv?: boolean;
  timeoutMs?: number;
}

export interface Sealed {
  /** "/" for the host, or the overlay's mount point (as the host sees it from inside the namespace). */
  readonly root: string;
  /** Runs argv inside (chrooted for a root) and collects its output. */
  run(argv: string[], options?: RunOptions): Promise<RunResult>;
  /** Starts argv inside, in the background. */
  start(argv: string[], options?: RunOptions): ChildProcess;
  /** `p` inside, as a path the test process can open (through the holder's /proc/<pid>/root). */
  hostPath(p: string): string;
  /** Every path the overlay's upper layer holds (a root only), relative, with "(whiteout)" for removals. */
  changes(): Promise<string[]>;
  /** PIDs of processes in this mount namespace, other than its holder. */
  processes(): Promise<number[]>;
  /** SIGKILLs every process inside, then the holder: the namespace and its tmpfs layers go with it. */
  close(): Promise<void>;
}

async function hold(setup: string, args: string[]): Promise<ChildProcess> {
  const holder = spawn(
    "unshare",
    [
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      `set -e\n${setup}\necho ready\nexec sleep infinity`,
      "sh",
      ...args,
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  holder.stderr?.on("data", (c: Buffer) => {
    stderr += c.toString();
  });
  await new Promise<void>((resolve, reject) => {
    holder.stdout?.on("data", (c: Buffer) => {
      if (c.toString().includes("ready")) resolve();
    });
    holder.once("exit", (code) => reject(new Error(`namespace setup failed (exit ${code}): ${stderr}`)));
  });
  return holder;
}

function sealed(holder: ChildProcess, root: string, upper: string | null): Sealed {
  const pid = holder.pid as number;
  const argvFor = (argv: string[], options: RunOptions): string[] => {
    const env = {
      PATH: SYSTEM_PATH,
      ...(options.bareEnv ? {} : { HOME: "/root", LANG: "C.UTF-8" }),
      ...options.env,
    };
    const inner = [
      "env",
      "-i",
      ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
      "sh",
      "-c",
      `umask ${options.umask ?? "0022"}; cd "$1"; shift; exec "$@"`,
      "sh",
      options.cwd ?? "/",
      ...argv,
    ];
    return ["--target", String(pid), "--mount", "--", ...(root === "/" ? [] : ["chroot", root]), ...inner];
  };
  const self: Sealed = {
    root,
    start: (argv, options = {}) =>
      spawn("nsenter", argvFor(argv, options), {
        stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
      }),
    run: (argv, options = {}) =>
      new Promise((resolve, reject) => {
        const child = self.start(argv, options);
        let stdout = "";
        let stderr = "";
        child.stdout?.on("data", (c: Buffer) => {
          stdout += c.toString();
        });
        child.stderr?.on("data", (c: Buffer) => {
          stderr += c.toString();
        });
        if (options.input !== undefined) child.stdin?.end(options.input);
        const timer = setTimeout(() => {
          child.kill("SIGKILL");
          reject(
            new Error(
              `${argv.join(" ")}: no exit within ${options.timeoutMs ?? DEFAULT_TIMEOUT_MS} ms\n${stdout}\n${stderr}`,
            ),
          );
        }, options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
        child.once("exit", (status) => {
          clearTimeout(timer);
          resolve({ status, stdout, stderr });
        });
        child.once("error", reject);
      }),
    hostPath: (p) => path.join(`/proc/${pid}/root`, root, p),
    changes: async () => {
      if (upper === null) return [];
      const out: string[] = [];
      const walk = async (dir: string, rel: string): Promise<void> => {
        for (const entry of await readdir(dir, { withFileTypes: true })) {
          const relPath = path.join(rel, entry.name);
          // overlayfs records a removal as a 0:0 character device.
          if (entry.isCharacterDevice()) out.push(`${relPath} (whiteout)`);
          else out.push(relPath);
          if (entry.isDirectory()) await walk(path.join(dir, entry.name), relPath);
        }
      };
      await walk(path.join(`/proc/${pid}/root`, upper), "/");
      return out.sort();
    },
    processes: async () => {
      const ns = await readlink(`/proc/${pid}/ns/mnt`);
      const pids: number[] = [];
      for (const entry of await readdir("/proc")) {
        if (!/^\d+$/.test(entry) || Number(entry) === pid) continue;
        if ((await readlink(`/proc/${entry}/ns/mnt`).catch(() => "")) === ns) pids.push(Number(entry));
      }
      return pids;
    },
    close: async () => {
      if (holder.exitCode !== null || holder.signalCode !== null) return;
      for (const p of await self.processes()) {
        try {
          process.kill(p, "SIGKILL");
        } catch {
          // gone
        }
      }
      const exited = new Promise((resolve) => holder.once("exit", resolve));
      holder.kill("SIGKILL");
      await exited;
    },
  };
  return self;
}

/**
 * The host's filesystem with no checkout in it (/work hidden; `{ checkouts: true }` keeps them) and a /dev/shm
 * of its own.
 */
export async function sealedHost(options: { checkouts?: boolean } = {}): Promise<Sealed> {
  const holder = await hold(
    [...(options.checkouts ? [] : ["mount -t tmpfs tmpfs /work"]), "mount -t tmpfs tmpfs /dev/shm"].join(
      "\n",
    ),
    [],
  );
  return sealed(holder, "/", null);
}

/** A root for dpkg over the host's /, its changes recorded in a tmpfs upper layer. `scratch` must be empty. */
export async function sealedRoot(scratch: string): Promise<Sealed> {
  await mkdir(path.join(scratch, "layers"), { recursive: true });
  await mkdir(path.join(scratch, "root"), { recursive: true });
  const holder = await hold(
    [
      'mount -t tmpfs tmpfs "$1/layers"',
      'mkdir "$1/layers/upper" "$1/layers/work"',
      'mount -t overlay overlay -o "lowerdir=/,upperdir=$1/layers/upper,workdir=$1/layers/work" "$1/root"',
      'mount --rbind /dev "$1/root/dev"',
      'mount -t tmpfs tmpfs "$1/root/dev/shm"',
      'mount -t proc proc "$1/root/proc"',
      'mount --rbind /sys "$1/root/sys"',
      'mount -t tmpfs -o mode=0755 tmpfs "$1/root/run"',
      'mount -t tmpfs tmpfs "$1/root/work"',
    ].join("\n"),
    [scratch],
  );
  return sealed(holder, path.join(scratch, "root"), path.join(scratch, "layers", "upper"));
}

/** Removes a scratch directory once its namespace is gone (its mounts went with it). */
export async function removeScratch(scratch: string): Promise<void> {
  await rm(scratch, { recursive: true, force: true });
}

/** The gid of `group` in a root's /etc/group. */
export async function gidOf(sealedRoot: Sealed, group: string): Promise<number | undefined> {
  const line = (await readFile(sealedRoot.hostPath("/etc/group"), "utf8"))
    .split("\n")
    .find((l) => l.startsWith(`${group}:`));
  return line === undefined ? undefined : Number(line.split(":")[2]);
}
