/**
 * forkd-launcher's confinement steps, on the real binary with a shell as the program (the VM tests check the
 * same things of QEMU): the uid is base + pid, every capability is gone and no_new_privs is set, the mount
 * namespace shows only what it was given (read-only where it should be), the run directory is reachable but not
 * writable, the file size cap and the cgroup hold from the program's first instruction, and a program told to
 * die with its parent does.
 */
import assert from "node:assert/strict";
import { execFile, spawn, spawnSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, rmdir, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import {
  createSandboxCgroups,
  detectCgroupLayout,
  prepareCgroupParents,
  removeCgroups,
} from "../../src/isolation/cgroup.js";
import { DEFAULT_VM_UID_BASE } from "../../src/isolation/identity.js";
import { type LaunchPlan, launcherBinary, launcherPrefix } from "../../src/isolation/launcher.js";
import { waitFor } from "../support/host.js";

const run = promisify(execFile);
const root = process.getuid?.() === 0;
const BASE = DEFAULT_VM_UID_BASE;

function launch(plan: LaunchPlan, script: string, options: { input?: string } = {}) {
  const [binary, ...args] = launcherPrefix(plan);
  return spawnSync(binary as string, [...args, "/bin/sh", "-c", script], { encoding: "utf8", ...options });
}

describe("forkd-launcher confinement", { skip: !root && "needs root" }, () => {
  let dir: string;
  let runDir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-confine-"));
    runDir = path.join(dir, "run");
    await mkdir(runDir, { mode: 0o700 });
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("refuses confinement flags that do not go together or name paths it provides", () => {
    const cases: [string[], RegExp][] = [
      [["--uid-base", "2000000000", "--", "true"], /--uid-base and --run-dir go together/],
      [["--run-dir", "/tmp/x", "--", "true"], /--uid-base and --run-dir go together/],
      [["--uid-base", "1000", "--run-dir", "/tmp/x", "--", "true"], /--uid-base "1000": must be an integer/],
      [["--uid-base", "2000000000", "--run-dir", "/tmp/../etc", "--", "true"], /clean absolute path/],
      [
        ["--uid-base", "2000000000", "--run-dir", "/tmp/x", "--ro", "/proc/1/mem", "--", "true"],
        /provided by/,
      ],
      [["--uid-base", "2000000000", "--run-dir", "/tmp/x", "--dev", "sda", "--", "true"], /not a device/],
      [["--cgroup", "/etc/passwd", "--", "true"], /under \/sys\/fs\/cgroup/],
      [["--cgroup", "/sys/fs/cgroup/../../etc", "--", "true"], /under \/sys\/fs\/cgroup/],
      [["--fsize-limit", "10", "--", "true"], /1 MiB\.\.1 PiB/],
      [["--listen-socket", "/tmp/q.sock", "--", "true"], /go together/],
    ];
    for (const [args, message] of cases) {
      const result = spawnSync(launcherBinary(), args, { encoding: "utf8" });
      assert.equal(result.status, 125, `${args.join(" ")}: ${result.stderr}`);
      assert.match(result.stderr, message, args.join(" "));
    }
    assert.throws(() => launcherPrefix({ confine: { uidBase: 10, runDir: "/tmp/x" } }), /uid base/);
    assert.throws(() => launcherPrefix({ confine: { uidBase: BASE, runDir: "/tmp/x/" } }), /clean absolute/);
    assert.throws(() => launcherPrefix({ cgroups: ["/sys/fs/cgroup/a/../b"] }), /clean path/);
  });

  it("runs the program as base+pid with no capabilities, no_new_privs and its own processes only", () => {
    const result = launch(
      { confine: { uidBase: BASE, runDir } },
      'echo "pid $$"; grep -E "^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):" /proc/self/status; ls /proc',
    );
    assert.equal(result.status, 0, result.stderr);
    const pid = Number(/^pid (\d+)$/m.exec(result.stdout)?.[1]);
    const uid = BASE + pid;
    assert.match(result.stdout, new RegExp(`^Uid:\\s+${uid}\\s+${uid}\\s+${uid}\\s+${uid}$`, "m"));
    assert.match(result.stdout, new RegExp(`^Gid:\\s+${uid}\\s+${uid}\\s+${uid}\\s+${uid}$`, "m"));
    assert.match(result.stdout, /^Groups:\s*$/m, "no supplementary groups");
    for (const set of ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]) {
      assert.match(result.stdout, new RegExp(`^${set}:\\s+0{16}$`, "m"), set);
    }
    assert.match(result.stdout, /^NoNewPrivs:\s+1$/m);
    // /proc shows only the program's own processes (the shell and ls), not the host's.
    const pids = result.stdout.split("\n").filter((l) => /^\d+$/.test(l));
    assert.ok(pids.length >= 1 && pids.length <= 3, `processes visible: ${pids.join(",")}`);
    assert.ok(!pids.includes("1"), "init is not visible");
  });

  it("shows only what it was given, read-only unless handed over", async () => {
    const ro = path.join(dir, "image.bin");
    await writeFile(ro, "snapshot bytes");
    const link = path.join(dir, "base.ext4");
    await symlink("image.bin", link);
    const own = path.join(dir, "ram.bin");
    await writeFile(own, "");
    const hidden = path.join(dir, "secret");
    await writeFile(hidden, "not for the program");
    const script = [
      "ls /",
      `cat ${link}`,
      `echo x >> ${ro} 2>&1 || echo ro-refused`,
      `echo written >> ${own} && echo own-written`,
      `cat ${hidden} 2>&1 || echo hidden-missing`,
      `ls /etc`,
      `touch ${runDir}/new 2>&1 || echo run-dir-closed`,
      `ls ${runDir} 2>&1 || echo run-dir-unlisted`,
    ].join("; ");
    const result = launch({ confine: { uidBase: BASE, runDir, own: [own], readOnly: [link] } }, script);
    assert.equal(result.status, 0, result.stderr);
    const out = result.stdout;
    const top = out.split("\n").slice(0, 12);
    for (const name of ["usr", "dev", "proc", "etc"]) assert.ok(top.includes(name), `${name} in / (${top})`);
    for (const name of ["root", "home", "var", "boot", "srv"])
      assert.ok(!top.includes(name), `no ${name} in /`);
    assert.match(out, /snapshot bytes/, "a read-only path (through its symlink) is readable");
    assert.match(out, /ro-refused/, "and not writable");
    assert.match(out, /own-written/, "a handed-over file is writable");
    assert.match(out, /hidden-missing/, "anything not given does not exist");
    assert.match(out, /^ld\.so\.cache$/m, "/etc holds only the loader's cache");
    assert.match(out, /run-dir-closed/, "nothing can be created in the run directory");
    assert.match(out, /run-dir-unlisted/, "nor can it be listed");
    assert.equal((await readFile(own, "utf8")).trim(), "written");
    assert.equal(await readFile(ro, "utf8"), "snapshot bytes");
    const st = await stat(runDir);
    assert.equal(st.uid, 0, "the run directory stays root's");
    assert.equal(st.mode & 0o777, 0o710);
    assert.ok(st.gid >= BASE, `its group is the program's (${st.gid})`);
    assert.ok((await stat(own)).uid >= BASE, "the --own file was handed over");
  });

  it("keeps its run directory reachable when started under the daemon unit's UMask=0027", async () => {
    // The launcher builds the program's root as the daemon's child: with the unit's umask, directories it made
    // there came out 0750 and the confined uid could not reach its own sockets (QEMU: Permission denied).
    const own = path.join(runDir, "umask-own");
    await writeFile(own, "");
    const [binary, ...args] = launcherPrefix({ confine: { uidBase: BASE, runDir, own: [own] } });
    const result = spawnSync(
      "/bin/sh",
      [
        "-c",
        'umask 0027; exec "$@"',
        "sh",
        binary as string,
        ...args,
        "/bin/sh",
        "-c",
        `echo reached > ${own}`,
      ],
      { encoding: "utf8" },
    );
    assert.equal(result.status, 0, result.stderr);
    assert.equal(await readFile(own, "utf8"), "reached\n");
  });

  it("caps the size of files the program writes (writes past it fail, the program lives)", async () => {
    const own = path.join(dir, "disk.img");
    await writeFile(own, "");
    const result = launch(
      { fileSizeLimitBytes: 2 ** 20, confine: { uidBase: BASE, runDir, own: [own] } },
      `dd if=/dev/zero of=${own} bs=64k count=64 2>&1; echo "rc=$?"`,
    );
    assert.equal(result.status, 0, result.stderr);
    assert.match(result.stdout, /File too large/);
    assert.match(result.stdout, /rc=1/);
    assert.equal((await stat(own)).size, 2 ** 20);
  });

  it("joins cgroups before exec, and pids.max holds from inside", async (t) => {
    const layout = await detectCgroupLayout("0123456789ab");
    if (!layout.hierarchies.pids) return t.skip("no pids controller here");
    await prepareCgroupParents(layout);
    const id = "sb-0000c0ffee00";
    const dirs = await createSandboxCgroups(layout, id, { pids: 16 });
    try {
      const pidsDir = path.join(layout.hierarchies.pids.parent, id);
      const [binary, ...args] = launcherPrefix({ cgroups: dirs });
      const program = spawn(
        binary as string,
        [...args, "/bin/sh", "-c", "cat /proc/self/cgroup; for i in $(seq 1 40); do sleep 1 & done; wait"],
        { stdio: ["ignore", "pipe", "pipe"] },
      );
      let stdout = "";
      let stderr = "";
      program.stdout.on("data", (d: Buffer) => {
        stdout += d;
      });
      program.stderr.on("data", (d: Buffer) => {
        stderr += d;
      });
      // Measured from the host while the shell tries to start 40 processes.
      let most = 0;
      const exited = new Promise((resolve) => program.once("exit", resolve));
      let done = false;
      void exited.then(() => {
        done = true;
      });
      // Until the shell has gone and so have the sleeps it did start (dash stops at its first refused fork).
      for (const deadline = Date.now() + 15_000; Date.now() < deadline; ) {
        const current = Number((await readFile(path.join(pidsDir, "pids.current"), "utf8")).trim());
        most = Math.max(most, current);
        if (done && current === 0) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.match(stdout, new RegExp(`^\\d+:pids:.*/${id}$`, "m"), "in the cgroup at its first instruction");
      assert.ok(most > 1 && most <= 16, `most processes at once: ${most}`);
      assert.match(stderr, /fork/i, "the shell was refused processes past the limit");
      const events = await readFile(path.join(pidsDir, "pids.events"), "utf8");
      assert.ok(Number(/max (\d+)/.exec(events)?.[1]) > 0, events);
    } finally {
      await removeCgroups(dirs);
      for (const h of Object.values(layout.hierarchies)) await rmdir(h.parent).catch(() => {});
    }
  });

  it("binds a listening socket for the program at the fd it was told", async () => {
    const socket = path.join(runDir, "qmp.sock");
    const result = launch(
      { listen: { path: socket, fd: 5 }, confine: { uidBase: BASE, runDir } },
      "readlink /proc/self/fd/5",
    );
    assert.equal(result.status, 0, result.stderr);
    assert.match(result.stdout, /^socket:/);
    const st = await stat(socket);
    assert.ok(st.isSocket());
    assert.equal(st.uid, 0);
    assert.equal(st.mode & 0o777, 0o600, "only root may connect");
  });

  it("a program told to die with its parent dies when the parent is SIGKILLed", async () => {
    // A parent process of our own starts the launcher, and is then killed -9, as a daemon would be.
    const module = new URL("../../src/isolation/launcher.js", import.meta.url).href;
    const parentScript = `
      const { spawn } = await import("node:child_process");
      const { launcherPrefix } = await import(${JSON.stringify(module)});
      const [binary, ...args] = launcherPrefix({
        dieWithParent: true,
        confine: { uidBase: ${BASE}, runDir: ${JSON.stringify(runDir)} },
      });
      const child = spawn(binary, [...args, "/bin/sleep", "300"], { stdio: "ignore" });
      console.log(child.pid);
      setInterval(() => {}, 1000);
    `;
    const parent = spawn(process.execPath, ["--input-type=module", "-e", parentScript], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const childPid = Number(
      await new Promise<string>((resolve) =>
        parent.stdout.once("data", (d: Buffer) => resolve(d.toString())),
      ),
    );
    await waitFor("the confined sleep", 10_000, async () =>
      (await readFile(`/proc/${childPid}/comm`, "utf8").catch(() => "")).startsWith("sleep")
        ? true
        : undefined,
    );
    parent.kill("SIGKILL");
    // Gone, or a zombie nobody reaps (this host's PID 1 does not): either way no longer running.
    await waitFor("the confined program to die with its parent", 10_000, async () => {
      const stat = await readFile(`/proc/${childPid}/stat`, "utf8").catch(() => null);
      return stat === null || /^\d+ \(.*\) Z/.test(stat) ? true : undefined;
    });
  });

  it("the nft helper and other unconfined uses still run as root", async () => {
    const { stdout } = await run(launcherBinary(), ["--", "id", "-u"]);
    assert.equal(stdout.trim(), "0");
  });
});
