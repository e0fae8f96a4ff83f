/**
 * Build steps without host root, for real (bubblewrap, buildah, umoci, network namespaces, the tests' own
 * "internet"), no VM, with hostile templates:
 *   - a setuid-root file a `run` step leaves is, on the host, setuid to the build range's unprivileged id, in a
 *     directory no local user can enter; another local user who gets a copy of it with its owner and mode runs
 *     it as that id, never as root; the image keeps the file as the image made it;
 *   - a Dockerfile RUN that escapes buildah's chroot isolation with a double chroot ends in the build sandbox
 *     (the host's /usr read-only, buildah's own directories), as an id mapped to the range: it creates nothing
 *     on the host and sees no /etc/shadow or /root;
 *   - a networked step's read-only inputs (the machine's package configuration) are readable by a user other than
 *     the step's root, as apt's unprivileged _apt needs;
 *   - networked steps (`run` with network = true, a Dockerfile with network = true) reach the configured package
 *     index and nothing else: not another address of the internet, not the host's loopback services, not a
 *     service on the host's own address.
 * The sandbox's guest ports are covered with a real sandbox in test/net/build-step-network.test.ts.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { buildImage, parseTemplate, type Template } from "../../src/image/index.js";
import { buildIdRange } from "../../src/image/step-sandbox/identity.js";
import { forgetHostPackageIndexes } from "../../src/image/step-sandbox/indexes.js";
import { buildProbe } from "../support/hostile-programs.js";
import { runAsProbeUser } from "../support/other-user.js";
import {
  INTERNET_GATEWAY,
  INTERNET_HOSTS,
  startTestInternet,
  type TestInternet,
} from "../support/test-internet.js";
import { debugfsCat, debugfsStat } from "./helpers.js";
import { makeBusyboxLayout, saveArchive } from "./oci-fixtures.js";

const execFileAsync = promisify(execFile);
const isRoot = process.geteuid?.() === 0;

describe("build steps without host root", {
  skip: !isRoot && "image builds need root",
  timeout: 20 * 60_000,
}, () => {
  let dir: string;
  let cacheDir: string;
  let internet: TestInternet;
  let loopback: http.Server;
  let everywhere: http.Server;
  let hostAddress: string | undefined;
  const savedIndex = process.env.PIP_INDEX_URL;
  const range = buildIdRange();

  const template = async (
    name: string,
    body: string,
    files: Record<string, string> = {},
  ): Promise<Template> => {
    const tdir = path.join(dir, "t", name);
    await fs.mkdir(tdir, { recursive: true });
    await fs.cp(path.join(dir, "t", "layout"), path.join(tdir, "layout"), { recursive: true });
    await fs.copyFile(path.join(dir, "t", "probe"), path.join(tdir, "probe"));
    await fs.copyFile(path.join(dir, "t", "base.tar"), path.join(tdir, "base.tar"));
    for (const [file, text] of Object.entries(files)) await fs.writeFile(path.join(tdir, file), text);
    const file = path.join(tdir, "template.toml");
    const text = `format = 2\nname = "${name}"\nmemory_mib = 256\ndisk_mib = 256\n${body}`;
    await fs.writeFile(file, text);
    return parseTemplate(text, file);
  };
  const build = (t: Template) => buildImage(t, { cacheDir });

  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-step-sandbox-test-"));
    // The build range must pass through the image cache's parents (as it can through /var/cache).
    await fs.chmod(dir, 0o711);
    cacheDir = path.join(dir, "cache");
    const t = path.join(dir, "t");
    await fs.mkdir(t, { recursive: true });
    const layout = await makeBusyboxLayout(path.join(dir, "img"));
    await fs.cp(layout, path.join(t, "layout"), { recursive: true });
    await saveArchive(layout, "oci-archive", path.join(t, "base.tar"));
    await buildProbe(t);
    internet = await startTestInternet();
    const answer = (_req: http.IncomingMessage, res: http.ServerResponse) => res.end("from-the-host\n");
    loopback = http.createServer(answer);
    everywhere = http.createServer(answer);
    await new Promise<void>((resolve) => loopback.listen(0, "127.0.0.1", resolve));
    await new Promise<void>((resolve) => everywhere.listen(0, "0.0.0.0", resolve));
    hostAddress = Object.values(os.networkInterfaces())
      .flat()
      .find((i) => i && i.family === "IPv4" && !i.internal && !i.address.startsWith("198.51.100."))?.address;
    // The machine's pip configuration names the tests' index (PIP_INDEX_URL is pip's own setting).
    process.env.PIP_INDEX_URL = `http://${INTERNET_HOSTS.allowed}/simple`;
    forgetHostPackageIndexes();
  });

  after(async () => {
    if (savedIndex === undefined) delete process.env.PIP_INDEX_URL;
    else process.env.PIP_INDEX_URL = savedIndex;
    forgetHostPackageIndexes();
    loopback?.close();
    everywhere?.close();
    await internet?.stop();
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  test("a setuid-root file a run step leaves is never setuid root on the host", async () => {
    const t = await template(
      "setuid",
      `[from]
oci = "layout"
[[steps]]
copy = "probe"
dest = "/probe"
mode = "0755"
[[steps]]
run = "cp /probe /suid && chmod 4755 /suid && touch /ready && while [ ! -e /go ]; do sleep 0.1; done; rm /go /ready"
timeout_s = 120
`,
    );
    const building = build(t);
    building.catch(() => {});
    // While the step runs: the file, as the host has it.
    const onDisk = await (async () => {
      for (const deadline = Date.now() + 60_000; Date.now() < deadline; ) {
        for (const name of await fs.readdir(cacheDir).catch(() => [] as string[])) {
          if (!name.startsWith(".staging-")) continue;
          const tree = path.join(cacheDir, name, "work", "bundle", "rootfs");
          if (await fs.stat(path.join(tree, "ready")).catch(() => undefined)) return path.join(tree, "suid");
        }
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error("the step never made /suid");
    })();
    const st = await fs.stat(onDisk);
    assert.ok((st.mode & 0o4000) !== 0, "the step's setuid bit is kept");
    assert.equal(st.uid, range.base, "owned by the build range's root, not by the host's");
    const direct = await runAsProbeUser([onDisk, "euid"]);
    assert.notEqual(direct.code, 0, `another local user reached the build's tree: ${JSON.stringify(direct)}`);
    assert.doesNotMatch(direct.stdout, /euid=0/);
    // Even a copy with its owner and mode, where that user can reach it, runs as the unprivileged id.
    const exposed = path.join(dir, "exposed");
    await fs.mkdir(exposed, { mode: 0o755 });
    await execFileAsync("cp", ["-p", onDisk, path.join(exposed, "suid")]);
    const copied = await runAsProbeUser([path.join(exposed, "suid"), "euid"]);
    assert.equal(copied.code, 0, copied.stderr);
    assert.equal(copied.stdout.trim(), `euid=${range.base}`);
    await fs.writeFile(path.join(path.dirname(onDisk), "go"), "");
    const built = await building;
    // Inside the image it is what the image made: setuid root (the guest's business).
    assert.deepEqual(await debugfsStat(built.rootfs, "/suid"), { uid: 0, mode: 0o4755 });
  });

  test("a double chroot in a Dockerfile RUN ends in the build sandbox, not on the host", async () => {
    const marker = path.join(dir, `escaped-${process.pid}`);
    const t = await template("escape", '[dockerfile]\nfile = "Dockerfile"\n', {
      Dockerfile: `FROM oci-archive:base.tar
COPY probe /probe
RUN /probe escape ${marker} > /escape.txt 2>&1; cat /escape.txt
`,
    });
    const built = await build(t);
    const report = await debugfsCat(built.rootfs, "/escape.txt");
    assert.equal(
      await fs.stat(marker).catch(() => undefined),
      undefined,
      `the host got ${marker}:\n${report}`,
    );
    assert.match(
      report,
      /probe: create .*: (No such file or directory|Read-only file system|Permission denied)/,
    );
    assert.match(report, /probe: \/etc\/shadow absent/);
    assert.match(report, /probe: \/root absent/);
    assert.match(report, new RegExp(`probe: uid_map\\s+0\\s+${range.base}\\s+${range.count}`), report);
  });

  test("a networked step's inputs are readable by every user of the image, as apt's _apt reads keyrings", async () => {
    // The package configuration (sources, keyrings, CA bundle) is bound under /run/forkd-build; apt's gpgv runs
    // as _apt and failed with NO_PUBKEY while that directory was root's 0700. Here the step's user is not root.
    const check =
      'cd /run/forkd-build/packages && echo listed; for f in $(find . -type f); do test -r "$f" || echo "unreadable $f"; done; id -u';
    const built = await build(
      await template(
        "inputs-user",
        `[from]
oci = "layout"
[[steps]]
adduser = "user"
[[steps]]
user = "user"
[[steps]]
run = '''(${check}) > /home/user/inputs.txt 2>&1'''
network = true
`,
      ),
    );
    assert.deepEqual((await debugfsCat(built.rootfs, "/home/user/inputs.txt")).trim().split("\n"), [
      "listed",
      "1000",
    ]);
  });

  test("networked steps reach the configured package index and nothing else", async () => {
    const loopPort = (loopback.address() as AddressInfo).port;
    const anyPort = (everywhere.address() as AddressInfo).port;
    const targets: [string, string, number][] = [
      ["index", INTERNET_HOSTS.allowed, 80],
      ["other-internet", INTERNET_HOSTS.denied, 80],
      ["host-loopback", "127.0.0.1", loopPort],
      ["host-gateway", INTERNET_GATEWAY, anyPort],
      ...(hostAddress ? [["host-address", hostAddress, anyPort] as [string, string, number]] : []),
    ];
    // busybox's nc; the answer's first bytes tell who answered.
    const probe = targets
      .map(
        ([name, ip, port]) =>
          `if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${ip} ${port} | grep -q 'HTTP/1'; then echo ${name}=reachable; else echo ${name}=unreachable; fi`,
      )
      .join("; ");
    const expected = targets.map(([name]) => `${name}=${name === "index" ? "reachable" : "unreachable"}`);
    const run = await build(
      await template(
        "net-run",
        `[from]
oci = "layout"
[[steps]]
run = '''(${probe}) > /net.txt'''
network = true
[[steps]]
run = '''(${probe}) > /none.txt'''
`,
      ),
    );
    assert.deepEqual((await debugfsCat(run.rootfs, "/net.txt")).trim().split("\n"), expected);
    assert.deepEqual(
      (await debugfsCat(run.rootfs, "/none.txt")).trim().split("\n"),
      targets.map(([name]) => `${name}=unreachable`),
      "a step without network reaches nothing",
    );
    const docker = await build(
      await template("net-dockerfile", '[dockerfile]\nfile = "Dockerfile"\nnetwork = true\n', {
        Dockerfile: `FROM oci-archive:base.tar\nRUN (${probe}) > /net.txt\n`,
      }),
    );
    assert.deepEqual((await debugfsCat(docker.rootfs, "/net.txt")).trim().split("\n"), expected);
  });
});
