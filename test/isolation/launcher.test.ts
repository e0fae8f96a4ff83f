/**
 * forkd-launcher, the real binary (dist/forkd-launcher): its argv is validated before any step runs, it joins
 * or creates a network namespace, writes net.* sysctls only there, and leaves the tap open at the fd it was
 * told, then execs the program with its own pid.
 */
import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import { promisify } from "node:util";
import { launcherBinary, launcherPrefix } from "../../src/isolation/launcher.js";

const run = promisify(execFile);
const root = process.getuid?.() === 0;

function launch(args: string[]) {
  return spawnSync(launcherBinary(), args, { encoding: "utf8" });
}

describe("forkd-launcher", () => {
  it("refuses a bad argv before doing anything, with exit 125 and the reason", () => {
    const cases: [string[], RegExp][] = [
      [["--tap", "tap0", "--", "true"], /--tap and --tap-fd go together/],
      [["--tap", "tap0", "--tap-fd", "4", "--", "true"], /--tap needs --netns or --new-netns/],
      [["--netns", "/etc/passwd", "--", "true"], /must be \/run\/netns\/<name>/],
      [["--netns", "/run/netns/../../etc", "--", "true"], /must be \/run\/netns\/<name>/],
      [["--new-netns", "--sysctl", "kernel.panic=1", "--", "true"], /must be net\./],
      [["--sysctl", "net.ipv4.ip_forward=1", "--", "true"], /never changes the host's settings/],
      [["--new-netns", "--tap", "tap0", "--tap-fd", "2", "--", "true"], /integer in 3\.\.1023/],
      [["--new-netns", "--tap", "x".repeat(16), "--tap-fd", "4", "--", "true"], /at most 15/],
      [["--frobnicate", "--", "true"], /unknown argument "--frobnicate"/],
      [["--new-netns"], /no program given/],
      [["--new-netns", "--", "../sh"], /absolute path or a plain command name/],
      [["--new-netns", "--tap", "tap0", "--tap-fd", "4", "--keep-fd", "4", "--", "true"], /also a --keep-fd/],
    ];
    for (const [args, message] of cases) {
      const result = launch(args);
      assert.equal(result.status, 125, `${args.join(" ")}: ${result.stderr}`);
      assert.match(result.stderr, /^forkd-launcher: arguments: /);
      assert.match(result.stderr, message, args.join(" "));
    }
  });

  it("the TypeScript side validates the same way", () => {
    assert.throws(() => launcherPrefix({ netns: { join: "/tmp/x" } }), /not \/run\/netns/);
    assert.throws(
      () => launcherPrefix({ tap: { name: "tap0", fd: 4, vnetHdr: false } }),
      /needs a network namespace/,
    );
    assert.throws(() => launcherPrefix({ netns: "new", sysctls: { "kernel.x": 1 } }), /net\.\* key/);
    assert.deepEqual(
      launcherPrefix({ netns: "new", tap: { name: "tap0", fd: 4, vnetHdr: true } }, "/l").slice(1),
      ["--new-netns", "--tap", "tap0", "--tap-fd", "4", "--tap-vnet-hdr", "--"],
    );
  });

  it("execs the program with its own pid and environment", async () => {
    const { stdout } = await run(launcherBinary(), ["--", "sh", "-c", 'echo "$$ $FORKD_LAUNCHER_TEST"'], {
      env: { ...process.env, FORKD_LAUNCHER_TEST: "kept" },
    });
    assert.match(stdout, /^\d+ kept\n$/);
  });

  it("opens a tap in a fresh namespace at the fd it was given", { skip: !root && "needs root" }, async () => {
    const script =
      "cat /proc/self/fdinfo/5 | grep '^iff:'; ip -o link show tap0 | cut -d' ' -f2; " +
      "cat /proc/sys/net/ipv4/ip_forward; readlink /proc/self/ns/net";
    const { stdout } = await run(launcherBinary(), [
      ...launcherPrefix(
        { netns: "new", sysctls: { "net.ipv4.ip_forward": 1 }, tap: { name: "tap0", fd: 5, vnetHdr: true } },
        launcherBinary(),
      ).slice(1),
      "sh",
      "-c",
      script,
    ]);
    const [iff, link, forward, ownNs] = stdout.trim().split("\n");
    const hostNs = (await run("readlink", ["/proc/self/ns/net"])).stdout.trim();
    assert.match(iff ?? "", /^iff:\s+tap0$/, stdout);
    assert.equal(link, "tap0:");
    assert.equal(forward, "1", "sysctl written inside the new namespace");
    assert.notEqual(ownNs, hostNs, "the program runs in a namespace of its own");
  });

  it("passes on only the fds it keeps (and the tap), whatever it inherited", {
    skip: !root && "needs root",
  }, () => {
    // fds 3, 4 and 5 are open pipes in the launcher; 3 is kept, 4 is replaced by the tap, 5 is closed at exec.
    const result = spawnSync(
      launcherBinary(),
      [
        "--new-netns",
        "--tap",
        "tap0",
        "--tap-fd",
        "4",
        "--keep-fd",
        "3",
        "--",
        "sh",
        "-c",
        "for fd in 3 4 5; do printf '%s ' $fd; readlink /proc/self/fd/$fd || echo closed; done",
      ],
      { stdio: ["ignore", "pipe", "pipe", "pipe", "pipe", "pipe"], encoding: "utf8" },
    );
    assert.equal(result.status, 0, result.stderr);
    const lines = result.stdout.trim().split("\n");
    assert.match(lines[0] ?? "", /^3 (pipe|socket):/, result.stdout);
    assert.equal(lines[1], "4 /dev/net/tun");
    assert.equal(lines[2], "5 closed");
  });

  it("joins a named namespace", { skip: !root && "needs root" }, async () => {
    const name = `fkt-launch-${process.pid}`;
    await run("ip", ["netns", "add", name]);
    try {
      await run("ip", ["-n", name, "link", "add", "probe0", "type", "bridge"]);
      const { stdout } = await run(launcherBinary(), [
        "--netns",
        `/run/netns/${name}`,
        "--",
        "ip",
        "-o",
        "link",
      ]);
      assert.match(stdout, /probe0/);
      const missing = launch(["--netns", "/run/netns/fkt-no-such-ns", "--", "true"]);
      assert.equal(missing.status, 125);
      assert.match(missing.stderr, /^forkd-launcher: netns: open \/run\/netns\/fkt-no-such-ns/);
    } finally {
      await run("ip", ["netns", "del", name]);
    }
  });
});
