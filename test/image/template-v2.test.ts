/** Template format 2: what parses, what it means, and that every mistake names its file, field and rule. */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { loadTemplate, parseTemplate } from "../../src/image/index.js";
import { planBuild } from "../../src/image/step-plan.js";

let dir: string;
const file = () => path.join(dir, "t.toml");

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-template-v2-test-"));
  await fs.mkdir(path.join(dir, "app"), { recursive: true });
  await fs.writeFile(path.join(dir, "app", "main.py"), "print('hi')\n");
  await fs.writeFile(path.join(dir, "image.tar"), "not really a tar\n");
  await fs.writeFile(path.join(dir, "requirements.txt"), "demo==1.0\n");
  await fs.mkdir(path.join(dir, "wheels"));
  await fs.writeFile(path.join(dir, "Dockerfile"), "FROM scratch\n");
});

after(async () => {
  await fs.rm(dir, { recursive: true, force: true });
});

async function rejects(toml: string, ...expected: (string | RegExp)[]): Promise<void> {
  await assert.rejects(parseTemplate(toml, file()), (err: unknown) => {
    assert.ok(err instanceof ForkdError, String(err));
    assert.equal(err.code, "invalid_argument");
    assert.ok(err.message.includes(file()), `names the file: ${err.message}`);
    for (const e of expected) {
      if (typeof e === "string") assert.ok(err.message.includes(e), `"${e}" not in: ${err.message}`);
      else assert.match(err.message, e);
    }
    return true;
  });
}

describe("template format 2", () => {
  test("a full template parses into a base, steps and start/ready", async () => {
    const t = await parseTemplate(
      `format = 2
name = "svc"
interpreter = "none"
[from]
archive = "image.tar"
[[steps]]
env = { MODE = "prod" }
[[steps]]
workdir = "/srv"
[[steps]]
copy = "app"
dest = "/srv/app"
mode = "0640"
owner = "app:app"
[[steps]]
run = "echo hi"
network = true
timeout_s = 60
[[steps]]
run = ["/bin/echo", "argv", "form"]
[[steps]]
user = "app"
[[steps]]
pip = "requirements.txt"
wheels = "wheels"
[start]
command = "exec httpd -f"
user = "app"
[ready]
command = ["nc", "-z", "127.0.0.1", "80"]
timeout_s = 30
interval_ms = 200
`,
      file(),
    );
    assert.equal(t.format, 2);
    assert.deepEqual(t.base, {
      kind: "archive",
      path: await fs.realpath(path.join(dir, "image.tar")),
      pathRelative: "image.tar",
      ref: undefined,
    });
    assert.deepEqual(
      t.steps.map((s) => s.kind),
      ["env", "workdir", "copy", "run", "run", "user", "pip"],
    );
    assert.deepEqual(t.steps[3], {
      kind: "run",
      cache: true,
      argv: ["/bin/sh", "-c", "echo hi"],
      network: true,
      timeoutS: 60,
    });
    assert.deepEqual(t.steps[4], {
      kind: "run",
      cache: true,
      argv: ["/bin/echo", "argv", "form"],
      network: false,
      timeoutS: 3600,
    });
    const copy = t.steps[2];
    assert.ok(copy?.kind === "copy" && copy.mode === 0o640 && copy.owner === "app:app");
    assert.deepEqual(t.start, {
      argv: ["/bin/sh", "-c", "exec httpd -f"],
      user: "app",
      cwd: undefined,
      env: {},
    });
    assert.equal(t.ready?.timeoutMs, 30_000);
    assert.equal(t.ready?.intervalMs, 200);
    assert.deepEqual(t.ready?.argv, ["nc", "-z", "127.0.0.1", "80"]);
  });

  test("format 2 defaults: the host's Debian suite, no interpreter unless asked", async () => {
    const t = await parseTemplate('format = 2\nname = "d"\npackages = ["git"]\n', file());
    assert.equal(t.base.kind, "debian");
    assert.equal(t.interpreter, "none");
    assert.deepEqual(t.steps, []);
  });

  test("format 1 templates stay as they were", async () => {
    const t = await loadTemplate("pyagent");
    assert.equal(t.format, 1);
    assert.equal(t.base.kind, "debian");
    assert.equal(t.interpreter, "python");
    await rejects('name = "x"\n[from]\ndebian = "bookworm"\n', 'field "from" needs format = 2');
    await rejects('name = "x"\n[[steps]]\nrun = "true"\n', 'field "steps" needs format = 2');
  });

  test("registry references and their TLS rule", async () => {
    const t = await parseTemplate(
      'format = 2\nname = "r"\n[from]\nimage = "127.0.0.1:5000/team/app:1.0"\n',
      file(),
    );
    assert.deepEqual(t.base, { kind: "registry", ref: "127.0.0.1:5000/team/app:1.0", insecure: false });
    await rejects(
      'format = 2\nname = "r"\n[from]\nimage = "-oops"\n',
      'field "from.image" must be an image reference',
    );
    await rejects('format = 2\nname = "r"\n[from]\nimage = "Upper/Case"\n', "from.image");
  });

  test("package steps: pip from the machine's indexes, apt, npm, adduser, cache = false", async () => {
    const t = await parseTemplate(
      `format = 2
name = "packages"
[from]
image = "127.0.0.1:5000/debian:12"
[[steps]]
adduser = "user"
[[steps]]
apt = ["curl", "git=1:2.39.5-0+deb12u1", "python3-pip/bookworm"]
recommends = true
[[steps]]
pip = ["numpy", "pandas==2.2.*", "requests[socks]>=2"]
[[steps]]
pip = "requirements.txt"
cache = false
[[steps]]
npm = ["@scope/tool@^1.2", "lodash"]
global = true
`,
      file(),
    );
    assert.deepEqual(
      t.steps.map((s) => [s.kind, s.cache]),
      [
        ["adduser", true],
        ["apt", true],
        ["pip", true],
        ["pip", false],
        ["npm", true],
      ],
    );
    assert.deepEqual(t.steps[1], {
      kind: "apt",
      cache: true,
      packages: ["curl", "git=1:2.39.5-0+deb12u1", "python3-pip/bookworm"],
      recommends: true,
      timeoutS: 3600,
    });
    const pip = t.steps[2];
    assert.ok(pip?.kind === "pip");
    assert.deepEqual(pip.packages, ["numpy", "pandas==2.2.*", "requests[socks]>=2"]);
    assert.equal(pip.requirements, undefined);
    assert.equal(pip.index, undefined, "no index: the machine's configured ones");
    const fromFile = t.steps[3];
    assert.ok(fromFile?.kind === "pip" && fromFile.requirementsRelative === "requirements.txt");
    assert.deepEqual(fromFile.packages, []);
    assert.deepEqual(t.steps[4], {
      kind: "npm",
      cache: true,
      packages: ["@scope/tool@^1.2", "lodash"],
      global: true,
      timeoutS: 3600,
    });
    await rejects(
      'format = 2\nname = "x"\n[from]\nimage = "127.0.0.1:5000/a:1"\n[[steps]]\nadduser = "Bad Name"\n',
      'field "steps[0].adduser" must be a user name',
    );
    await rejects(
      'format = 2\nname = "x"\n[from]\nimage = "127.0.0.1:5000/a:1"\n[[steps]]\napt = ["curl"]\nglobal = true\n',
      "global does not go with a apt step",
    );
  });

  test("a Dockerfile with its context and build arguments", async () => {
    const t = await parseTemplate(
      'format = 2\nname = "df"\n[dockerfile]\nargs = { VERSION = "1.2" }\ntarget = "final"\n',
      file(),
    );
    assert.ok(t.base.kind === "dockerfile");
    assert.equal(t.base.file, await fs.realpath(path.join(dir, "Dockerfile")));
    assert.equal(t.base.context, await fs.realpath(dir));
    assert.deepEqual(t.base.args, { VERSION: "1.2" });
    assert.equal(t.base.network, false);
  });

  test("mistakes are named: every problem of a file at once", async () => {
    await rejects(
      `format = 2
name = "bad"
[from]
archive = "../outside.tar"
[[steps]]
run = "true"
copy = "app"
[[steps]]
copy = "app"
[[steps]]
env = { "BAD NAME" = "x" }
[[steps]]
workdir = "relative"
[[steps]]
pip = "requirements.txt"
wheels = "wheels"
index = "https://pypi.example/simple"
[[steps]]
run = "x"
dest = "/y"
`,
      'field "from.archive" must not contain ".."',
      'field "steps[0]" must have exactly one of run, copy, env, workdir, user, pip, apt, npm, adduser (got run, copy)',
      'field "steps[1].dest" is required for a copy step',
      'field "steps[2].env.BAD NAME" is not a valid variable name',
      'field "steps[3].workdir" must be a normalized absolute guest path',
      'field "steps[4]" takes at most one of wheels',
      'field "steps[5]": dest does not go with a run step (it takes network, timeout_s, cache)',
    );
    // Package names are argv, never options or locations of their own.
    await rejects(
      'format = 2\nname = "x"\n[[steps]]\napt = ["-oAPT::Get::Option=1"]\n[[steps]]\nnpm = ["git+https://example.com/x.git"]\n[[steps]]\npip = ["--index-url=https://elsewhere"]\n',
      'field "steps[0].apt[0]" must be one of Debian package names',
      'field "steps[1].npm[0]" must be one of npm package names',
      'field "steps[2].pip" must be a requirements file next to the template or a list of requirement specifiers',
    );
    await rejects(
      'format = 2\nname = "x"\n[from]\ndebian = "bookworm"\noci = "app"\n',
      "exactly one of debian, oci, archive, image",
    );
    await rejects(
      'format = 2\nname = "x"\n[from]\noci = "missing"\n',
      'field "from.oci" names a directory that does not exist',
    );
    await rejects(
      'format = 2\nname = "x"\n[from]\narchive = "image.tar"\n[dockerfile]\n',
      '"from" and "dockerfile" exclude each other',
    );
    await rejects(
      'format = 2\nname = "x"\npackages = ["git"]\n[from]\narchive = "image.tar"\n',
      'field "packages" only goes with a Debian base',
    );
    await rejects(
      'format = 2\nname = "x"\n[[steps]]\nrun = "true"\nbogus = 1\n',
      'unknown field "steps[0].bogus"',
    );
    await rejects(
      'format = 2\nname = "x"\n[start]\ncommand = "x"\ntimeout_s = 3\n',
      "timeout_s and interval_ms belong to ready",
    );
    await rejects('format = 3\nname = "x"\n', 'field "format" must be 1 or 2');
  });

  test("step keys: a step's key covers everything before it, and a copied file's content", async () => {
    const text = (cmd: string) =>
      `format = 2\nname = "k"\n[from]\ndebian = "bookworm"\n[[steps]]\nrun = "${cmd}"\n[[steps]]\ncopy = "app"\ndest = "/app"\n`;
    const a = await planBuild(await parseTemplate(text("one"), file()), "bookworm", []);
    const b = await planBuild(await parseTemplate(text("two"), file()), "bookworm", []);
    assert.equal(a.base.key, b.base.key);
    assert.notEqual(a.steps[0]?.key, b.steps[0]?.key);
    assert.notEqual(a.steps[1]?.key, b.steps[1]?.key, "a change in step 1 changes every later key");
    await fs.writeFile(path.join(dir, "app", "main.py"), "print('changed')\n");
    const c = await planBuild(await parseTemplate(text("one"), file()), "bookworm", []);
    assert.equal(c.steps[0]?.key, a.steps[0]?.key);
    assert.notEqual(c.steps[1]?.key, a.steps[1]?.key, "the copied content is part of the key");
    await assert.rejects(
      planBuild(await parseTemplate(text("one"), file()), "trixie", []),
      /from.debian" is bookworm, but this host's apt sources serve trixie/,
    );
  });

  test("cache = false: that step and every later one get a key no other build had", async () => {
    const text = (cache: string) =>
      `format = 2\nname = "k"\n[from]\ndebian = "bookworm"\n[[steps]]\nrun = "one"\n[[steps]]\nrun = "two"\n${cache}\n[[steps]]\nrun = "three"\n`;
    const cached = await planBuild(await parseTemplate(text(""), file()), "bookworm", []);
    const again = await planBuild(await parseTemplate(text(""), file()), "bookworm", []);
    assert.deepEqual(
      again.steps.map((s) => s.key),
      cached.steps.map((s) => s.key),
    );
    const a = await planBuild(await parseTemplate(text("cache = false"), file()), "bookworm", []);
    const b = await planBuild(await parseTemplate(text("cache = false"), file()), "bookworm", []);
    assert.equal(a.steps[0]?.key, cached.steps[0]?.key, "steps before it keep their keys");
    assert.notEqual(a.steps[1]?.key, b.steps[1]?.key);
    assert.notEqual(a.steps[2]?.key, b.steps[2]?.key, "and every step after it runs again");
  });
});
