/** Root filesystem customization and ext4 creation on a small hand-made tree (mmdebstrap is in build.test.ts). */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { ForkdError } from "../../src/common/errors.js";
import { parseTemplate } from "../../src/image/index.js";
import {
  addDefaultUser,
  customizeTree,
  makeExt4,
  resolveInRoot,
  rootfsPackages,
  trimLoginProfiles,
} from "../../src/image/rootfs.js";
import { debugfsCat, debugfsStat } from "./helpers.js";

const isRoot = process.geteuid?.() === 0;
const execFileAsync = promisify(execFile);

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

/** Debian 12's /etc/profile and /root/.profile (base-files 12.4), as mmdebstrap leaves them. */
const DEBIAN_PROFILE = `# /etc/profile: system-wide .profile file for the Bourne shell (sh(1))
# and Bourne compatible shells (bash(1), ksh(1), ash(1), ...).

if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
fi
export PATH
`;
const DEBIAN_ROOT_PROFILE = `# ~/.profile: executed by Bourne-compatible login shells.

if [ "$BASH" ]; then
  if [ -f ~/.bashrc ]; then
    . ~/.bashrc
  fi
fi

mesg n 2> /dev/null || true
`;

describe("trimLoginProfiles", () => {
  let tree: string;
  let bin: string;
  before(async () => {
    tree = path.join(dir, "profiles");
    await fs.mkdir(path.join(tree, "etc"), { recursive: true });
    await fs.mkdir(path.join(tree, "root"), { recursive: true });
    await fs.writeFile(path.join(tree, "etc/profile"), DEBIAN_PROFILE, { mode: 0o644 });
    await fs.writeFile(path.join(tree, "root/.profile"), DEBIAN_ROOT_PROFILE, { mode: 0o644 });
    await fs.writeFile(path.join(dir, "profile.orig"), DEBIAN_PROFILE);
    await trimLoginProfiles(tree);
    // `id` and `mesg` that leave a mark, ahead of the real ones, to see which processes a profile starts.
    bin = path.join(dir, "marking-bin");
    await fs.mkdir(bin);
    for (const name of ["id", "mesg"]) {
      const real = name === "id" ? "/usr/bin/id" : "/usr/bin/mesg";
      await fs.writeFile(path.join(bin, name), `#!/bin/sh\necho ${name} >> "$MARKS"\nexec ${real} "$@"\n`, {
        mode: 0o755,
      });
    }
    await fs.chmod(dir, 0o755); // the non-root runs below read the profiles
  });

  /** The PATH a shell gets from `profile` (as `uid`), and the marked programs it ran. */
  async function source(shell: string, profile: string, uid: number, tty = false) {
    const marks = path.join(dir, `marks-${Math.random().toString(36).slice(2)}`);
    await fs.writeFile(marks, "", { mode: 0o666 });
    await fs.chmod(marks, 0o666);
    const script = `${marks}.sh`;
    await fs.writeFile(script, `. '${profile}'\necho "$PATH"\n`, { mode: 0o644 });
    const argv = ["setpriv", `--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", shell, script];
    // script(1) gives the shell a terminal on stdin (the paths here have no spaces).
    const run = tty ? ["script", "-qec", argv.join(" "), "/dev/null"] : argv;
    const { stdout } = await execFileAsync(run[0]!, run.slice(1), {
      env: { PATH: `${bin}:/usr/bin:/bin`, MARKS: marks },
    });
    const ran = (await fs.readFile(marks, "utf8")).split("\n").filter((l) => l !== "");
    return { path: stdout.trim().split("\n").at(-1)?.trim(), ran };
  }

  test("keeps the PATH for root and others under bash and dash, without `id` under bash", {
    skip: !isRoot && "switching uid needs root",
  }, async () => {
    const profile = path.join(tree, "etc/profile");
    for (const uid of [0, 65534]) {
      for (const shell of ["/bin/bash", "/bin/dash"]) {
        const before = await source(shell, path.join(dir, "profile.orig"), uid);
        const now = await source(shell, profile, uid);
        assert.equal(now.path, before.path, `${shell} as ${uid}: the same PATH`);
        assert.match(now.path ?? "", uid === 0 ? /^\/usr\/local\/sbin:/ : /^\/usr\/local\/bin:.*games$/);
        assert.deepEqual(before.ran, ["id"]);
        assert.deepEqual(now.ran, shell === "/bin/bash" ? [] : ["id"], `${shell} as ${uid}: processes`);
      }
    }
  });

  test("root's .profile runs mesg only with a terminal on stdin", {
    skip: !isRoot && "needs root",
  }, async () => {
    const profile = path.join(tree, "root/.profile");
    assert.deepEqual((await source("/bin/bash", profile, 0)).ran, []);
    assert.deepEqual((await source("/bin/bash", profile, 0, true)).ran, ["mesg"]);
    assert.equal((await fs.stat(profile)).mode & 0o7777, 0o644);
  });

  test("leaves a profile that is not Debian's text alone and never writes through a link", async () => {
    const other = path.join(dir, "other-profiles");
    await fs.mkdir(path.join(other, "etc"), { recursive: true });
    await fs.writeFile(path.join(other, "etc/profile"), "PATH=/opt/bin\n");
    await fs.writeFile(path.join(outside, "profile"), DEBIAN_ROOT_PROFILE);
    await fs.mkdir(path.join(other, "root"));
    await fs.symlink(path.join(outside, "profile"), path.join(other, "root/.profile"));
    await trimLoginProfiles(other);
    assert.equal(await fs.readFile(path.join(other, "etc/profile"), "utf8"), "PATH=/opt/bin\n");
    assert.equal(await fs.readFile(path.join(outside, "profile"), "utf8"), DEBIAN_ROOT_PROFILE);
  });
});
