import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { listTemplates, loadTemplate, parseTemplate, TEMPLATE_DEFAULTS } from "../../src/image/index.js";

let dir: string;

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-template-test-"));
  await fs.mkdir(path.join(dir, "files", "sub"), { recursive: true });
  await fs.writeFile(path.join(dir, "files", "hello.txt"), "hello\n");
  await fs.writeFile(path.join(dir, "files", "sub", "run.sh"), "#!/bin/sh\necho hi\n");
  await fs.writeFile(path.join(os.tmpdir(), "forkd-template-outside.txt"), "outside\n");
  await fs.symlink(
    path.join(os.tmpdir(), "forkd-template-outside.txt"),
    path.join(dir, "files", "escape.txt"),
  );
});

after(async () => {
  await fs.rm(dir, { recursive: true, force: true });
  await fs.rm(path.join(os.tmpdir(), "forkd-template-outside.txt"), { force: true });
});

const file = () => path.join(dir, "t.toml");

async function rejects(toml: string, ...expected: (string | RegExp)[]): Promise<ForkdError> {
  let caught: unknown;
  try {
    await parseTemplate(toml, file());
  } catch (err) {
    caught = err;
  }
  assert.ok(caught instanceof ForkdError, `expected a ForkdError for:\n${toml}`);
  assert.equal(caught.code, "invalid_argument");
  assert.ok(caught.message.includes(file()), `message names the file: ${caught.message}`);
  for (const e of expected) {
    if (typeof e === "string") assert.ok(caught.message.includes(e), `"${e}" not in: ${caught.message}`);
    else assert.match(caught.message, e);
  }
  return caught;
}

describe("built-in templates", () => {
  test("pyagent: python3 + numpy, 512 MiB, 1 vCPU, numpy warm-up with a marker global", async () => {
    const t = await loadTemplate("pyagent");
    assert.equal(t.name, "pyagent");
    assert.equal(t.builtin, true);
    assert.deepEqual(t.packages, ["python3", "python3-numpy", "python3-pil"]);
    assert.equal(t.memoryMib, 512);
    assert.equal(t.vcpus, 1);
    assert.equal(t.interpreter, "python");
    assert.match(t.warmup ?? "", /^import numpy$/m);
    assert.match(t.warmup ?? "", /^FORKD_WARM_MARKER = "warm"$/m);
    assert.ok(path.isAbsolute(t.source) && t.source.endsWith(path.join("templates", "pyagent.toml")));
  });

  test("minimal: no Python", async () => {
    const t = await loadTemplate("minimal");
    assert.equal(t.interpreter, "none");
    assert.deepEqual(t.packages, []);
    assert.equal(t.warmup, undefined);
  });

  test("are found relative to the package, not the working directory", async () => {
    const cwd = process.cwd();
    process.chdir(os.tmpdir());
    try {
      const names = (await listTemplates()).map((t) => t.name);
      assert.ok(names.includes("pyagent") && names.includes("minimal"), `got ${names}`);
    } finally {
      process.chdir(cwd);
    }
  });

  test("an unknown name is not_found and lists the available ones", async () => {
    await assert.rejects(loadTemplate("nope"), (err: unknown) => {
      assert.ok(err instanceof ForkdError);
      assert.equal(err.code, "not_found");
      assert.match(err.message, /no built-in template named "nope" \(available: .*minimal.*pyagent/);
      return true;
    });
  });

  test("a name that is not a safe path component is rejected before touching the disk", async () => {
    for (const bad of ["..", ".hidden", "-x", "a b"]) {
      await assert.rejects(
        loadTemplate(bad),
        (err: unknown) => err instanceof ForkdError && err.code === "invalid_argument",
      );
    }
  });
});

describe("template files", () => {
  test("defaults apply to omitted fields", async () => {
    const t = await parseTemplate('name = "bare"', file());
    assert.equal(t.description, TEMPLATE_DEFAULTS.description);
    assert.equal(t.memoryMib, TEMPLATE_DEFAULTS.memory_mib);
    assert.equal(t.vcpus, TEMPLATE_DEFAULTS.vcpus);
    assert.equal(t.diskMib, TEMPLATE_DEFAULTS.disk_mib);
    assert.equal(t.interpreter, "python");
    assert.deepEqual(t.packages, []);
    assert.deepEqual(t.files, []);
  });

  test("a template loads by path, with extra files relative to it", async () => {
    await fs.writeFile(
      file(),
      [
        'name = "custom.v2"',
        'packages = ["git", "libstdc++6", "g++"]',
        'interpreter = "none"',
        "[[files]]",
        'src = "files/hello.txt"',
        'dest = "/etc/hello.txt"',
        "[[files]]",
        'src = "files/sub/run.sh"',
        'dest = "/usr/local/bin/run"',
        'mode = "0755"',
        "[[files]]",
        'src = "./files/hello.txt"',
        'dest = "/srv/hello"',
        "mode = 0o600",
      ].join("\n"),
    );
    const cwd = process.cwd();
    process.chdir(dir);
    try {
      await assert.rejects(
        loadTemplate("./t.toml"),
        /looks like a file path; the daemon takes template names only/,
        "an API caller's name never loads a file",
      );
      await assert.rejects(
        loadTemplate("t.toml"),
        /looks like a file path/,
        "a valid tag ending in .toml either",
      );
      const t = await loadTemplate("./t.toml", { allowFiles: true });
      assert.equal(t.name, "custom.v2");
      assert.equal(t.builtin, false);
      assert.deepEqual(t.packages, ["git", "libstdc++6", "g++"]);
      assert.deepEqual(
        t.files.map((f) => [f.src, f.dest, f.mode]),
        [
          [path.join(await fs.realpath(dir), "files/hello.txt"), "/etc/hello.txt", 0o644],
          [path.join(await fs.realpath(dir), "files/sub/run.sh"), "/usr/local/bin/run", 0o755],
          [path.join(await fs.realpath(dir), "files/hello.txt"), "/srv/hello", 0o600],
        ],
      );
    } finally {
      process.chdir(cwd);
    }
  });

  test("a missing template file is not_found", async () => {
    await assert.rejects(
      loadTemplate(path.join(dir, "missing.toml"), { allowFiles: true }),
      (err: unknown) => {
        return err instanceof ForkdError && err.code === "not_found" && err.message.includes("missing.toml");
      },
    );
  });
});

describe("validation errors name the file, the field and the rule", () => {
  test("invalid TOML", async () => {
    await rejects('name = "x"\npackages = [', "invalid TOML");
  });
  test("name is required", async () => {
    await rejects('packages = ["git"]', 'field "name" is required');
  });
  test("name follows the tag rule", async () => {
    await rejects('name = "../etc"', 'field "name"', "[A-Za-z0-9][A-Za-z0-9._-]{0,63}");
    await rejects('name = ".hidden"', 'field "name"');
    await rejects(`name = "${"a".repeat(65)}"`, 'field "name"');
    await rejects("name = 5", 'field "name"');
  });
  test("unknown fields", async () => {
    await rejects('name = "x"\nmemory = 512', 'unknown field "memory"', "allowed: name, description");
    await rejects(
      'name = "x"\n[[files]]\nsrc = "files/hello.txt"\ndest = "/a"\nowner = "root"',
      'unknown field "files[0].owner"',
      "allowed: src, dest, mode",
    );
  });
  test("packages must be Debian package names", async () => {
    for (const bad of ["Python3", "a", "python_3", "-x", "pkg=1.0", "foo bar", "pkg:amd64"]) {
      await rejects(
        `name = "x"\npackages = ["git", ${JSON.stringify(bad)}]`,
        'field "packages[1]"',
        "Debian package name",
      );
    }
    await rejects('name = "x"\npackages = "git"', 'field "packages"', "list");
  });
  test("sizes must be whole numbers in range", async () => {
    await rejects('name = "x"\nmemory_mib = 64', 'field "memory_mib"', "from 128 to 65536", "got 64");
    await rejects('name = "x"\nmemory_mib = 512.5', 'field "memory_mib"', "whole number");
    await rejects('name = "x"\nmemory_mib = "512"', 'field "memory_mib"');
    await rejects('name = "x"\nvcpus = 0', 'field "vcpus"', "from 1 to 64");
    await rejects('name = "x"\ndisk_mib = 100', 'field "disk_mib"', "from 256");
  });
  test("interpreter is python or none", async () => {
    await rejects('name = "x"\ninterpreter = "ruby"', 'field "interpreter"', 'must be "python" or "none"');
  });
  test("warmup only with python", async () => {
    await rejects(
      'name = "x"\ninterpreter = "none"\nwarmup = "import os"',
      'field "warmup"',
      'only allowed with interpreter = "python"',
    );
    await rejects(`name = "x"\nwarmup = ${JSON.stringify("x".repeat(70_000))}`, 'field "warmup"', "at most");
  });
  test("description length", async () => {
    await rejects(`name = "x"\ndescription = "${"d".repeat(501)}"`, 'field "description"', "at most 500");
  });
  test("extra file sources stay inside the template's directory", async () => {
    const entry = (src: string, dest = "/etc/x") =>
      `name = "x"\n[[files]]\nsrc = ${JSON.stringify(src)}\ndest = ${JSON.stringify(dest)}`;
    await rejects(entry("/etc/passwd"), 'field "files[0].src"', "relative to the template file");
    await rejects(entry("../outside.txt"), 'field "files[0].src"', 'must not contain ".."');
    await rejects(entry("files/../../x"), 'field "files[0].src"', 'must not contain ".."');
    await rejects(entry("files/nope.txt"), 'field "files[0].src"', "does not exist");
    await rejects(
      entry("files/escape.txt"),
      'field "files[0].src"',
      "resolves outside the template's directory",
    );
    await rejects(entry("files/sub"), 'field "files[0].src"', "regular file");
  });
  test("extra file destinations are normalized absolute guest paths outside reserved places", async () => {
    const entry = (dest: string) =>
      `name = "x"\n[[files]]\nsrc = "files/hello.txt"\ndest = ${JSON.stringify(dest)}`;
    await rejects(entry("etc/x"), 'field "files[0].dest"', "absolute");
    await rejects(entry("/etc/../root/x"), 'field "files[0].dest"', "normalized");
    await rejects(entry("/etc//x"), 'field "files[0].dest"', "normalized");
    await rejects(entry("/etc/"), 'field "files[0].dest"', "trailing");
    await rejects(entry("/opt/forkd/forkd-agent"), 'field "files[0].dest"', "/opt/forkd");
    await rejects(entry("/tmp/x"), 'field "files[0].dest"', "/tmp");
    await rejects(entry("/proc"), 'field "files[0].dest"', "/proc");
    const twice =
      'name = "x"\n[[files]]\nsrc = "files/hello.txt"\ndest = "/a"\n[[files]]\nsrc = "files/hello.txt"\ndest = "/a"';
    await rejects(twice, 'field "files[1].dest"', "repeats /a");
  });
  test("extra file modes are octal permissions", async () => {
    const entry = (mode: string) =>
      `name = "x"\n[[files]]\nsrc = "files/hello.txt"\ndest = "/a"\nmode = ${mode}`;
    await rejects(entry('"999"'), 'field "files[0].mode"', "octal");
    await rejects(entry('"rwx"'), 'field "files[0].mode"', "octal");
    await rejects(entry("0o10000"), 'field "files[0].mode"', "octal");
  });
  test("several problems are reported together", async () => {
    const err = await rejects(
      'name = "x"\nvcpus = 0\nmemory_mib = 1\ncolour = "red"',
      'field "vcpus"',
      'field "memory_mib"',
      'unknown field "colour"',
    );
    assert.equal((err.detail?.problems as string[] | undefined)?.length, 3);
  });
});

describe("[egress]: the policy a template's sandboxes get when a spawn names none", () => {
  test("read into the template with its lists defaulting to empty; absent means none", async () => {
    const t = await parseTemplate(
      'name = "x"\n[egress]\ndefault = "deny"\nallow_out = ["pypi.org", "10.1.0.0/16"]',
      file(),
    );
    assert.deepEqual(t.egress, { default: "deny", allowOut: ["pypi.org", "10.1.0.0/16"], denyOut: [] });
    assert.equal((await parseTemplate('name = "x"', file())).egress, undefined);
  });
  test("default is required, lists hold strings, other fields are refused by name", async () => {
    await rejects('name = "x"\n[egress]\nallow_out = ["a.test"]', 'field "egress.default" is required');
    await rejects('name = "x"\n[egress]\ndefault = "open"', 'field "egress.default"', '"allow" or "deny"');
    await rejects('name = "x"\n[egress]\ndefault = "deny"\nallow_out = "a.test"', 'field "egress.allow_out"');
    await rejects(
      'name = "x"\n[egress]\ndefault = "deny"\nallowOut = ["a.test"]',
      'unknown field "egress.allowOut"',
      "allowed: default, allow_out, deny_out",
    );
  });
  test('a template without a NIC (network = "none") cannot have one', async () => {
    await rejects('name = "x"\nnetwork = "none"\n[egress]\ndefault = "deny"', 'field "egress" needs a NIC');
  });
});
