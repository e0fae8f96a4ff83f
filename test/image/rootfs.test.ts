/** Root filesystem customization and ext4 creation on a small hand-made tree (mmdebstrap is in build.test.ts). */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { parseTemplate } from "../../src/image/index.js";
import {
  addDefaultUser,
  customizeTree,
  makeExt4,
  resolveInRoot,
  rootfsPackages,
} from "../../src/image/rootfs.js";
import { debugfsCat, debugfsStat } from "./helpers.js";

const isRoot = process.geteuid?.() === 0;

let dir: string;
let root: string;
let outside: string;

/** A tree shaped like a Debian root, with links that would escape it if followed on the host. */
async function makeTree(): Promise<void> {
  root = path.join(dir, "root");
  for (const d of [
    "usr/bin",
    "etc",
    "opt",
    "var/cache/apt/archives",
    "var/log/apt",
    "var/lib/apt/lists",
    "usr/share/doc/x",
  ]) {
    await fs.mkdir(path.join(root, d), { recursive: true });
  }
  await fs.symlink("usr/bin", path.join(root, "bin"));
  await fs.writeFile(path.join(root, "usr/bin/bash"), "bash");
  await fs.writeFile(
    path.join(root, "etc/passwd"),
    "root:x:0:0:root:/root:/bin/bash\ntaken:x:1000:1000::/home/taken:/bin/sh\n",
  );
  await fs.writeFile(path.join(root, "etc/group"), "root:x:0:\ntaken:x:1000:\n");
  await fs.writeFile(path.join(root, "etc/shadow"), "root:*:19000:0:99999:7:::\n");
  await fs.writeFile(path.join(root, "var/cache/apt/archives/x.deb"), "deb");
  await fs.writeFile(path.join(root, "var/log/apt/history.log"), "log");
  await fs.writeFile(path.join(root, "var/lib/apt/lists/index"), "index");
  await fs.writeFile(path.join(root, "usr/share/doc/x/copyright"), "c");
  await fs.symlink(outside, path.join(root, "etc/escape")); // absolute link to a host directory
  await fs.symlink(path.join(outside, "target.txt"), path.join(root, "etc/motd")); // absolute link to a host file
}

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-rootfs-test-"));
  outside = path.join(dir, "host-outside");
  await fs.mkdir(outside);
  await fs.writeFile(path.join(outside, "target.txt"), "host file\n");
  await makeTree();
  await fs.mkdir(path.join(dir, "payload"), { recursive: true });
  await fs.writeFile(path.join(dir, "payload", "forkd-agent"), "#!agent\n");
  await fs.writeFile(path.join(dir, "payload", "worker.py"), "# worker\n");
  await fs.mkdir(path.join(dir, "tpl"));
  await fs.writeFile(path.join(dir, "tpl", "motd"), "welcome\n");
  await fs.writeFile(path.join(dir, "tpl", "tool"), "#!/bin/sh\n");
});

after(() => fs.rm(dir, { recursive: true, force: true }));

describe("resolveInRoot", () => {
  test("resolves links as the guest would and never leaves the root", async () => {
    assert.equal(await resolveInRoot(root, "/bin/bash", true), path.join(root, "usr/bin/bash"));
    assert.equal(await resolveInRoot(root, "/etc/escape/x"), path.join(root, outside, "x"));
    assert.equal(
      await resolveInRoot(root, "/etc/motd"),
      path.join(root, "etc/motd"),
      "last component not followed",
    );
    assert.equal(await resolveInRoot(root, "/etc/motd", true), path.join(root, outside, "target.txt"));
    assert.equal(await resolveInRoot(root, "/../../../etc/x"), path.join(root, "etc/x"));
    await fs.symlink("loop", path.join(root, "loop"));
    await assert.rejects(resolveInRoot(root, "/loop/x"), /too many symlinks/);
    await fs.rm(path.join(root, "loop"));
  });
});

describe("customizeTree", () => {
  test("adds payload, template.json, files and hostname, trims caches, and never writes through links", async () => {
    const template = await parseTemplate(
      [
        'name = "custom"',
        'interpreter = "none"',
        "[[files]]",
        'src = "motd"',
        'dest = "/etc/motd"',
        "[[files]]",
        'src = "tool"',
        'dest = "/etc/escape/tool"',
        'mode = "0750"',
        "[[files]]",
        'src = "tool"',
        'dest = "/bin/tool"',
        'mode = "0755"',
      ].join("\n"),
      path.join(dir, "tpl", "t.toml"),
    );
    await customizeTree({ root, template, payloadDir: path.join(dir, "payload") });

    assert.equal(await fs.readFile(path.join(root, "opt/forkd/forkd-agent"), "utf8"), "#!agent\n");
    assert.equal((await fs.stat(path.join(root, "opt/forkd/forkd-agent"))).mode & 0o777, 0o755);
    assert.equal(await fs.readFile(path.join(root, "opt/forkd/worker.py"), "utf8"), "# worker\n");
    // E2B's default user, with the next free uid/gid because 1000 is taken in this tree, and bash found.
    assert.match(
      await fs.readFile(path.join(root, "etc/passwd"), "utf8"),
      /\nuser:x:1001:1001::\/home\/user:\/bin\/bash\n$/,
    );
    assert.match(await fs.readFile(path.join(root, "etc/group"), "utf8"), /\nuser:x:1001:\n$/);
    assert.match(await fs.readFile(path.join(root, "etc/shadow"), "utf8"), /\nuser:\*::0:99999:7:::\n$/);
    const home = await fs.stat(path.join(root, "home/user"));
    assert.ok(home.isDirectory());
    assert.equal(home.uid, 1001);
    const templateJson = JSON.parse(await fs.readFile(path.join(root, "opt/forkd/template.json"), "utf8"));
    assert.deepEqual(templateJson, { name: "custom", interpreter: "none" });
    assert.equal(await fs.readFile(path.join(root, "etc/hostname"), "utf8"), "forkd\n");
    assert.match(await fs.readFile(path.join(root, "etc/hosts"), "utf8"), /127\.0\.0\.1\tlocalhost/);

    // /etc/motd was a link to a host file: the link is replaced, the host file untouched.
    const motd = await fs.lstat(path.join(root, "etc/motd"));
    assert.ok(motd.isFile());
    assert.equal(await fs.readFile(path.join(root, "etc/motd"), "utf8"), "welcome\n");
    assert.equal(await fs.readFile(path.join(outside, "target.txt"), "utf8"), "host file\n");
    // /etc/escape pointed at a host directory: the file lands inside the root instead.
    assert.deepEqual(await fs.readdir(outside), ["target.txt"]);
    const tool = await fs.stat(path.join(root, outside, "tool"));
    assert.equal(tool.mode & 0o7777, 0o750);
    assert.equal((await fs.stat(path.join(root, "usr/bin/tool"))).mode & 0o7777, 0o755);

    for (const trimmed of ["var/cache/apt", "var/log", "var/lib/apt/lists", "usr/share/doc"]) {
      assert.deepEqual(await fs.readdir(path.join(root, trimmed)), [], trimmed);
    }
  });

  test("refuses a payload without the agent binary", async () => {
    const bare = path.join(dir, "bare");
    await fs.mkdir(path.join(bare, "etc"), { recursive: true });
    const emptyPayload = path.join(dir, "empty-payload");
    await fs.mkdir(emptyPayload, { recursive: true });
    const template = await parseTemplate('name = "x"', path.join(dir, "tpl", "t.toml"));
    await assert.rejects(
      customizeTree({ root: bare, template, payloadDir: emptyPayload }),
      /lacks \/opt\/forkd\/forkd-agent/,
    );
  });

  test("adds root and the default user with uid 1000 and /bin/sh to a tree without bash or any passwd", async () => {
    const tree = path.join(dir, "nobash");
    await fs.mkdir(path.join(tree, "etc"), { recursive: true });
    assert.deepEqual(await addDefaultUser(tree), { uid: 1000, gid: 1000 });
    assert.equal(
      await fs.readFile(path.join(tree, "etc/passwd"), "utf8"),
      "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
    );
    assert.equal(await fs.readFile(path.join(tree, "etc/group"), "utf8"), "root:x:0:\nuser:x:1000:\n");
    // Again: the existing entry is kept, nothing is duplicated.
    assert.deepEqual(await addDefaultUser(tree), { uid: 1000, gid: 1000 });
    assert.equal((await fs.readFile(path.join(tree, "etc/passwd"), "utf8")).match(/^user:/gm)?.length, 1);
  });

  test("package list: nothing for the agent itself, python3 for interpreter python", () => {
    assert.deepEqual(rootfsPackages({ packages: ["git"], interpreter: "none" }), ["git"]);
    assert.deepEqual(rootfsPackages({ packages: [], interpreter: "none" }), []);
    assert.deepEqual(rootfsPackages({ packages: ["python3-numpy", "python3"], interpreter: "python" }), [
      "python3",
      "python3-numpy",
    ]);
  });
});

describe("makeExt4", () => {
  test("writes a checked ext4 image owned by root, readable with debugfs", {
    skip: !isRoot && "needs root",
  }, async () => {
    const image = path.join(dir, "small.ext4");
    const result = await makeExt4(root, image, 256, "/x/t.toml");
    assert.match(result.uuid, /^[0-9a-f-]{36}$/);
    assert.equal((await fs.stat(image)).size, 256 * 1024 * 1024);
    assert.equal(await debugfsCat(image, "/opt/forkd/forkd-agent"), "#!agent\n");
    assert.equal((await debugfsStat(image, "/home/user")).uid, 1001, "ownership survives mkfs.ext4 -d");
    assert.equal(await debugfsCat(image, "/etc/motd"), "welcome\n");
    const rootDir = await debugfsStat(image, "/");
    assert.equal(rootDir.uid, 0);
  });

  test("a disk too small for the files is a clear error naming the template and disk_mib", async () => {
    const big = path.join(dir, "big");
    await fs.mkdir(big);
    await fs.writeFile(path.join(big, "blob"), Buffer.alloc(300 * 1024 * 1024, 1));
    const image = path.join(dir, "too-small.ext4");
    await assert.rejects(makeExt4(big, image, 256, "/x/t.toml"), (err: unknown) => {
      assert.ok(err instanceof ForkdError);
      assert.equal(err.code, "invalid_argument");
      assert.match(err.message, /\/x\/t\.toml: disk_mib = 256 is too small: .* 30\d MiB .* at least \d+/);
      return true;
    });
    await assert.rejects(fs.stat(image), "no image file is left behind");
    await fs.rm(big, { recursive: true });
  });
});
