/**
 * forkd installed as users install it (`npm run test:install`): the release artifact `npm pack` makes, installed
 *  1. with `npm install -g --prefix` into a clean prefix, and
 *  2. as the Debian package scripts/build-deb.sh makes from it, with dpkg into a clean root (sealed.ts: an
 *     overlay of this host's / whose upper layer records every change, so the .deb's dependencies are this
 *     host's real packages and what install, remove and purge leave is exactly that layer),
 * then, with no checkout anywhere in sight (/work hidden) and cwd / : `forkd doctor`, `forkd image build
 * pyagent`, `forkd snapshot`, `forkd fork -n 2`, the daemon (in the root: started the way the unit starts it)
 * and an SDK call through the package's "forkd/sdk" export; then uninstall, and what is left is only the state
 * the docs (packaging/README.md) say is kept.
 *
 * Run after `npm run build` (the artifact packs that build: FORKD_PACK_PREBUILT=1). FORKD_IMAGE_CACHE
 * (/var/cache/forkd/images) lets the installed forkd reuse the guest image the checkout's tests built.
 */
import assert from "node:assert/strict";
import { type ChildProcess, execFile } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, readlink, rm, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { resolveNetworkConfig } from "../../src/net/config.js";
import { removeHostNetwork } from "../../src/net/host.js";
import { hostTableName } from "../../src/net/nft.js";
import { REPO_ROOT } from "../support/examples.js";
import { qemusMentioning } from "../support/host.js";
import { gidOf, type RunResult, removeScratch, type Sealed, sealedHost, sealedRoot } from "./sealed.js";

const exec = promisify(execFile);
const IMAGE_CACHE = process.env.FORKD_IMAGE_CACHE ?? "/var/cache/forkd/images";
const SYSTEM_HOME = "/var/lib/forkd";
const NPM_GLOBALCONFIG = (await exec("npm", ["config", "get", "globalconfig"])).stdout.trim();
const VERSION = (
  JSON.parse(await readFile(path.join(REPO_ROOT, "package.json"), "utf8")) as { version: string }
).version;

function ok(result: RunResult, what: string): string {
  assert.equal(
    result.status,
    0,
    `${what} exited ${result.status}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`,
  );
  return result.stdout;
}

async function linkExists(file: string): Promise<boolean> {
  return exec("ip", ["link", "show", "dev", file]).then(
    () => true,
    () => false,
  );
}

async function nftTableExists(table: string): Promise<boolean> {
  return exec("nft", ["list", "table", "inet", table]).then(
    () => true,
    () => false,
  );
}

/** Paths the installed package resolves at run time, from its own modules (the real resolvers). */
async function resolvedPaths(box: Sealed, packageDir: string): Promise<Record<string, string>> {
  const script = `
    const root = process.argv[1];
    const pr = await import(root + "/dist/src/image/package-root.js");
    const launcher = await import(root + "/dist/src/isolation/launcher.js");
    const consoleStatic = await import(root + "/dist/src/console/static.js");
    console.log(JSON.stringify({
      packageRoot: pr.packageRoot(),
      templates: pr.builtinTemplatesDir() + "/pyagent.toml",
      guestAgent: pr.defaultGuestPayloadDir() + "/forkd-agent",
      guestWorker: pr.defaultGuestPayloadDir() + "/worker.py",
      runas: pr.defaultToolsDir() + "/forkd-runas",
      launcher: launcher.launcherBinary({}),
      roRam: launcher.readOnlyRamPreload([]).library,
      console: consoleStatic.defaultConsoleDir() + "/index.html",
    }));`;
  const out = ok(await box.run(["node", "--input-type=module", "-e", script, packageDir]), "resolving paths");
  return JSON.parse(out) as Record<string, string>;
}

/** doctor, image build, snapshot, fork -n 2: the CLI's main job. */
async function mainJob(box: Sealed, env: Record<string, string>): Promise<void> {
  assert.equal(ok(await box.run(["forkd", "--version"], { env }), "forkd --version").trim(), VERSION);
  const doctor = ok(await box.run(["forkd", "doctor"], { env }), "forkd doctor");
  assert.match(doctor, /^ok +qemu /m);
  ok(await box.run(["forkd", "image", "build", "pyagent"], { env }), "forkd image build pyagent");
  ok(await box.run(["forkd", "snapshot", "--tag", "pyagent"], { env }), "forkd snapshot");
  const fork = JSON.parse(
    ok(
      await box.run(["forkd", "fork", "--tag", "pyagent", "-n", "2", "--eval", "6 * 7", "--json"], { env }),
      "fork",
    ),
  ) as { n: number; children: { result: string | null; error: string | null }[] };
  assert.equal(fork.children.length, 2);
  for (const child of fork.children) assert.deepEqual([child.result, child.error], ["42", null]);
}

/** A program of a user's own, outside any checkout, that imports the package's "forkd/sdk" export. */
async function writeSdkProgram(dir: string, packageDir: string): Promise<void> {
  await mkdir(path.join(dir, "node_modules"), { recursive: true });
  await symlink(packageDir, path.join(dir, "node_modules", "forkd"));
  await writeFile(
    path.join(dir, "call.mjs"),
    `import { Sandbox } from "forkd/sdk";
const sandbox = await Sandbox.create({ snapshotTag: "pyagent" });
try {
  const ran = await sandbox.commands.run("echo sdk-$((6 * 7))");
  const code = await sandbox.runCode("6 * 7");
  console.log(JSON.stringify({ stdout: ran.stdout, result: code.result }));
} finally {
  await sandbox.kill();
}
`,
  );
}

async function sdkCall(box: Sealed, dir: string, env: Record<string, string>): Promise<void> {
  const answer = JSON.parse(ok(await box.run(["node", "call.mjs"], { env, cwd: dir }), "the SDK call")) as {
    stdout: string;
    result: string;
  };
  assert.deepEqual(answer, { stdout: "sdk-42\n", result: "42" });
}

/** Waits for the daemon's socket; fails at once if the daemon exits first, with what it wrote. */
async function waitForSocket(file: string, daemon: ChildProcess, timeoutMs = 120_000): Promise<void> {
  // Read both streams for as long as it runs (a full pipe would block it), keeping the last 64 KiB.
  let log = "";
  const keep = (c: Buffer) => {
    log = (log + c.toString()).slice(-65536);
  };
  daemon.stdout?.on("data", keep);
  daemon.stderr?.on("data", keep);
  const deadline = Date.now() + timeoutMs;
  while (
    !(await stat(file).then(
      (s) => s.isSocket(),
      () => false,
    ))
  ) {
    if (daemon.exitCode !== null || daemon.signalCode !== null) {
      throw new Error(
        `the daemon exited (${daemon.exitCode ?? daemon.signalCode}) before listening:\n${log}`,
      );
    }
    if (Date.now() > deadline) throw new Error(`no socket at ${file} after ${timeoutMs} ms:\n${log}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** After a failure: the QEMUs of a home this test made (confined ones are in mount namespaces of their own). */
async function killQemus(home: string): Promise<void> {
  for (const pid of await qemusMentioning(home)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone
    }
  }
}

/** SIGTERM, as `systemctl stop` sends (the daemon drains and exits; TimeoutStopSec=45s, then SIGKILL). */
async function stopDaemon(daemon: ChildProcess): Promise<void> {
  if (daemon.exitCode !== null || daemon.signalCode !== null) return;
  const exited = new Promise((resolve) => daemon.once("exit", resolve));
  daemon.kill("SIGTERM");
  const timer = setTimeout(() => daemon.kill("SIGKILL"), 45_000);
  await exited;
  clearTimeout(timer);
}

/** The unit's [Service] settings, continuation lines joined; repeated keys keep every value. */
export function parseUnit(text: string): Map<string, string[]> {
  const settings = new Map<string, string[]>();
  let section = "";
  for (const line of text.replace(/\\\n\s*/g, " ").split("\n")) {
    const trimmed = line.trim();
    if (trimmed === "" || trimmed.startsWith("#")) continue;
    const header = /^\[(.+)\]$/.exec(trimmed);
    if (header) {
      section = header[1] as string;
      continue;
    }
    if (section !== "Service") continue;
    const eq = trimmed.indexOf("=");
    const key = trimmed.slice(0, eq);
    settings.set(key, [...(settings.get(key) ?? []), trimmed.slice(eq + 1)]);
  }
  return settings;
}

describe("forkd installed as users install it", { timeout: 90 * 60_000 }, () => {
  let work: string;
  let tgz: string;

  before(async () => {
    assert.equal(process.getuid?.(), 0, "the install tests need root (dpkg, namespaces, VMs)");
    work = await mkdtemp(path.join(os.tmpdir(), "forkd-install-"));
    const packed = await exec("npm", ["pack", "--json", "--pack-destination", work], {
      cwd: REPO_ROOT,
      env: { ...process.env, FORKD_PACK_PREBUILT: "1" },
      maxBuffer: 64 * 1024 * 1024,
    });
    const [info] = JSON.parse(packed.stdout) as { filename: string; entryCount: number; size: number }[];
    tgz = path.join(work, info!.filename);
    console.log(`# artifact ${info!.filename}: ${info!.entryCount} files, ${info!.size} bytes`);
  });
  after(async () => {
    if (work) await rm(work, { recursive: true, force: true });
  });

  it("the artifact holds what the package runs and nothing a user does not", async () => {
    const files = (await exec("tar", ["-tzf", tgz], { maxBuffer: 64 * 1024 * 1024 })).stdout
      .split("\n")
      .filter(Boolean)
      .map((f) => f.replace(/^package\//, ""));
    const unwanted = files.filter(
      (f) =>
        /^(src|test|bench|docs|examples|sdk|console|scripts|\.ci)\//.test(f) ||
        /^dist\/(test|bench)\//.test(f) ||
        /\.(map|ts)$/.test(f) ||
        f === "dist/src/api/write-openapi.js",
    );
    assert.deepEqual(unwanted, []);
    for (const needed of ["package.json", "npm-shrinkwrap.json", "bin/forkd.js", "packaging/forkd.service"]) {
      assert.ok(files.includes(needed), `${needed} is packed`);
    }
  });

  describe("npm install -g --prefix into a clean prefix", () => {
    let box: Sealed;
    let prefix: string;
    let home: string;
    let env: Record<string, string>;
    const packageDir = () => path.join(prefix, "lib", "node_modules", "forkd");

    before(async () => {
      box = await sealedHost();
      prefix = path.join(work, "prefix");
      home = path.join(work, "home");
      env = {
        PATH: `${prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`,
        FORKD_HOME: home,
        FORKD_IMAGE_CACHE: IMAGE_CACHE,
      };
    });
    after(async () => {
      await box?.close();
      if (home) await killQemus(`${home}/`);
      // Whatever a failed run left on the host network.
      if (home) await removeHostNetwork(resolveNetworkConfig({}, {}, home), home).catch(() => {});
    });

    it("installs with working commands, every run-time path inside the package", async () => {
      const started = Date.now();
      ok(
        await box.run(
          [
            "npm",
            "install",
            "--global",
            "--prefix",
            prefix,
            // --prefix also moves where npm looks for its global config: keep the machine's.
            `--globalconfig=${NPM_GLOBALCONFIG}`,
            "--allow-scripts=better-sqlite3,koffi",
            "--no-audit",
            "--no-fund",
            tgz,
          ],
          { env, cwd: work },
        ),
        "npm install -g",
      );
      console.log(`# npm install -g: ${Math.round((Date.now() - started) / 1000)} s`);
      for (const cmd of ["forkd", "forkd-controller", "forkd-mcp"]) {
        assert.ok(existsSync(path.join(prefix, "bin", cmd)), `${cmd} is on the prefix's PATH`);
      }
      const resolved = await resolvedPaths(box, packageDir());
      assert.equal(resolved.packageRoot, packageDir());
      for (const [what, file] of Object.entries(resolved)) {
        assert.ok(file.startsWith(packageDir()), `${what} (${file}) is inside the installed package`);
        assert.ok(existsSync(file), `${what}: ${file} exists`);
      }
      const help = await box.run(["forkd-controller", "--help"], { env });
      assert.match(help.stderr, /forkd-controller serve/, "forkd-controller answers");
    });

    it("runs doctor, image build, snapshot and fork outside the checkout", async () => {
      await mainJob(box, env);
    });

    it("serves the daemon, which the package's SDK export reaches", async () => {
      const socket = path.join(home, "forkd.sock");
      const daemon = box.start(
        ["forkd", "daemon", "--socket", socket, "--audit-log", path.join(home, "audit.log")],
        { env },
      );
      try {
        await waitForSocket(socket, daemon);
        const sdkDir = path.join(work, "sdk-prefix");
        await writeSdkProgram(sdkDir, packageDir());
        await sdkCall(box, sdkDir, { ...env, FORKD_URL: `unix:${socket}` });
      } finally {
        await stopDaemon(daemon);
      }
    });

    it("uninstalls to nothing but the home and the image cache (teardown first, as the docs say)", async () => {
      ok(await box.run(["forkd", "teardown"], { env }), "forkd teardown");
      ok(
        await box.run(["npm", "uninstall", "--global", "--prefix", prefix, "forkd"], { env, cwd: work }),
        "npm uninstall -g",
      );
      const left = (await exec("find", [prefix, "-mindepth", "1", "-not", "-type", "d"])).stdout.trim();
      assert.equal(left, "", "no file of forkd left in the prefix");
      assert.deepEqual(await box.processes(), [], "no process left");
      assert.deepEqual(await qemusMentioning(`${home}/`), [], "no QEMU left");
      const config = resolveNetworkConfig({}, {}, home);
      assert.equal(await linkExists(config.bridge), false, "the home's bridge is gone");
      assert.equal(await nftTableExists(hostTableName(config)), false, "the home's host rules are gone");
      assert.ok(existsSync(path.join(home, "snapshots", "pyagent")), "the home's snapshots are kept");
    });
  });

  describe("the Debian package, with dpkg into a clean root", () => {
    let box: Sealed;
    let deb: string;
    let baseline: Set<string>;
    const sdkDir = "/root/forkd-install-sdk";
    const cliEnv = { FORKD_IMAGE_CACHE: IMAGE_CACHE };
    const config = resolveNetworkConfig({}, {}, SYSTEM_HOME);

    before(async () => {
      const started = Date.now();
      const built = await exec(path.join(REPO_ROOT, "scripts", "build-deb.sh"), [tgz, work], {
        maxBuffer: 64 * 1024 * 1024,
      });
      deb = built.stdout.trim().split("\n").at(-1) as string;
      console.log(
        `# build-deb: ${Math.round((Date.now() - started) / 1000)} s, ${(await stat(deb)).size} bytes`,
      );
      assert.equal(
        await linkExists(config.bridge),
        false,
        `${config.bridge} must not exist on this host already`,
      );
      box = await sealedRoot(path.join(work, "root"));
      // The root starts as a host without forkd: no accounts of its own (this host has forkd-vm from
      // install-deps.sh), and a user to try the socket group with.
      await box.run(["userdel", "forkd-vm"]);
      await box.run(["groupdel", "forkd"]);
      ok(await box.run(["useradd", "--no-create-home", "forkd-install-alice"]), "useradd");
      ok(await box.run(["useradd", "--no-create-home", "forkd-install-bob"]), "useradd");
      baseline = new Set(await box.changes());
    });
    after(async () => {
      await box?.close();
      await killQemus(`${SYSTEM_HOME}/`);
      if (work) await removeScratch(path.join(work, "root"));
      await removeHostNetwork(config, SYSTEM_HOME).catch(() => {});
    });

    it("installs: /usr/bin/forkd, the unit (enabled), the forkd group and forkd-vm's uid range", async () => {
      ok(await box.run(["dpkg", "--install", deb]), "dpkg --install");
      for (const file of ["/usr/bin/forkd", "/usr/bin/forkd-controller", "/usr/bin/forkd-mcp"]) {
        assert.ok(existsSync(box.hostPath(file)), `${file} installed`);
      }
      assert.ok(existsSync(box.hostPath("/lib/systemd/system/forkd.service")));
      // A link to /lib/systemd/system/forkd.service, which only resolves inside the root.
      assert.equal(
        await readlink(box.hostPath("/etc/systemd/system/multi-user.target.wants/forkd.service")).catch(
          () => null,
        ),
        "/lib/systemd/system/forkd.service",
        "enabled, as Debian enables the services it installs",
      );
      assert.ok((await gidOf(box, "forkd")) !== undefined, "group forkd");
      const subuid = await readFile(box.hostPath("/etc/subuid"), "utf8");
      assert.match(subuid, /^forkd-vm:2000000000:4194304$/m);
      const resolved = await resolvedPaths(box, "/usr/lib/forkd");
      for (const [what, file] of Object.entries(resolved)) {
        assert.ok(file.startsWith("/usr/lib/forkd"), `${what} (${file}) is inside /usr/lib/forkd`);
        assert.ok(existsSync(box.hostPath(file)), `${what}: ${file} exists`);
      }
    });

    it("has a unit that systemd-analyze verifies as installed", async () => {
      const verified = await box.run(["systemd-analyze", "verify", "/lib/systemd/system/forkd.service"]);
      assert.deepEqual(
        { status: verified.status, output: `${verified.stdout}${verified.stderr}`.trim() },
        {
          status: 0,
          output: "",
        },
      );
    });

    it("runs doctor, image build, snapshot and fork from /usr/bin", async () => {
      await mainJob(box, cliEnv);
    });

    it("serves the daemon started as the unit starts it: flags, environment, directories, modes, umask, root", async () => {
      const unit = parseUnit(await readFile(box.hostPath("/lib/systemd/system/forkd.service"), "utf8"));
      assert.equal(unit.get("User"), undefined, "the unit runs as root");
      const [execStart] = unit.get("ExecStart") ?? [];
      assert.ok(execStart && !/["'%$\\]/.test(execStart), `an ExecStart this test can split: ${execStart}`);
      const argv = execStart.split(/\s+/);
      const unitEnv = Object.fromEntries(
        (unit.get("Environment") ?? [])
          .flatMap((e) => e.split(/\s+/))
          .map((kv) => kv.split("=", 2) as [string, string]),
      );
      const dirs: [string, string, string][] = [
        ["RuntimeDirectory", "/run", "0755"],
        ["StateDirectory", "/var/lib", "0755"],
        ["CacheDirectory", "/var/cache", "0755"],
        ["LogsDirectory", "/var/log", "0755"],
      ];
      const made: { dir: string; mode: string }[] = [];
      for (const [key, base, defaultMode] of dirs) {
        const name = unit.get(key)?.[0];
        assert.ok(name, `${key}`);
        const mode = unit.get(`${key}Mode`)?.[0] ?? defaultMode;
        made.push({ dir: path.join(base, name), mode });
        ok(
          await box.run(["sh", "-c", 'mkdir -p "$1" && chmod "$2" "$1"', "sh", path.join(base, name), mode]),
          key,
        );
      }
      const daemon = box.start(argv, {
        env: unitEnv,
        bareEnv: true,
        umask: unit.get("UMask")?.[0] ?? "0022",
      });
      try {
        const socketArg = argv[argv.indexOf("--socket") + 1] as string;
        await waitForSocket(box.hostPath(socketArg), daemon);
        const socket = await stat(box.hostPath(socketArg));
        assert.equal(socket.mode & 0o777, 0o660, "socket mode 0660");
        assert.equal(socket.gid, await gidOf(box, "forkd"), "socket group forkd (--socket-group)");
        for (const { dir, mode } of made) {
          assert.equal(
            ((await stat(box.hostPath(dir))).mode & 0o777).toString(8).padStart(4, "0"),
            mode,
            `${dir} mode`,
          );
        }

        // A member of the forkd group uses the socket; anyone else is refused by its mode.
        ok(await box.run(["usermod", "-aG", "forkd", "forkd-install-alice"]), "usermod");
        const asUser = (user: string) => [
          "setpriv",
          `--reuid=${user}`,
          `--regid=${user}`,
          "--init-groups",
          "--",
        ];
        ok(
          await box.run([...asUser("forkd-install-alice"), "forkd", "ls", "--json"], { env: cliEnv }),
          "forkd ls as a forkd member",
        );
        const bob = await box.run([...asUser("forkd-install-bob"), "forkd", "ls", "--json"], { env: cliEnv });
        assert.notEqual(bob.status, 0, "a user outside the forkd group is refused");

        await mkdir(box.hostPath(sdkDir), { recursive: true });
        await writeSdkProgram(box.hostPath(sdkDir), "/usr/lib/forkd");
        await sdkCall(box, sdkDir, cliEnv);

        // Left running across the stop: KillMode=process stops only the daemon.
        const spawned = ok(
          await box.run(["forkd", "spawn", "--tag", "pyagent", "-n", "1"], { env: cliEnv }),
          "spawn",
        );
        assert.match(spawned, /sb-[0-9a-f]{12}/);
        const audit = await stat(box.hostPath("/var/log/forkd/audit.log"));
        assert.equal(audit.mode & 0o777, 0o640, "audit log 0640 (UMask=0027)");
      } finally {
        await stopDaemon(daemon);
        // systemd removes the RuntimeDirectory when the unit stops.
        await box.run(["rm", "-rf", "/run/forkd"]);
      }
      // A confined QEMU has a mount namespace of its own: found by its command line (paths under the home).
      assert.equal(
        (await qemusMentioning(`${SYSTEM_HOME}/`)).length,
        1,
        "the sandbox outlived its daemon, as under the unit",
      );
    });

    it("removes: sandboxes killed, host network gone; state, images, log, accounts and systemd's record kept", async () => {
      await box.run(["rm", "-rf", sdkDir]);
      ok(await box.run(["dpkg", "--remove", "forkd"]), "dpkg --remove");
      assert.deepEqual(await qemusMentioning(`${SYSTEM_HOME}/`), [], "prerm's teardown killed the sandbox");
      assert.deepEqual(await box.processes(), [], "no process left");
      assert.equal(await linkExists(config.bridge), false, `${config.bridge} removed`);
      assert.equal(await nftTableExists(hostTableName(config)), false, "host rules removed");
      const left = leftovers(baseline, await box.changes(), "remove");
      assert.deepEqual(left, [], "nothing but the kept state");
      for (const kept of [
        "/var/lib/forkd/state.db",
        "/var/lib/forkd/snapshots/pyagent",
        "/var/log/forkd/audit.log",
      ]) {
        assert.ok(existsSync(box.hostPath(kept)), `${kept} kept`);
      }
      assert.deepEqual(await readdir(box.hostPath("/dev/shm")), [], "no in-memory cache left in /dev/shm");
    });

    it("purges: only the accounts stay", async () => {
      ok(await box.run(["dpkg", "--purge", "forkd"]), "dpkg --purge");
      assert.deepEqual(leftovers(baseline, await box.changes(), "purge"), [], "nothing but the accounts");
      for (const gone of [
        "/var/lib/forkd",
        "/var/cache/forkd",
        "/var/log/forkd",
        "/etc/systemd/system/forkd.service",
      ]) {
        assert.equal(existsSync(box.hostPath(gone)), false, `${gone} purged`);
      }
      assert.ok((await gidOf(box, "forkd")) !== undefined, "group forkd kept");
    });
  });
});

/**
 * Entries of the root's upper layer that are not allowed after `stage`: what the package's docs say is kept
 * (packaging/README.md "Removing"), dpkg's own records, and directories the host already has (an upper layer
 * holds a copy of every directory something below it changed).
 */
function leftovers(baseline: Set<string>, changes: string[], stage: "remove" | "purge"): string[] {
  const accounts = /^\/etc\/(passwd|group|shadow|gshadow|subuid|subgid)-?$/;
  const dpkg = /^\/var\/(lib\/dpkg\/|log\/dpkg\.log$)/;
  const state = /^\/var\/(lib|cache|log)\/forkd(\/|$)/;
  const systemdRecord =
    /^\/(etc\/systemd\/system\/(forkd\.service|multi-user\.target\.wants\/forkd\.service)|var\/lib\/systemd\/deb-systemd-helper-(enabled|masked)(\/.*forkd\.service.*)?)$/;
  const purgedState = /^\/var\/(lib|cache|log)\/forkd \(whiteout\)$/;
  return changes.filter((entry) => {
    if (baseline.has(entry)) return false;
    if (accounts.test(entry) || dpkg.test(entry)) return false;
    if (!entry.endsWith("(whiteout)") && existsSync(entry) && isDirectory(entry)) return false;
    if (stage === "remove") return !(state.test(entry) || systemdRecord.test(entry));
    return !purgedState.test(entry);
  });
}

function isDirectory(hostPath: string): boolean {
  try {
    return statSync(hostPath).isDirectory();
  } catch {
    return false;
  }
}
