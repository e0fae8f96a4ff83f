/**
 * unpack against damaged and hostile packs, without VMs: a small synthetic chain (chains-synthetic.ts: t0 flat
 * -> t1 layer, on the pyagent image) is packed, then taken apart and re-made with GNU tar the way an attacker
 * would (with every hash re-signed where the attack needs it). Every variant must be refused with an error naming the problem, and
 * leave nothing behind. The happy path on real VMs is in packs.test.ts.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { appendFile, cp, link, mkdir, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { ForkdError } from "../../src/common/errors.js";
import { verifyImage } from "../../src/controller/machines/restore-plan.js";
import { packSnapshot } from "../../src/controller/snapshots/pack.js";
import { unpackSnapshot } from "../../src/controller/snapshots/unpack.js";
import {
  buildImage,
  importedImagesDir,
  loadTemplate,
  readImage,
  readImageDir,
} from "../../src/image/index.js";
import { manifestDigest } from "../../src/store/chain.js";
import { SnapshotStore } from "../../src/store/snapshot-store.js";
import { entries, tempHome } from "../support/host.js";
import { syntheticChain } from "./chains-synthetic.js";

const run = promisify(execFile);

type Home = Awaited<ReturnType<typeof tempHome>>;

const isCode = (code: string, pattern: RegExp) => (err: unknown) => {
  assert.ok(err instanceof ForkdError, String(err));
  assert.equal(err.code, code, err.message);
  assert.match(err.message, pattern);
  return true;
};

const sha256 = (bytes: Buffer) => createHash("sha256").update(bytes).digest("hex");

interface PackJson {
  chain: { tag: string; manifestSha256: string }[];
  files: { path: string; size: number; sha256: string }[];
}

/**
 * Re-signs an extracted pack as a thorough attacker would: every snapshot manifest's file hashes, the digest
 * edges root to head, and the pack manifest's chain and file list all made consistent with the tree.
 */
async function resign(dir: string): Promise<void> {
  const packFile = path.join(dir, "forkd-pack.json");
  const pack = JSON.parse(await readFile(packFile, "utf8")) as PackJson;
  let parentDigest: string | null = null;
  for (const link of pack.chain) {
    const manifestFile = path.join(dir, "snapshots", link.tag, "manifest.json");
    const m = JSON.parse(await readFile(manifestFile, "utf8")) as {
      files: Record<string, { size: number; sha256: string }>;
      parent: { tag: string; manifestSha256: string } | null;
    };
    for (const name of Object.keys(m.files)) {
      const bytes = await readFile(path.join(dir, "snapshots", link.tag, name));
      m.files[name] = { size: bytes.length, sha256: sha256(bytes) };
    }
    if (m.parent && parentDigest) m.parent.manifestSha256 = parentDigest;
    const text = Buffer.from(`${JSON.stringify(m, null, 2)}\n`);
    await writeFile(manifestFile, text);
    link.manifestSha256 = sha256(text);
    parentDigest = link.manifestSha256;
  }
  await relist(dir, pack);
}

/** Recomputes the pack manifest's sizes and hashes from the tree (a "consistent" pack of tampered files). */
async function relist(dir: string, pack?: PackJson): Promise<void> {
  const packFile = path.join(dir, "forkd-pack.json");
  const json = pack ?? (JSON.parse(await readFile(packFile, "utf8")) as PackJson);
  for (const f of json.files) {
    const bytes = await readFile(path.join(dir, f.path));
    f.size = bytes.length;
    f.sha256 = sha256(bytes);
  }
  await writeFile(packFile, JSON.stringify(json, null, 2));
}

describe("unpack refuses damaged and hostile packs (no VM)", { timeout: 10 * 60_000 }, () => {
  let source: Home;
  let target: Home;
  let work: string;
  let goodPack: string;
  let tree: string;
  let order: string[];
  let n = 0;

  before(async () => {
    source = await tempHome("forkd-packs-src-");
    target = await tempHome("forkd-packs-dst-");
    work = path.join(source.home, "work");
    await mkdir(work);
    await syntheticChain(source);
    goodPack = path.join(work, "good.tar.zst");
    await packSnapshot(source, { tag: "t1", out: goodPack, withoutImage: true });
    tree = path.join(work, "tree");
    await mkdir(tree);
    await run("tar", ["-x", "--zstd", "-f", goodPack, "-C", tree]);
    const pack = JSON.parse(await readFile(path.join(tree, "forkd-pack.json"), "utf8")) as PackJson;
    order = ["forkd-pack.json", ...pack.files.map((f) => f.path)];
  });
  after(async () => {
    await source.cleanup();
    await target.cleanup();
  });

  /** A copy of the good pack's tree, changed by `mutate`, packed with GNU tar in `paths` order. */
  async function craft(
    mutate: (dir: string) => Promise<void>,
    tarArgs: (dir: string) => string[] = () => order,
  ): Promise<string> {
    const dir = path.join(work, `craft-${++n}`);
    await cp(tree, dir, { recursive: true, verbatimSymlinks: true });
    await mutate(dir);
    const tarFile = path.join(work, `craft-${n}.tar`);
    await run("tar", ["-c", "-f", tarFile, "-C", dir, "--no-recursion", ...tarArgs(dir)]);
    await run("zstd", ["-q", "--rm", tarFile, "-o", `${tarFile}.zst`]);
    return `${tarFile}.zst`;
  }

  async function expectRefused(file: string, pattern: RegExp, code = "unprocessable"): Promise<void> {
    await assert.rejects(unpackSnapshot(target, { file }), (err: unknown) => {
      assert.ok(err instanceof ForkdError, String(err));
      assert.equal(err.code, code, err.message);
      assert.match(err.message, pattern);
      return true;
    });
    // Nothing installed, nothing half-written left behind.
    assert.deepEqual(await entries(target.snapshots), []);
  }

  it("the untouched pack unpacks (and a re-unpack keeps the identical layers)", async () => {
    const home = await tempHome("forkd-packs-ok-");
    try {
      const first = await unpackSnapshot(home, { file: goodPack });
      assert.deepEqual([first.installed, first.reused, first.image], [["t0", "t1"], [], "present"]);
      const store = new SnapshotStore(home.snapshots);
      // Same image cache, same tags: byte-for-byte the source's manifests, so the digests match too.
      for (const tag of ["t0", "t1"]) {
        assert.equal(
          await manifestDigest(await store.get(tag)),
          await manifestDigest(await new SnapshotStore(source.snapshots).get(tag)),
        );
      }
      const again = await unpackSnapshot(home, { file: goodPack });
      assert.deepEqual([again.installed, again.reused], [[], ["t0", "t1"]]);
      const renamed = await unpackSnapshot(home, { file: goodPack, tag: "t1-copy" });
      assert.deepEqual([renamed.head, renamed.installed, renamed.reused], ["t1-copy", ["t1-copy"], ["t0"]]);
      assert.equal((await store.get("t1-copy")).manifest.tag, "t1-copy");
      await assert.rejects(unpackSnapshot(home, { file: goodPack, tag: "t0" }), /names another layer/);
    } finally {
      await home.cleanup();
    }
  });

  it("a flipped byte anywhere is refused, naming the entry", async () => {
    for (const victim of ["snapshots/t1/memory.layer", "snapshots/t0/memory.bin", "snapshots/t1/vmstate"]) {
      const pack = await craft(async (dir) => {
        const file = path.join(dir, victim);
        const bytes = await readFile(file);
        const at = victim.endsWith("memory.bin") ? 4096 * 100 + 17 : bytes.length - 1;
        bytes[at] = (bytes[at] as number) ^ 0x01;
        await writeFile(file, bytes);
      });
      await expectRefused(pack, new RegExp(`"${victim}" is corrupted \\(sha256 mismatch\\)`));
    }
  });

  it("a tampered file with a re-listed pack manifest still disagrees with its snapshot's manifest", async () => {
    const pack = await craft(async (dir) => {
      await appendFile(path.join(dir, "snapshots/t1/vmstate"), "x");
      await relist(dir);
    });
    await expectRefused(pack, /"snapshots\/t1\/vmstate" refused: does not match layer t1's own manifest/);
  });

  it("refuses symbolic links, hard links, absolute paths, '..', duplicates and unexpected entries", async () => {
    const cases: [string, (dir: string) => Promise<void>, (dir: string) => string[], RegExp][] = [
      [
        "symlink",
        (dir) => symlink("/etc/passwd", path.join(dir, "snapshots/t1/evil")),
        () => [...order.slice(0, 3), "snapshots/t1/evil", ...order.slice(3)],
        /"snapshots\/t1\/evil" refused: it is a symbolic link/,
      ],
      [
        "hard link",
        (dir) => link(path.join(dir, "snapshots/t1/vmstate"), path.join(dir, "snapshots/t1/evil")),
        () => [...order, "snapshots/t1/evil"],
        /refused: it is a hard link/,
      ],
      [
        "absolute path",
        async () => {},
        () => ["-P", ...order.slice(0, 2), path.join(tree, "snapshots/t1/vmstate"), ...order.slice(2)],
        /refused: absolute path/,
      ],
      [
        "path traversal",
        async () => {},
        () => ["-P", "--transform", "s,^snapshots/t1/vmstate$,snapshots/../../evil,", ...order],
        /refused: path traversal/,
      ],
      [
        "duplicate entry",
        async () => {},
        // Without --hard-dereference GNU tar stores the second copy as a hard link.
        () => ["--hard-dereference", ...order.slice(0, 3), order[2] as string, ...order.slice(3)],
        /"snapshots\/t1\/manifest.json" refused: duplicate entry/,
      ],
      [
        "unexpected file",
        (dir) => writeFile(path.join(dir, "snapshots/t1/extra.bin"), "x"),
        () => [...order.slice(0, 3), "snapshots/t1/extra.bin", ...order.slice(3)],
        /"snapshots\/t1\/extra.bin" refused: unexpected entry/,
      ],
      [
        "file outside the layout",
        (dir) => writeFile(path.join(dir, "run.sh"), "x"),
        () => [...order.slice(0, 1), "run.sh", ...order.slice(1)],
        /"run.sh" refused: unexpected entry/,
      ],
      [
        "manifest not first",
        async () => {},
        () => [...order.slice(1, 2), order[0] as string, ...order.slice(2)],
        /not a forkd pack: its first entry is "snapshots\/t0\/manifest.json"/,
      ],
    ];
    for (const [name, mutate, args, pattern] of cases) {
      const pack = await craft(mutate, args);
      await assert.doesNotReject(expectRefused(pack, pattern), name);
    }
  });

  it("refuses an entry longer than the manifest says, a truncated pack, and what is not a pack", async () => {
    const longer = await craft((dir) => appendFile(path.join(dir, "snapshots/t1/vmstate"), "x"));
    await expectRefused(longer, /"snapshots\/t1\/vmstate" refused: 4097 bytes, the pack manifest says 4096/);
    const whole = await readFile(goodPack);
    const truncated = path.join(work, "truncated.tar.zst");
    await writeFile(truncated, whole.subarray(0, Math.floor(whole.length / 2)));
    await expectRefused(truncated, /zstd could not decompress the pack|truncated|incomplete/);
    const garbage = path.join(work, "garbage.tar.zst");
    await writeFile(garbage, randomBytes(4096));
    await expectRefused(garbage, /zstd could not decompress the pack/);
    await assert.rejects(unpackSnapshot(target, { file: path.join(work, "missing.tar.zst") }), /not found/);
  });

  it("refuses disk layers that would read host files, even in a fully re-signed pack", async () => {
    const outside = await craft(async (dir) => {
      await run("qemu-img", [
        "rebase",
        "-u",
        "-f",
        "qcow2",
        "-b",
        "/etc/passwd",
        "-F",
        "raw",
        path.join(dir, "snapshots/t1/disk.qcow2"),
      ]);
      await resign(dir);
    });
    await expectRefused(outside, /packed snapshot t1: disk layer refused: backing file is "\/etc\/passwd"/);
    const probed = await craft(async (dir) => {
      // No backing format (its header extension renamed to one QEMU ignores): QEMU would probe the backing
      // file's format, and a raw file can pose as qcow2.
      const disk = path.join(dir, "snapshots/t0/disk.qcow2");
      const bytes = await readFile(disk);
      const at = bytes.subarray(0, 65536).indexOf(Buffer.from([0xe2, 0x79, 0x2a, 0xca]));
      assert.ok(at > 0);
      bytes.writeUInt32BE(0x12345678, at);
      await writeFile(disk, bytes);
      await resign(dir);
    });
    await expectRefused(
      probed,
      /packed snapshot t0: disk layer refused: backing format is null, expected raw/,
    );
    const dataFile = await craft(async (dir) => {
      const disk = path.join(dir, "snapshots/t0/disk.qcow2");
      await rm(disk);
      await run("qemu-img", ["create", "-q", "-f", "qcow2", "-o", `data_file=/etc/hostname`, disk, "1M"]);
      await resign(dir);
    });
    await expectRefused(dataFile, /packed snapshot t0: disk layer refused: it uses an external data file/);
  });

  it("refuses a re-signed chain whose edges, machine or image do not hold together", async () => {
    const unlinked = await craft(async (dir) => {
      await resign(dir);
      // Break t1's edge after signing: its recorded parent digest no longer names the packed t0.
      const file = path.join(dir, "snapshots/t1/manifest.json");
      const m = JSON.parse(await readFile(file, "utf8")) as { parent: { manifestSha256: string } };
      m.parent.manifestSha256 = "0".repeat(64);
      await writeFile(file, `${JSON.stringify(m, null, 2)}\n`);
      const pack = JSON.parse(await readFile(path.join(dir, "forkd-pack.json"), "utf8")) as PackJson;
      (pack.chain[1] as { manifestSha256: string }).manifestSha256 = sha256(await readFile(file));
      await relist(dir, pack);
    });
    await expectRefused(unlinked, /layer t1 does not sit on the layer below it/);
    for (const [field, value, pattern, code] of [
      ["cpu", "max,+vmx", /CPU model "max,\+vmx" is not a plain name/, "unprocessable"],
      ["memoryMiB", 65536, /its RAM \(67108864 bytes\) is not the machine's 65536 MiB/, "unprocessable"],
      [
        "compatKey",
        "0".repeat(64),
        /layer t1 was taken on a machine configuration this forkd does not build/,
        "conflict",
      ],
    ] as const) {
      const machine = await craft(async (dir) => {
        const file = path.join(dir, "snapshots/t1/manifest.json");
        const m = JSON.parse(await readFile(file, "utf8")) as { machine: Record<string, unknown> };
        m.machine[field] = value;
        await writeFile(file, `${JSON.stringify(m, null, 2)}\n`);
        await resign(dir);
      });
      await expectRefused(machine, pattern, code);
    }
    const otherImage = await craft(async (dir) => {
      const pack = JSON.parse(await readFile(path.join(dir, "forkd-pack.json"), "utf8")) as {
        image: { hash: string };
      };
      pack.image.hash = "a".repeat(64);
      await writeFile(path.join(dir, "forkd-pack.json"), JSON.stringify(pack));
    });
    await expectRefused(
      otherImage,
      /pack has no image and image aaaaaaaaaaaa .* is not cached here/,
      "conflict",
    );
  });

  /**
   * A pack that carries its own "image" under the genuine pyagent recipe hash (a consistent, fully re-signed pack:
   * image.json copied from the real one with the attacker's files' hashes and another build id).
   */
  async function craftImagePack(options: { lie?: boolean } = {}): Promise<{ file: string; hash: string }> {
    const genuine = await buildImage(await loadTemplate("pyagent"), {});
    const file = await craft(
      async (dir) => {
        const packFile = path.join(dir, "forkd-pack.json");
        const pack = JSON.parse(await readFile(packFile, "utf8")) as PackJson & {
          image: { hash: string; buildId: string; included: boolean };
        };
        pack.image = { hash: genuine.hash, buildId: "attacker-build", included: true };
        for (const link of pack.chain) {
          const m = path.join(dir, "snapshots", link.tag, "manifest.json");
          const json = JSON.parse(await readFile(m, "utf8")) as { image: { buildId: string } };
          json.image.buildId = "attacker-build";
          await writeFile(m, `${JSON.stringify(json, null, 2)}\n`);
        }
        const imageDir = path.join(dir, "image", genuine.hash);
        await mkdir(imageDir, { recursive: true });
        const manifest = {
          ...genuine.manifest,
          buildId: "attacker-build",
          files: {} as Record<string, unknown>,
        };
        for (const name of ["vmlinuz", "initrd.img", "probe-initrd.img", "rootfs.ext4"]) {
          const bytes = Buffer.from(`attacker's ${name}\n`);
          await writeFile(path.join(imageDir, name), bytes);
          manifest.files[name] = { size: bytes.length, sha256: options.lie ? "0".repeat(64) : sha256(bytes) };
        }
        await writeFile(path.join(imageDir, "image.json"), JSON.stringify(manifest));
        for (const name of ["image.json", "vmlinuz", "initrd.img", "probe-initrd.img", "rootfs.ext4"]) {
          pack.files.push({ path: `image/${genuine.hash}/${name}`, size: 0, sha256: "" });
        }
        await writeFile(packFile, JSON.stringify(pack, null, 2));
        await resign(dir);
      },
      (dir) => [
        "forkd-pack.json",
        ...(JSON.parse(readFileSync(path.join(dir, "forkd-pack.json"), "utf8")) as PackJson).files.map(
          (f) => f.path,
        ),
      ],
    );
    return { file, hash: genuine.hash };
  }

  it("an image inside a pack never poisons the cache: builds of the genuine template keep their own image", async () => {
    const home = await tempHome("forkd-packs-poison-");
    const { file, hash } = await craftImagePack();
    const genuine = await readImage(hash);
    const imported = importedImagesDir(home.images, "attacker-build");
    try {
      const unpacked = await unpackSnapshot(home, { file });
      assert.equal(unpacked.image, "installed");
      // What a later build of pyagent finds is the image built here, byte for byte as before.
      const after = await buildImage(await loadTemplate("pyagent"), {});
      assert.equal(after.manifest.buildId, genuine?.manifest.buildId);
      assert.equal(after.dir, path.join(home.images, hash));
      assert.equal(
        sha256(await readFile(after.kernel)),
        genuine?.manifest.files.vmlinuz?.sha256,
        "the built kernel is untouched",
      );
      // The pack's snapshots run on the pack's own image, which says where it came from.
      const t0 = await new SnapshotStore(home.snapshots).get("t0");
      assert.equal(path.dirname(t0.manifest.image.rootfs), path.join(imported, hash));
      const installed = await readImageDir(imported, hash);
      assert.equal(installed?.manifest.origin, "imported");
      // Changed behind forkd's back, it is refused before anything boots on it.
      await verifyImage(home, t0.manifest.image);
      const kernel = path.join(imported, hash, "vmlinuz");
      const bytes = await readFile(kernel);
      bytes[0] = (bytes[0] as number) ^ 0x20;
      await writeFile(kernel, bytes);
      await assert.rejects(verifyImage(home, t0.manifest.image), /vmlinuz is corrupted \(sha256 mismatch\)/);
      await appendFile(kernel, "x");
      await assert.rejects(verifyImage(home, t0.manifest.image), /is no longer cached complete/);
    } finally {
      await rm(imported, { recursive: true, force: true });
      await home.cleanup();
    }
  });

  it("refuses a packed image.json that does not describe the packed image files, or a missing image", async () => {
    const { file } = await craftImagePack({ lie: true });
    const noImage = await craft(async (dir) => {
      const packFile = path.join(dir, "forkd-pack.json");
      const pack = JSON.parse(await readFile(packFile, "utf8")) as {
        image: { buildId: string; included: boolean };
      };
      pack.image = { ...pack.image, buildId: "attacker-build", included: true };
      await writeFile(packFile, JSON.stringify(pack));
    });
    try {
      await expectRefused(file, /the packed image.json does not describe the packed vmlinuz/);
      await expectRefused(noImage, /pack says it includes its image but lists no image.json, vmlinuz/);
    } finally {
      await rm(importedImagesDir(target.images, "attacker-build"), { recursive: true, force: true });
    }
  });

  it("a failure while publishing undoes every rename: all layers or none", async () => {
    const home = await tempHome("forkd-packs-rollback-");
    try {
      // Another writer creates t1 after the checks, just before the layers are renamed into place.
      const race = (message: string) => {
        if (message !== "publishing") return;
        mkdirSync(path.join(home.snapshots, "t1"));
        writeFileSync(path.join(home.snapshots, "t1", "theirs"), "x");
      };
      await assert.rejects(
        unpackSnapshot(home, { file: goodPack, onProgress: race }),
        isCode("conflict", /snapshot t1 was created by someone else meanwhile/),
      );
      assert.deepEqual(await readdir(home.snapshots), ["t1"], "t0 was taken back; no staging left");
      assert.deepEqual(await readdir(path.join(home.snapshots, "t1")), ["theirs"]);
    } finally {
      await home.cleanup();
    }
  });

  it("refuses to overwrite existing snapshots unless --force, and --force replaces them", async () => {
    const home = await tempHome("forkd-packs-force-");
    try {
      await unpackSnapshot(home, { file: goodPack });
      const store = new SnapshotStore(home.snapshots);
      const before = await manifestDigest(await store.get("t1"));
      const changed = await craft(async (dir) => {
        await writeFile(path.join(dir, "snapshots/t1/vmstate"), randomBytes(4096));
        await resign(dir);
      });
      await assert.rejects(unpackSnapshot(home, { file: changed }), (err: unknown) => {
        assert.ok(err instanceof ForkdError && err.code === "conflict");
        assert.match(err.message, /snapshot t1 already exists and differs from the packed one.*--force/);
        return true;
      });
      assert.equal(await manifestDigest(await store.get("t1")), before, "untouched after the refusal");
      const forced = await unpackSnapshot(home, { file: changed, force: true });
      assert.deepEqual([forced.installed, forced.reused, forced.replaced], [["t1"], ["t0"], ["t1"]]);
      assert.notEqual(await manifestDigest(await store.get("t1")), before);
      assert.deepEqual(
        (await readdir(home.snapshots)).sort(),
        ["t0", "t1"],
        "no staging or displaced directories left",
      );
    } finally {
      await home.cleanup();
    }
  });
});
