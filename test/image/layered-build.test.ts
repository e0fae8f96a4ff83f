/**
 * Format-2 builds for real (skopeo, umoci, bubblewrap, mkfs), no VM: a busybox image made from a directory in
 * the test, as an OCI layout, an OCI archive and a Docker archive; build steps, their cache, their sandbox;
 * hostile layers. Results are read out of the built ext4 image with debugfs.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { type BuildProgressEvent, buildImage, parseTemplate, type Template } from "../../src/image/index.js";
import { checkLayers } from "../../src/image/layer-check.js";
import { resolveImage } from "../../src/image/oci-layout.js";
import { debugfsCat, debugfsStat } from "./helpers.js";
import { makeBusyboxLayout, makeRawLayout, plausibleBase, rawTar, saveArchive } from "./oci-fixtures.js";

const isRoot = process.geteuid?.() === 0;

let dir: string;
let cacheDir: string;
let layout: string;

before(async () => {
  if (!isRoot) return;
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-layered-test-"));
  // Build steps run as the unprivileged build range, which must pass through the image cache's parents.
  await fs.chmod(dir, 0o711);
  cacheDir = path.join(dir, "cache");
  const t = path.join(dir, "t");
  await fs.mkdir(t);
  layout = await makeBusyboxLayout(path.join(dir, "img"));
  await fs.cp(layout, path.join(t, "layout"), { recursive: true });
  await saveArchive(layout, "oci-archive", path.join(t, "image-oci.tar"));
  await saveArchive(layout, "docker-archive", path.join(t, "image-docker.tar"));
  await fs.mkdir(path.join(t, "app", "sub"), { recursive: true });
  await fs.writeFile(path.join(t, "app", "hello.txt"), "hello v1\n");
  await fs.writeFile(path.join(t, "app", "sub", "tool.sh"), "#!/bin/sh\necho tool\n", { mode: 0o755 });
});

after(async () => {
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

async function template(name: string, body: string): Promise<Template> {
  const file = path.join(dir, "t", `${name}.toml`);
  const text = `format = 2\nname = "${name}"\nmemory_mib = 256\ndisk_mib = 256\n${body}`;
  await fs.writeFile(file, text);
  return parseTemplate(text, file);
}

async function build(t: Template, events?: BuildProgressEvent[]) {
  return buildImage(t, { cacheDir, onProgress: (e) => events?.push(e) });
}

async function cacheLeftovers(): Promise<string[]> {
  return (await fs.readdir(cacheDir).catch(() => [] as string[])).filter((n) => n.startsWith(".staging-"));
}

describe("format-2 builds", { skip: !isRoot && "image builds need root" }, () => {
  test("an OCI layout, an OCI archive and a Docker archive make the same image, with the image's settings", async () => {
    const trees: string[] = [];
    for (const [kind, from] of [
      ["layout", 'oci = "layout"\nref = "latest"'],
      ["oci", 'archive = "image-oci.tar"'],
      ["docker", 'archive = "image-docker.tar"'],
    ] as const) {
      const built = await build(await template(`from-${kind}`, `[from]\n${from}\n`));
      assert.equal(built.steps?.[0]?.cached, false, `${kind}: the base was made, not taken from the cache`);
      const passwd = await debugfsCat(built.rootfs, "/etc/passwd");
      assert.match(passwd, /^app:x:4242:4242:/m, kind);
      assert.match(passwd, /^user:x:1000:1000:/m, `${kind}: E2B's default user was added`);
      const agent = await debugfsStat(built.rootfs, "/opt/forkd/forkd-agent");
      assert.equal(agent.mode & 0o111, 0o111, `${kind}: the agent is executable`);
      const settings = JSON.parse(await debugfsCat(built.rootfs, "/opt/forkd/template.json"));
      assert.deepEqual(settings.env, { PATH: "/bin", GREETING: "hello" }, kind);
      assert.equal(settings.interpreter, "none");
      trees.push(await debugfsCat(built.rootfs, "/bin/busybox").then((b) => String(b.length)));
    }
    assert.equal(new Set(trees).size, 1);
  });

  test("steps apply in order and each is cached by everything before it: a changed step 3 rebuilds from step 3", async () => {
    const body = (content: string) => `[from]
oci = "layout"
[[steps]]
env = { APP_MODE = "prod" }
[[steps]]
workdir = "/srv"
[[steps]]
copy = "app"
dest = "/srv/app"
[[steps]]
run = "echo built-$APP_MODE-$GREETING > built.txt && cat app/hello.txt >> built.txt"
[[steps]]
user = "app"
[[steps]]
run = "id -u > /home/app/uid && echo $HOME > /home/app/home"
# ${content}
`;
    await fs.writeFile(path.join(dir, "t", "app", "hello.txt"), "hello v1\n");
    const first = await build(await template("steps", body("a")));
    // The base is the same image the first test made (same manifest digest): cached; every step runs.
    assert.deepEqual(
      first.steps?.map((s) => s.cached),
      [true, false, false, false, false, false, false],
    );
    assert.equal(await debugfsCat(first.rootfs, "/srv/built.txt"), "built-prod-hello\nhello v1\n");
    assert.equal(await debugfsCat(first.rootfs, "/home/app/uid"), "4242\n");
    assert.equal(await debugfsCat(first.rootfs, "/home/app/home"), "/home/app\n");
    assert.equal((await debugfsStat(first.rootfs, "/home/app/uid")).uid, 4242, "written as the image's user");
    assert.equal((await debugfsStat(first.rootfs, "/srv/app/sub/tool.sh")).mode & 0o777, 0o755);
    const settings = JSON.parse(await debugfsCat(first.rootfs, "/opt/forkd/template.json"));
    assert.equal(settings.workdir, "/srv");
    assert.equal(settings.env.APP_MODE, "prod");
    assert.equal(first.manifest.settings?.user, "app");

    // A comment changes nothing: the same image, from the cache, without running a step.
    const again = await build(await template("steps", body("b")));
    assert.equal(again.hash, first.hash);
    assert.equal(again.cached, true);

    // The file step 3 copies changes: base and steps 1-2 are reused, 3 and everything after it run again.
    await fs.writeFile(path.join(dir, "t", "app", "hello.txt"), "hello v2\n");
    const events: BuildProgressEvent[] = [];
    const changed = await build(await template("steps", body("a")), events);
    assert.notEqual(changed.hash, first.hash);
    assert.deepEqual(
      changed.steps?.map((s) => [s.number, s.cached]),
      [
        [0, true],
        [1, true],
        [2, true],
        [3, false],
        [4, false],
        [5, false],
        [6, false],
      ],
    );
    assert.equal(await debugfsCat(changed.rootfs, "/srv/built.txt"), "built-prod-hello\nhello v2\n");
    const timings = events.find((e) => e.steps)?.steps;
    assert.ok(timings && timings.length === 7, "the build reports every step's timing");
    assert.ok(events.some((e) => /step 3\/6: copy app -> \/srv\/app \([0-9.]+ s\)/.test(e.message)));
    assert.ok(events.some((e) => /step 2\/6: workdir \/srv \(cached\)/.test(e.message)));

    // --force uses no cached step: the base is fetched again and every step runs.
    const forced = await buildImage(await template("steps", body("a")), { cacheDir, force: true });
    assert.deepEqual(
      forced.steps?.map((s) => s.cached),
      [false, false, false, false, false, false, false],
    );
    assert.equal(await debugfsCat(forced.rootfs, "/srv/built.txt"), "built-prod-hello\nhello v2\n");
  });

  test("a failing step names itself and the tail of its output; nothing half-published, earlier steps kept", async () => {
    const t = await template(
      "failing",
      `[from]
oci = "layout"
[[steps]]
run = "echo step-one-ran > /one"
[[steps]]
run = "echo line-before; echo boom-on-stderr >&2; exit 3"
[[steps]]
run = "echo never"
`,
    );
    const imagesBefore = (await fs.readdir(cacheDir)).filter((n) => /^[0-9a-f]{64}$/.test(n)).length;
    await assert.rejects(build(t), (err: unknown) => {
      assert.ok(err instanceof ForkdError);
      assert.equal(err.code, "unprocessable", "the template's command failed, not forkd");
      assert.match(err.message, /step 2\/3: run echo line-before/);
      assert.match(err.message, /exit status 3/);
      assert.match(err.message, /line-before/);
      assert.match(err.message, /boom-on-stderr/);
      return true;
    });
    const imagesAfter = (await fs.readdir(cacheDir)).filter((n) => /^[0-9a-f]{64}$/.test(n)).length;
    assert.equal(imagesAfter, imagesBefore, "no image was published");
    assert.deepEqual(await cacheLeftovers(), [], "the staging directory is gone");
    // Step 1 succeeded and stays cached: a rebuild starts at the failed step.
    const events: BuildProgressEvent[] = [];
    await assert.rejects(build(t, events));
    assert.ok(events.some((e) => /step 1\/3: run echo step-one-ran > \/one \(cached\)/.test(e.message)));
  });

  test("run steps are sandboxed: no host network even when asked, own PID namespace, no mknod", async () => {
    let requests = 0;
    const server = http.createServer((_req, res) => {
      requests++;
      res.end("from-the-host\n");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as AddressInfo).port;
    try {
      // busybox's own nc (its static wget cannot resolve anything, not even an address literal)
      const probe = (file: string) =>
        `if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 127.0.0.1 ${port} | grep -q from-the-host; then echo reachable > ${file}; else echo unreachable > ${file}; fi`;
      const built = await build(
        await template(
          "sandbox",
          `[from]
oci = "layout"
[[steps]]
run = '''${probe("/net-default")}'''
[[steps]]
run = '''${probe("/net-host")}'''
network = true
[[steps]]
run = "ls /proc | grep -c '^[0-9]' > /pids; if mknod /tmp/n c 1 3 2>/dev/null; then echo yes; else echo no; fi > /mknod; hostname > /host"
`,
        ),
      );
      assert.equal(await debugfsCat(built.rootfs, "/net-default"), "unreachable\n");
      // A networked step reaches the configured package indexes only (test/image/step-sandbox.test.ts).
      assert.equal(await debugfsCat(built.rootfs, "/net-host"), "unreachable\n");
      assert.equal(requests, 0, "no step reached the host's loopback");
      assert.ok(Number(await debugfsCat(built.rootfs, "/pids")) <= 5, "a private PID namespace");
      assert.equal(await debugfsCat(built.rootfs, "/mknod"), "no\n");
      assert.equal(await debugfsCat(built.rootfs, "/host"), "forkd-build\n");
    } finally {
      server.close();
    }
  });

  test("interpreter = python needs a python3 in the image", async () => {
    const file = path.join(dir, "t", "nopython.toml");
    const text =
      'format = 2\nname = "nopython"\ninterpreter = "python"\nmemory_mib = 256\ndisk_mib = 256\n[from]\noci = "layout"\n';
    await fs.writeFile(file, text);
    await assert.rejects(
      build(await parseTemplate(text, file)),
      /interpreter = "python", but the image has no python3/,
    );
  });
});

describe("hostile layers", { skip: !isRoot && "needs root" }, () => {
  const cases: [string, Parameters<typeof rawTar>[0], RegExp][] = [
    ["path escape", [{ path: "../../evil", type: "File", body: "x" }], /"\.\." in path \(path escape\)/],
    ["absolute path", [{ path: "/etc/evil", type: "File", body: "x" }], /absolute path \(path escape\)/],
    [
      "write through a symlink",
      [
        { path: "etc/hostdir", type: "SymbolicLink", linkpath: "/" },
        { path: "etc/hostdir/evil", type: "File", body: "x" },
      ],
      /written through the symlink \/etc\/hostdir/,
    ],
    [
      "symlink out of the root",
      [{ path: "etc/up", type: "SymbolicLink", linkpath: "../../../../host" }],
      /climbs above the image's root \(symlink out\)/,
    ],
    [
      "device node outside /dev",
      [{ path: "tmp/disk", type: "BlockDevice", devmaj: 8, devmin: 0 }],
      /block device outside \/dev/,
    ],
    [
      "hard link out of the image",
      [{ path: "etc/shadow-copy", type: "Link", linkpath: "../../etc/shadow" }],
      /"\.\." in path/,
    ],
    [
      "hard link to something that is not a file of the image",
      [{ path: "etc/x", type: "Link", linkpath: "etc/not-there" }],
      /not a regular file of the image/,
    ],
  ];
  for (const [name, entries, rule] of cases) {
    test(`refused: ${name}`, async () => {
      const l = await makeRawLayout(path.join(dir, `hostile-${name.replaceAll(" ", "-")}`), [
        plausibleBase(),
        rawTar(entries),
      ]);
      const image = await resolveImage(l, "latest");
      await assert.rejects(checkLayers(l, image.manifest.layers), (err: unknown) => {
        assert.ok(err instanceof ForkdError && err.code === "unprocessable", String(err));
        assert.match(err.message, /layer 2 of 2/);
        assert.match(err.message, rule);
        return true;
      });
    });
  }

  test("allowed: devices under /dev, whiteouts, absolute symlinks, links within the root", async () => {
    const l = await makeRawLayout(path.join(dir, "honest"), [
      plausibleBase(),
      rawTar([
        { path: "dev/null", type: "CharacterDevice", devmaj: 1, devmin: 3 },
        { path: "etc/.wh.passwd", type: "File" },
        { path: "etc/passwd", type: "File", body: "root:x:0:0::/root:/bin/sh\n" },
        { path: "etc/alt", type: "SymbolicLink", linkpath: "/usr/bin/thing" },
        { path: "usr/lib/x/libz.so", type: "SymbolicLink", linkpath: "../../../lib/libz.so.1" },
        { path: "etc/passwd-", type: "Link", linkpath: "etc/passwd" },
      ]),
    ]);
    const image = await resolveImage(l, "latest");
    const report = await checkLayers(l, image.manifest.layers);
    assert.equal(report.layers, 2);
  });

  test("a hostile image fails the build with the rule, and nothing is published", async () => {
    await makeRawLayout(path.join(dir, "t", "evil-layout"), [
      plausibleBase(),
      rawTar([{ path: "../../escape", type: "File", body: "x" }]),
    ]);
    const before = await fs.readdir(cacheDir).catch(() => [] as string[]);
    const stepsBefore = await fs.readdir(path.join(cacheDir, ".steps")).catch(() => [] as string[]);
    await assert.rejects(build(await template("evil", '[from]\noci = "evil-layout"\n')), /path escape/);
    assert.deepEqual((await fs.readdir(cacheDir).catch(() => [] as string[])).sort(), before.sort());
    assert.deepEqual(
      (await fs.readdir(path.join(cacheDir, ".steps")).catch(() => [] as string[])).sort(),
      stepsBefore.sort(),
      "no step entry for the refused base",
    );
    assert.deepEqual(await cacheLeftovers(), []);
  });
});
