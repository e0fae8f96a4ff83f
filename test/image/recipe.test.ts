import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { hostDistro, resolveBootPackages } from "../../src/image/apt.js";
import {
  createStaging,
  IMAGE_FILES,
  MANIFEST_FORMAT,
  publish,
  readImageDir,
  type Staging,
  sweepStaleStaging,
} from "../../src/image/cache.js";
import { parseTemplate } from "../../src/image/index.js";
import {
  BUILDER_VERSION,
  canonicalJson,
  hashPayloadDir,
  imageTemplate,
  type Recipe,
  recipeHash,
} from "../../src/image/recipe.js";
import { DEBIAN_TREE_VERSION } from "../../src/image/rootfs.js";

let dir: string;

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-recipe-test-"));
  await fs.writeFile(path.join(dir, "a.txt"), "one\n");
  await fs.writeFile(path.join(dir, "b.txt"), "two\n");
});

after(() => fs.rm(dir, { recursive: true, force: true }));

const BASE_TOML = `
name = "base"
description = "d"
packages = ["git", "curl"]
memory_mib = 512
vcpus = 1
disk_mib = 1024
interpreter = "python"
warmup = "import os"
[[files]]
src = "a.txt"
dest = "/etc/a"
mode = "0644"
`;

async function hashOf(toml: string, overrides: Partial<Recipe> = {}): Promise<string> {
  const template = await parseTemplate(toml, path.join(dir, "t.toml"));
  const recipe: Recipe = {
    builderVersion: BUILDER_VERSION,
    bootRecipe: "1".repeat(64),
    suite: "bookworm",
    arch: "amd64",
    kernelPackage: "linux-image-6.1.0-57-amd64",
    kernelVersion: "6.1.192-3",
    busyboxVersion: "1:1.35.0-4+deb12u1+b1",
    payloadHash: "0".repeat(64),
    template: await imageTemplate(template),
    debianTree: DEBIAN_TREE_VERSION,
    ...overrides,
  };
  return recipeHash(recipe);
}

describe("recipe hash", () => {
  test("is 64 hex digits and stable across reformatting, comments and package order", async () => {
    const base = await hashOf(BASE_TOML);
    assert.match(base, /^[0-9a-f]{64}$/);
    assert.equal(await hashOf(BASE_TOML), base);
    const reformatted = `# a comment\n${BASE_TOML.replace('packages = ["git", "curl"]', 'packages = [\n  "curl",\n  "git",\n]')}`;
    assert.equal(await hashOf(reformatted), base);
  });

  test("changes with every template value and every extra file's content, mode and destination", async () => {
    const base = await hashOf(BASE_TOML);
    const variants: [string, string][] = [
      ['name = "base"', 'name = "base2"'],
      ['description = "d"', 'description = "e"'],
      ['packages = ["git", "curl"]', 'packages = ["git", "curl", "jq"]'],
      ["memory_mib = 512", "memory_mib = 1024"],
      ["vcpus = 1", "vcpus = 2"],
      ["disk_mib = 1024", "disk_mib = 2048"],
      ['interpreter = "python"\nwarmup = "import os"', 'interpreter = "none"'],
      ['warmup = "import os"', 'warmup = "import sys"'],
      ['src = "a.txt"', 'src = "b.txt"'],
      ['dest = "/etc/a"', 'dest = "/etc/b"'],
      ['mode = "0644"', 'mode = "0600"'],
    ];
    const seen = new Set([base]);
    for (const [from, to] of variants) {
      assert.ok(BASE_TOML.includes(from), from);
      const h = await hashOf(BASE_TOML.replace(from, to));
      assert.ok(!seen.has(h), `changing ${from} -> ${to} must change the hash`);
      seen.add(h);
    }
    await fs.writeFile(path.join(dir, "a.txt"), "one, edited\n");
    try {
      assert.notEqual(await hashOf(BASE_TOML), base, "editing an extra file's content must change the hash");
    } finally {
      await fs.writeFile(path.join(dir, "a.txt"), "one\n");
    }
    assert.equal(await hashOf(BASE_TOML), base);
  });

  test("changes with the builder version, boot recipe, host suite, kernel, busybox, payload and Debian tree edits", async () => {
    const base = await hashOf(BASE_TOML);
    const overrides: Partial<Recipe>[] = [
      { builderVersion: BUILDER_VERSION + 1 },
      { suite: "trixie" },
      { arch: "arm64" },
      { kernelPackage: "linux-image-6.1.0-58-amd64" },
      { kernelVersion: "6.1.193-1" },
      { busyboxVersion: "1:1.36.1-1" },
      { payloadHash: "1".repeat(64) },
      { bootRecipe: "2".repeat(64) },
      { debianTree: DEBIAN_TREE_VERSION + 1 },
    ];
    const seen = new Set([base]);
    for (const o of overrides) {
      const h = await hashOf(BASE_TOML, o);
      assert.ok(!seen.has(h), `${JSON.stringify(o)} must change the hash`);
      seen.add(h);
    }
  });

  test("canonical JSON ignores key order", () => {
    assert.equal(canonicalJson({ b: 1, a: [{ d: 2, c: 3 }] }), canonicalJson({ a: [{ c: 3, d: 2 }], b: 1 }));
    assert.equal(canonicalJson({ a: 1, b: undefined }), '{"a":1}');
  });
});

describe("guest payload hash", () => {
  test("covers names, contents, modes and links, and fails clearly without a payload", async () => {
    const payload = path.join(dir, "payload");
    await fs.mkdir(path.join(payload, "sub"), { recursive: true });
    await fs.writeFile(path.join(payload, "forkd-agent"), "\x7fELF\n");
    await fs.writeFile(path.join(payload, "worker.py"), "pass\n");
    await fs.writeFile(path.join(payload, "sub", "data"), "nested\n");
    const base = await hashPayloadDir(payload);
    assert.equal(await hashPayloadDir(payload), base);

    const changes: [() => Promise<void>, () => Promise<void>][] = [
      [
        () => fs.writeFile(path.join(payload, "worker.py"), "pass  \n"),
        () => fs.writeFile(path.join(payload, "worker.py"), "pass\n"),
      ],
      [
        () => fs.chmod(path.join(payload, "worker.py"), 0o755),
        () => fs.chmod(path.join(payload, "worker.py"), 0o644),
      ],
      [
        () => fs.rename(path.join(payload, "worker.py"), path.join(payload, "worker2.py")),
        () => fs.rename(path.join(payload, "worker2.py"), path.join(payload, "worker.py")),
      ],
      [() => fs.writeFile(path.join(payload, "extra"), ""), () => fs.rm(path.join(payload, "extra"))],
      [() => fs.symlink("forkd-agent", path.join(payload, "link")), () => fs.rm(path.join(payload, "link"))],
      [
        () => fs.writeFile(path.join(payload, "sub", "data"), "changed\n"),
        () => fs.writeFile(path.join(payload, "sub", "data"), "nested\n"),
      ],
    ];
    for (const [change, undo] of changes) {
      await change();
      assert.notEqual(await hashPayloadDir(payload), base, change.toString());
      await undo();
      assert.equal(await hashPayloadDir(payload), base, undo.toString());
    }

    await assert.rejects(hashPayloadDir(path.join(dir, "no-such-payload")), (err: unknown) => {
      return err instanceof ForkdError && err.code === "unavailable" && /npm run build/.test(err.message);
    });
    await fs.rm(path.join(payload, "forkd-agent"));
    await assert.rejects(hashPayloadDir(payload), /has no forkd-agent/);
  });
});

describe("boot package resolution", () => {
  test("asks apt once, then answers from its cache until apt's state changes", async () => {
    const cacheDir = path.join(dir, "cache");
    const { arch } = await hostDistro();
    const first = await resolveBootPackages(cacheDir, arch);
    assert.match(first.kernelPackage, new RegExp(`^linux-image-[0-9].*-${arch}$`));
    assert.match(first.kernelVersion, /^[0-9]/);
    assert.match(first.busyboxVersion, /[0-9]/);
    // With no apt-cache on PATH, only the cache can answer.
    const savedPath = process.env.PATH;
    process.env.PATH = path.join(dir, "empty-bin");
    try {
      assert.deepEqual(await resolveBootPackages(cacheDir, arch), first);
      const cacheFile = path.join(cacheDir, ".apt-resolution.json");
      const stale = JSON.parse(await fs.readFile(cacheFile, "utf8")) as { key: string };
      stale.key = `${stale.key}|changed`;
      await fs.writeFile(cacheFile, JSON.stringify(stale));
      await assert.rejects(resolveBootPackages(cacheDir, arch), /apt-cache is not installed/);
    } finally {
      process.env.PATH = savedPath;
    }
  });
});

describe("staging directories", () => {
  test("of dead builds are swept; a live build's staging is kept", async () => {
    const cacheDir = path.join(dir, "sweep");
    const live = await createStaging(cacheDir, "a".repeat(64));
    const dead = await createStaging(cacheDir, "b".repeat(64));
    const child = spawn(process.execPath, ["-e", ""], { stdio: "ignore" });
    const deadPid = child.pid!;
    await new Promise((resolve) => child.on("exit", resolve));
    await fs.writeFile(path.join(dead.dir, "owner.json"), JSON.stringify({ pid: deadPid, startTime: "1" }));
    await fs.writeFile(path.join(dead.work, "junk"), "x");

    // A live build of an older forkd (owner {pid, startTime: "<string>"}, no boot id) sharing the cache.
    const older = await createStaging(cacheDir, "c".repeat(64));
    const self = await fs.readFile(`/proc/${process.pid}/stat`, "utf8");
    const startTime = self.slice(self.lastIndexOf(")") + 2).split(" ")[19];
    await fs.writeFile(path.join(older.dir, "owner.json"), JSON.stringify({ pid: process.pid, startTime }));

    const removed = await sweepStaleStaging(cacheDir);
    assert.deepEqual(removed, [dead.dir]);
    await assert.rejects(fs.stat(dead.dir));
    assert.ok((await fs.stat(live.dir)).isDirectory());
    assert.ok((await fs.stat(older.dir)).isDirectory(), "an older forkd's live build is not swept");
    // And what this forkd writes, an older one reads as live: the start time is a string.
    const owner = JSON.parse(await fs.readFile(path.join(live.dir, "owner.json"), "utf8")) as {
      startTime: unknown;
    };
    assert.equal(owner.startTime, startTime);
  });
});

/** A complete, consistent (but tiny) image in `staging.out`, as a build would leave it. */
async function fakeImage(staging: Staging, recipe: Recipe, buildId: string): Promise<void> {
  const files: Record<string, { size: number; sha256: string }> = {};
  for (const name of [IMAGE_FILES.kernel, IMAGE_FILES.initrd, IMAGE_FILES.probeInitrd, IMAGE_FILES.rootfs]) {
    await fs.writeFile(path.join(staging.out, name), buildId);
    files[name] = {
      size: Buffer.byteLength(buildId),
      sha256: createHash("sha256").update(buildId).digest("hex"),
    };
  }
  const manifest = {
    format: MANIFEST_FORMAT,
    hash: recipeHash(recipe),
    buildId,
    recipe,
    files,
    origin: "built",
  };
  await fs.writeFile(path.join(staging.out, IMAGE_FILES.manifest), JSON.stringify(manifest));
}

describe("publishing into the cache", () => {
  test("first complete image wins; later ones are discarded unless forced; a broken one is replaced", async () => {
    const cacheDir = path.join(dir, "publish");
    const template = await imageTemplate(await parseTemplate('name = "p"', path.join(dir, "t.toml")));
    const recipe: Recipe = {
      builderVersion: BUILDER_VERSION,
      bootRecipe: "1".repeat(64),
      suite: "bookworm",
      arch: "amd64",
      kernelPackage: "linux-image-x",
      kernelVersion: "1",
      busyboxVersion: "1",
      payloadHash: "0".repeat(64),
      template,
    };
    const hash = recipeHash(recipe);
    const stage = async (buildId: string) => {
      const s = await createStaging(cacheDir, hash);
      await fakeImage(s, recipe, buildId);
      return s;
    };

    assert.equal(await publish(await stage("first"), cacheDir, hash, false), "published");
    assert.equal((await readImageDir(cacheDir, hash))?.manifest.buildId, "first");
    assert.equal(await publish(await stage("second"), cacheDir, hash, false), "lost-race");
    assert.equal((await readImageDir(cacheDir, hash))?.manifest.buildId, "first");
    const forced = await stage("forced");
    assert.equal(await publish(forced, cacheDir, hash, true), "published");
    assert.equal((await readImageDir(cacheDir, hash))?.manifest.buildId, "forced");
    assert.ok(
      (await fs.stat(path.join(forced.dir, "replaced"))).isDirectory(),
      "old image moved out of sight",
    );

    await fs.truncate(path.join(cacheDir, hash, IMAGE_FILES.rootfs), 1);
    assert.equal(
      await readImageDir(cacheDir, hash),
      undefined,
      "a file with the wrong size makes the image invalid",
    );
    assert.equal(await publish(await stage("repaired"), cacheDir, hash, false), "published");
    assert.equal((await readImageDir(cacheDir, hash))?.manifest.buildId, "repaired");

    const manifestFile = path.join(cacheDir, hash, IMAGE_FILES.manifest);
    const valid = JSON.parse(await fs.readFile(manifestFile, "utf8")) as Record<string, unknown>;
    for (const broken of [
      { ...valid, origin: undefined },
      { ...valid, files: { ...(valid.files as object), vmlinuz: { size: 8 } } },
      { ...valid, format: 1 },
    ]) {
      await fs.writeFile(manifestFile, JSON.stringify(broken));
      assert.equal(
        await readImageDir(cacheDir, hash),
        undefined,
        "no origin, a file without sha256, format 1",
      );
    }
    await fs.writeFile(manifestFile, "{ not json");
    assert.equal(await readImageDir(cacheDir, hash), undefined);
    await assert.rejects(readImageDir(cacheDir, "../etc"), /invalid image hash/);
  });
});
