/**
 * "Any image": the agent binary in a root filesystem that has no Node.js, no Python and no libc: a tree the
 * test builds from Debian's static busybox, with its own /etc/passwd. Entered with chroot inside a private
 * mount namespace (unshare), with its own /proc and a new devpts instance, so nothing stays mounted after a
 * crash. The self-test's system calls, exec, users, files, a pty and a process started with proc.start must
 * all work there.
 *
 * Needs root and /bin/busybox (busybox-static, installed by scripts/install-deps.sh).
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, copyFile, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Duplex } from "node:stream";
import { after, before, describe, it } from "node:test";
import { AgentClient } from "../../src/agent/host/client.js";
import { agentBinary, buildAgent } from "./harness.js";

const BUSYBOX = "/bin/busybox";
const skip = !existsSync(BUSYBOX)
  ? `no ${BUSYBOX} (install busybox-static: scripts/install-deps.sh)`
  : process.getuid?.() !== 0
    ? "chroot needs root"
    : false;

const APPLETS = ["sh", "cat", "echo", "ls", "id", "true", "sleep", "stty", "tty", "pwd", "env", "wc"];

let guest: string;
let root: string;

/** argv that runs `command` chrooted into the root with a private /proc and devpts. */
function inRoot(command: string[]): [string, string[]] {
  const script = [
    'mount -t proc proc "$0/proc"',
    'mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$0/dev/pts"',
    'mount --bind "$0/dev/pts/ptmx" "$0/dev/ptmx"',
    'mount --bind /dev/urandom "$0/dev/urandom"',
    'exec chroot "$0" "$@"',
  ].join(" && ");
  return ["unshare", ["--mount", "--propagation", "private", "--", "sh", "-c", script, root, ...command]];
}

describe("the agent in a root with no Node, no Python and no libc (busybox chroot)", { skip }, () => {
  before(async () => {
    guest = await buildAgent();
    root = await mkdtemp(path.join(os.tmpdir(), "forkd-busybox-root-"));
    await chmod(root, 0o755); // a user other than root must be able to reach /bin, as in any image
    for (const d of ["bin", "etc", "proc", "dev/pts", "tmp", "home/user", "opt/forkd"]) {
      await mkdir(path.join(root, d), { recursive: true });
    }
    await copyFile(BUSYBOX, path.join(root, "bin/busybox"));
    await chmod(path.join(root, "bin/busybox"), 0o755);
    for (const applet of APPLETS) await symlink("busybox", path.join(root, "bin", applet));
    await writeFile(path.join(root, "dev/ptmx"), "");
    await writeFile(path.join(root, "dev/urandom"), "");
    await chmod(path.join(root, "tmp"), 0o1777);
    await copyFile(agentBinary(guest), path.join(root, "opt/forkd/forkd-agent"));
    await chmod(path.join(root, "opt/forkd/forkd-agent"), 0o755);
    await writeFile(
      path.join(root, "opt/forkd/template.json"),
      JSON.stringify({ name: "busybox", interpreter: "none" }),
    );
    await writeFile(
      path.join(root, "etc/passwd"),
      "root:x:0:0:root:/:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
    );
    await writeFile(path.join(root, "etc/group"), "root:x:0:\nuser:x:1000:\nextra:x:2000:user\n");
    const { chown } = await import("node:fs/promises");
    await chown(path.join(root, "home/user"), 1000, 1000);
  });
  after(async () => {
    if (root) await rm(root, { recursive: true, force: true });
    if (guest) await rm(path.dirname(guest), { recursive: true, force: true });
  });

  it("has nothing but busybox and the agent", async () => {
    const bin = await readdir(path.join(root, "bin"));
    assert.ok(!bin.some((name) => /node|python/.test(name)));
    assert.ok(!existsSync(path.join(root, "lib")) && !existsSync(path.join(root, "usr")), "no libc, no /usr");
  });

  it("passes the self-test there and marks an inherited descriptor close-on-exec", async () => {
    const [file, args] = inRoot(["/opt/forkd/forkd-agent", "--self-test"]);
    const stdio: ("ignore" | "pipe")[] = [
      "ignore",
      "pipe",
      "pipe",
      ...Array<"ignore">(37).fill("ignore"),
      "pipe",
    ];
    const child = spawn(file, args, { stdio });
    let stdout = "";
    let stderr = "";
    child.stdout?.on("data", (d: Buffer) => (stdout += d));
    child.stderr?.on("data", (d: Buffer) => (stderr += d));
    const code = await new Promise((resolve) => child.on("close", resolve));
    assert.equal(code, 0, stderr);
    const report = JSON.parse(stdout);
    assert.match(report.go, /^go1\./);
    assert.ok(BigInt(report.realtimeNs) > 1_600_000_000n * 1_000_000_000n);
    assert.equal(report.settimeProbeErrno, 22, "clock_settime(CLOCK_MONOTONIC) must fail with EINVAL");
    assert.equal(
      report.addEntropyProbeErrno,
      22,
      "RNDADDENTROPY with a negative count must fail with EINVAL",
    );
    assert.equal(report.sethostnameProbeErrno, 22, "sethostname with 65 bytes must fail with EINVAL");
    assert.ok(report.closeOnExec.includes(40), `fd 40 not marked: ${JSON.stringify(report.closeOnExec)}`);
  });

  it("serves exec, users, files, a pty and proc.start", async () => {
    const [file, args] = inRoot([
      "/opt/forkd/forkd-agent",
      "--stdio",
      "--template",
      "/opt/forkd/template.json",
    ]);
    const child = spawn(file, args, {
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr?.on("data", (d: Buffer) => (stderr += d));
    const client = new AgentClient(Duplex.from({ readable: child.stdout, writable: child.stdin }));
    try {
      const hello = await client.waitHello({ signal: AbortSignal.timeout(20_000) });
      assert.equal(hello.template, "busybox");
      assert.equal(hello.interpreter, "none");
      const exec = await client.exec(["sh", "-c", "ls /proc/self/fd; echo $0"], { cwd: "/" });
      assert.deepEqual(exec.stdout.toString().trim().split(/\s+/), ["0", "1", "2", "3", "sh"]);
      const who = await client.exec(["sh", "-c", 'echo "$(id -u) $(id -G) $HOME $(pwd) $SHELL"'], {
        user: "user",
      });
      assert.equal(who.stdout.toString(), "1000 1000 2000 /home/user /home/user /bin/sh\n");
      await client.files.write("/home/user/notes/a.txt", "hi", { user: "user" });
      const info = await client.files.stat("/home/user/notes/a.txt");
      assert.equal(info.owner, "user");
      assert.equal(info.group, "user");
      let screen = "";
      const shell = client.procs.start(["sh"], { pty: { cols: 90, rows: 30 }, onPty: (d) => (screen += d) });
      const pid = await shell.pid;
      await client.procs.input({ pid }, "stty size; exit 0\n");
      assert.equal((await shell.done).exitCode, 0);
      assert.match(screen, /30 90/);
      await assert.rejects(client.eval("1"), /no interpreter/);
    } catch (err) {
      throw new Error(`${(err as Error).message}\nagent stderr:\n${stderr}`);
    } finally {
      client.close();
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("close", resolve));
    }
  });
});
