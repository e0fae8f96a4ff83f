/**
 * End to end: real builds of the `minimal` template with mmdebstrap and the host's apt, into a temporary
 * FORKD_IMAGE_CACHE, with a placeholder guest payload whose agent announces itself on the console and exits.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { ForkdError } from "../../src/common/errors.js";
import { buildBootParts } from "../../src/image/boot.js";
import { createStaging, removeStaging } from "../../src/image/cache.js";
import {
  type BuildProgressEvent,
  type BuiltImage,
  buildImage,
  findCachedImage,
  loadTemplate,
  readImage,
  resolveRecipe,
  type Template,
} from "../../src/image/index.js";
import { bootGuest, debugfsCat, debugfsStat } from "./helpers.js";

const execFileAsync = promisify(execFile);
const isRoot = process.geteuid?.() === 0;

const AGENT_MARKER = "FORKD-TEST-AGENT-UP";
/** Runs as PID 1 in the minbase image (its /bin/sh), announces itself, then powers the VM off. */
const PLACEHOLDER_AGENT = `#!/bin/sh
echo "${AGENT_MARKER} $(tr -d ' \\n' < /opt/forkd/template.json)" > /dev/console
echo o > /proc/sysrq-trigger
sleep 3600
`;

let dir: string;
let cacheDir: string;
let payloadDir: string;
let template: Template;
let savedCacheEnv: string | undefined;
let built: BuiltImage;

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-build-test-"));
  // Build steps run as the unprivileged build range, which must pass through the image cache's parents.
  await fs.chmod(dir, 0o711);
  cacheDir = path.join(dir, "cache");
  savedCacheEnv = process.env.FORKD_IMAGE_CACHE;
  process.env.FORKD_IMAGE_CACHE = cacheDir;
  payloadDir = path.join(dir, "payload");
  await fs.mkdir(payloadDir, { recursive: true });
  await fs.writeFile(path.join(payloadDir, "forkd-agent"), PLACEHOLDER_AGENT);
  await fs.writeFile(path.join(payloadDir, "worker.py"), "# placeholder\n");
  template = await loadTemplate("minimal");
});

after(async () => {
  if (savedCacheEnv === undefined) delete process.env.FORKD_IMAGE_CACHE;
  else process.env.FORKD_IMAGE_CACHE = savedCacheEnv;
  await fs.rm(dir, { recursive: true, force: true });
});

/** PIDs of processes whose command line mentions `needle` (e.g. a leaked mmdebstrap in our cache dir). */
async function processesMentioning(needle: string): Promise<string[]> {
  const found: string[] = [];
  for (const pid of await fs.readdir("/proc")) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmdline.includes(needle)) found.push(`${pid}: ${cmdline.replaceAll("\0", " ").slice(0, 200)}`);
  }
  return found;
}

async function cacheEntries(): Promise<string[]> {
  return (await fs.readdir(cacheDir).catch(() => [] as string[])).sort();
}

describe("image build", { skip: !isRoot && "image builds need root (mmdebstrap --mode=root)" }, () => {
  test("fails clearly when the guest payload is missing", async () => {
    await assert.rejects(
      buildImage(template, { payloadDir: path.join(dir, "no-payload") }),
      (err: unknown) => {
        assert.ok(err instanceof ForkdError);
        assert.equal(err.code, "unavailable");
        assert.match(err.message, /guest agent payload not found at .*no-payload.*npm run build/);
        return true;
      },
    );
    assert.deepEqual(
      (await cacheEntries()).filter((e) => e.startsWith(".staging")),
      [],
    );
  });

  test("a package the host's apt does not know fails fast, naming the template and the package", async () => {
    const file = path.join(dir, "typo.toml");
    await fs.writeFile(
      file,
      'name = "typo"\ninterpreter = "none"\npackages = ["git", "no-such-package-forkd"]\n',
    );
    const started = performance.now();
    await assert.rejects(
      buildImage(await loadTemplate(file, { allowFiles: true }), { payloadDir }),
      (err: unknown) => {
        assert.ok(err instanceof ForkdError);
        assert.equal(err.code, "invalid_argument");
        assert.ok(err.message.startsWith(`${file}: field "packages"`), err.message);
        assert.match(err.message, /not found in the host's apt sources: no-such-package-forkd \(/);
        return true;
      },
    );
    assert.ok(performance.now() - started < 20_000, "before any package is installed");
    assert.deepEqual(
      (await cacheEntries()).filter((e) => e.startsWith(".staging")),
      [],
    );
  });

  test("a cancelled build leaves no image, no staging directory and no process behind", {
    timeout: 300_000,
  }, async () => {
    const controller = new AbortController();
    const seen: BuildProgressEvent[] = [];
    const fallback = setTimeout(() => controller.abort(), 60_000);
    const promise = buildImage(template, {
      payloadDir,
      signal: controller.signal,
      onProgress: (e) => {
        seen.push(e);
        // Cancel mid-mmdebstrap, while it has packages half-installed in the tree.
        if (e.step === "rootfs" && e.phase === "progress" && /extracting|installing/.test(e.message)) {
          controller.abort();
        }
      },
    });
    try {
      // The caller's abort reason comes back (here the default AbortError), as everywhere in forkd.
      await assert.rejects(promise, (err: unknown) => err instanceof Error && err.name === "AbortError");
    } finally {
      clearTimeout(fallback);
    }
    assert.ok(
      seen.some((e) => e.step === "rootfs" && e.phase === "progress"),
      "the build was cancelled while building the root filesystem",
    );
    // Only the caches of finished, self-contained parts may remain (the kernel chain can complete first).
    assert.deepEqual(
      (await cacheEntries()).filter((e) => e !== ".boot"),
      [".apt-resolution.json"],
    );
    let leaked: string[] = [];
    for (let i = 0; i < 20; i++) {
      leaked = await processesMentioning(cacheDir);
      if (leaked.length === 0) break;
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.deepEqual(leaked, []);
    const mountinfo = await fs.readFile("/proc/self/mountinfo", "utf8");
    assert.ok(!mountinfo.includes(cacheDir), "nothing mounted under the cache");
    // The kernel chain this build may have finished must not make the next case's cold builds warm (it then
    // saw no initramfs step on a loaded machine).
    await fs.rm(path.join(cacheDir, ".boot"), { recursive: true, force: true });
  });

  test("two concurrent cold builds of one recipe produce one complete image", {
    timeout: 900_000,
  }, async () => {
    const started = performance.now();
    const steps = new Set<string>();
    const [a, b] = await Promise.all([
      buildImage(template, { payloadDir, onProgress: (e) => e.phase === "done" && steps.add(e.step) }),
      buildImage(template, { payloadDir }),
    ]);
    const seconds = (performance.now() - started) / 1000;
    console.log(`# two concurrent cold builds of minimal: ${seconds.toFixed(1)} s`);
    for (const s of ["resolve", "kernel", "initramfs", "rootfs", "filesystem", "finalize"])
      assert.ok(steps.has(s), s);

    assert.equal(a.hash, b.hash);
    assert.equal(a.dir, b.dir);
    assert.deepEqual(
      [a.cached, b.cached].sort(),
      [false, true],
      "one build published, the other discarded its own",
    );
    assert.equal(a.manifest.buildId, b.manifest.buildId);
    assert.equal(a.dir, path.join(cacheDir, a.hash));
    assert.deepEqual(await cacheEntries(), [".apt-resolution.json", ".boot", a.hash]);
    built = a;
  });

  test("the kernel and initramfs are reused by other recipes with the same kernel", async () => {
    assert.ok(built, "needs the cold build");
    const { boot, distro } = await resolveRecipe(template, { payloadDir });
    const staging = await createStaging(path.join(dir, "other-cache-user"), built.hash);
    const events: BuildProgressEvent[] = [];
    const savedPath = process.env.PATH;
    process.env.PATH = path.join(dir, "empty-bin"); // no apt-get, dpkg-deb or cpio: only the cache can answer
    try {
      const parts = await buildBootParts({
        boot,
        arch: distro.arch,
        cacheDir,
        staging,
        emit: (e) => events.push(e),
        signal: new AbortController().signal,
        force: false,
      });
      assert.deepEqual(parts.modules, built.manifest.modules);
      assert.equal(parts.release, built.manifest.kernel.release);
    } finally {
      process.env.PATH = savedPath;
    }
    assert.ok(events.some((e) => e.phase === "done" && /\(cached\)/.test(e.message)));
    for (const name of ["vmlinuz", "initrd.img", "probe-initrd.img"]) {
      assert.ok(
        (await fs.readFile(path.join(staging.out, name))).equals(
          await fs.readFile(path.join(built.dir, name)),
        ),
      );
    }
    await removeStaging(staging.dir);
  });

  test("the image has a kernel, both initramfs images and a valid ext4 with the agent", async () => {
    assert.ok(built, "needs the cold build");
    assert.deepEqual((await fs.readdir(built.dir)).sort(), [
      "image.json",
      "initrd.img",
      "probe-initrd.img",
      "rootfs.ext4",
      "vmlinuz",
    ]);
    const header = Buffer.alloc(4);
    const kernel = await fs.open(built.kernel, "r");
    await kernel.read(header, 0, 4, 0x202);
    await kernel.close();
    assert.equal(header.toString(), "HdrS", "vmlinuz is a bzImage");
    for (const initrd of [built.initrd, built.probeInitrd]) {
      assert.equal((await fs.readFile(initrd)).subarray(0, 6).toString(), "070701");
    }
    assert.equal((await fs.stat(built.rootfs)).size, template.diskMib * 1024 * 1024);
    await execFileAsync("e2fsck", ["-f", "-n", built.rootfs]);

    assert.equal(await debugfsCat(built.rootfs, "/opt/forkd/forkd-agent"), PLACEHOLDER_AGENT);
    assert.equal((await debugfsStat(built.rootfs, "/opt/forkd/forkd-agent")).mode & 0o111, 0o111);
    assert.match(
      await debugfsCat(built.rootfs, "/etc/passwd"),
      /^user:x:1000:1000::\/home\/user:\/bin\/bash$/m,
    );
    assert.equal((await debugfsStat(built.rootfs, "/home/user")).uid, 1000);
    assert.deepEqual(JSON.parse(await debugfsCat(built.rootfs, "/opt/forkd/template.json")), {
      name: "minimal",
      interpreter: "none",
    });
    assert.equal(await debugfsCat(built.rootfs, "/etc/hostname"), "forkd\n");
    // Login shells without `id -u` under bash or `mesg n` without a terminal (trimLoginProfiles).
    assert.match(await debugfsCat(built.rootfs, "/etc/profile"), /\[ "\$EUID" -eq 0 \]/);
    assert.match(await debugfsCat(built.rootfs, "/root/.profile"), /^if \[ -t 0 \]; then\n {2}mesg n/m);
    assert.equal((await debugfsStat(built.rootfs, "/")).uid, 0);
    await assert.rejects(debugfsStat(built.rootfs, "/usr/bin/node"), "minimal has no Node.js");
    await assert.rejects(debugfsStat(built.rootfs, "/usr/bin/tini"), "minimal has no tini");
    await assert.rejects(debugfsStat(built.rootfs, "/usr/bin/python3"), "minimal has no Python");

    const m = built.manifest;
    assert.equal(m.hash, built.hash);
    assert.equal(m.recipe.template.name, "minimal");
    assert.equal(m.recipe.kernelPackage, `linux-image-${m.kernel.release}`);
    assert.equal(m.modules.at(-1), "ext4");
    assert.equal(m.files["rootfs.ext4"]?.size, template.diskMib * 1024 * 1024);
    assert.match(m.files.vmlinuz?.sha256 ?? "", /^[0-9a-f]{64}$/);
    assert.deepEqual(built.template, m.recipe.template);
    const onDisk = JSON.parse(await fs.readFile(path.join(built.dir, "image.json"), "utf8"));
    assert.deepEqual(onDisk, m);
  });

  test("a second build of the same recipe is a fast cache hit", async () => {
    assert.ok(built, "needs the cold build");
    const started = performance.now();
    const again = await buildImage(template, { payloadDir });
    const ms = performance.now() - started;
    console.log(`# cached build: ${ms.toFixed(0)} ms`);
    assert.equal(again.cached, true);
    assert.equal(again.manifest.buildId, built.manifest.buildId);
    assert.ok(ms < 3000, `cache hit took ${ms} ms`);
    assert.equal((await findCachedImage(template, { payloadDir }))?.manifest.buildId, built.manifest.buildId);
    assert.equal((await readImage(built.hash))?.dir, built.dir);

    const otherPayload = path.join(dir, "payload2");
    await fs.cp(payloadDir, otherPayload, { recursive: true });
    await fs.appendFile(path.join(otherPayload, "forkd-agent"), "// changed\n");
    assert.equal(
      await findCachedImage(template, { payloadDir: otherPayload }),
      undefined,
      "payload is in the recipe",
    );
  });

  test("the image boots through the initramfs into the agent", { timeout: 240_000 }, async () => {
    assert.ok(built, "needs the cold build");
    const result = await bootGuest({
      workDir: dir,
      kernel: built.kernel,
      initrd: built.initrd,
      disk: built.rootfs,
      memoryMib: template.memoryMib,
    });
    assert.ok(
      result.console.includes(`${AGENT_MARKER} {"name":"minimal","interpreter":"none"}`),
      `agent did not start:\n${result.console}`,
    );
  });
});
