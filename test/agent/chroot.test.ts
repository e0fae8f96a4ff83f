/**
 * The bundle under the guest's own userspace (Debian bookworm: Node 18, python3 + numpy), entered with chroot
 * on the host: koffi's binary and the libc bindings load, and the agent serves exec/eval through AgentClient.
 * /proc is mounted inside a private mount namespace (unshare), so nothing stays mounted after a crash.
 *
 * Needs the dev artefact /tmp/proto/rootfs (or FORKD_GUEST_ROOTFS) and root; skipped with a message otherwise.
 * The real-VM integration tests cover the guest in CI.
 */
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { Duplex } from "node:stream";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { AgentClient } from "../../src/agent/host/client.js";
import { repoRoot } from "./harness.js";

const rootfs = process.env.FORKD_GUEST_ROOTFS ?? "/tmp/proto/rootfs";
const skip = !existsSync(path.join(rootfs, "usr/bin/node"))
  ? `no guest root filesystem at ${rootfs} (a dev artefact; set FORKD_GUEST_ROOTFS to one with nodejs and python3)`
  : process.getuid?.() !== 0
    ? "chroot needs root"
    : false;

const guestDir = `/opt/forkd-test-${process.pid}`;
const hostDir = path.join(rootfs, guestDir);
const env = { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" };

/** argv that runs `command` chrooted into the rootfs with a private /proc. */
function inGuest(command: string[]): [string, string[]] {
  const script = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"';
  return ["unshare", ["--mount", "--propagation", "private", "--", "sh", "-c", script, rootfs, ...command]];
}

describe("agent bundle in the guest userspace (chroot)", { skip }, () => {
  before(async () => {
    await promisify(execFile)(process.execPath, [
      path.join(repoRoot(), "scripts/bundle-guest.mjs"),
      "--out",
      hostDir,
    ]);
    await writeFile(
      path.join(hostDir, "template.json"),
      JSON.stringify({ name: "bookworm", interpreter: "python" }),
    );
  });
  after(() => rm(hostDir, { recursive: true, force: true }));

  it("loads koffi and binds libc under the guest's Node 18 without changing anything", async () => {
    const [file, args] = inGuest(["/usr/bin/node", `${guestDir}/agent.mjs`, "--self-test"]);
    // fd 40 is inherited without close-on-exec on purpose: the self-test must mark it. (Node itself already
    // marks fd 3 at startup, so a low descriptor would prove nothing.)
    const stdio: ("ignore" | "pipe")[] = [
      "ignore",
      "pipe",
      "pipe",
      ...Array<"ignore">(37).fill("ignore"),
      "pipe",
    ];
    const child = spawn(file, args, { env, stdio });
    let stdout = "";
    let stderr = "";
    child.stdout?.on("data", (d: Buffer) => {
      stdout += d;
    });
    child.stderr?.on("data", (d: Buffer) => {
      stderr += d;
    });
    const code = await new Promise((resolve) => child.on("close", resolve));
    assert.equal(code, 0, stderr);
    const report = JSON.parse(stdout);
    const koffiVersion = JSON.parse(
      readFileSync(path.join(repoRoot(), "node_modules/koffi/package.json"), "utf8"),
    ).version;
    assert.match(report.node, /^v18\./);
    assert.equal(report.koffi, koffiVersion);
    assert.ok(BigInt(report.realtimeNs) > 1_600_000_000n * 1_000_000_000n);
    assert.equal(report.settimeProbeErrno, 22, "clock_settime(CLOCK_MONOTONIC) must fail with EINVAL");
    assert.equal(
      report.addEntropyProbeErrno,
      22,
      "RNDADDENTROPY with a negative count must fail with EINVAL",
    );
    assert.ok(report.closeOnExec.includes(40), `fd 40 not marked: ${JSON.stringify(report.closeOnExec)}`);
  });

  it("serves eval with numpy and exec under Node 18", async () => {
    const [file, args] = inGuest([
      "/usr/bin/node",
      `${guestDir}/agent.mjs`,
      "--stdio",
      "--template",
      `${guestDir}/template.json`,
    ]);
    const child = spawn(file, args, { env, stdio: ["pipe", "pipe", "pipe"] });
    let stderr = "";
    child.stderr?.on("data", (d: Buffer) => {
      stderr += d;
    });
    const client = new AgentClient(Duplex.from({ readable: child.stdout, writable: child.stdin }));
    try {
      const hello = await client.waitHello({ signal: AbortSignal.timeout(20_000) });
      assert.equal(hello.template, "bookworm");
      const warm = await client.warmup("import numpy", { timeoutMs: 60_000 });
      assert.equal(warm.error, null, JSON.stringify(warm.error));
      assert.equal(warm.warm, "warm");
      const out = await client.eval("print(numpy.__version__)\nint(numpy.arange(4).sum())");
      assert.equal(out.result, "6");
      assert.match(out.stdout, /^1\./);
      const exec = await client.exec(["sh", "-c", "ls /proc/self/fd; echo $0"], { cwd: "/" });
      assert.deepEqual(
        exec.stdout.toString().trim().split(/\s+/),
        ["0", "1", "2", "3", "sh"],
        "exec'd processes see only their own stdio",
      );
    } catch (err) {
      throw new Error(`${(err as Error).message}\nagent stderr:\n${stderr}`);
    } finally {
      client.close();
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("close", resolve));
    }
  });
});
