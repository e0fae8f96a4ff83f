/**
 * Snapshots through a real OCI registry (Debian's docker-registry, on loopback, plain HTTP): a chain of two
 * layers (a busybox template snapshot and a diff BRANCH of a sandbox with state) pushed from one home is
 * pulled into another home with another image cache and spawns there with its state; a second chain sharing
 * the base uploads only what is new, which the registry's own request log shows; pulls that cannot fit are
 * refused before anything is downloaded.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { checkReference, pullSnapshot, pushSnapshot } from "../../src/controller/snapshots/registry.js";
import { buildImage, loadTemplate } from "../../src/image/index.js";
import { debugfsCat } from "../image/helpers.js";
import { makeBusyboxLayout, saveArchive } from "../image/oci-fixtures.js";
import { entries, qemusMentioning, tempHome } from "../support/host.js";
import { freePort, Registry } from "../support/registry.js";

type Home = Awaited<ReturnType<typeof tempHome>>;
const isRoot = process.geteuid?.() === 0;

/** Digests whose upload was completed (the final PUT of an upload carries ?digest=, as the log's URI does). */
async function completedUploads(registry: Registry): Promise<string[]> {
  const out: string[] = [];
  for (const line of (await fs.readFile(registry.log, "utf8")).split("\n")) {
    if (!line.startsWith("{")) continue;
    const entry = JSON.parse(line) as Record<string, string>;
    const uri = entry["http.request.uri"] ?? "";
    if (
      entry.msg === "response completed" &&
      entry["http.request.method"] === "PUT" &&
      uri.includes("/blobs/uploads/")
    ) {
      const digest = /[?&]digest=(sha256(?:%3A|:)[0-9a-f]{64})/.exec(uri)?.[1]?.replace("%3A", ":");
      if (digest) out.push(digest);
    }
  }
  return out;
}

describe("snapshots through an OCI registry", { skip: !isRoot && "needs root", timeout: 30 * 60_000 }, () => {
  let homeA: Home;
  let homeB: Home;
  let imagesB: string;
  let dir: string;
  let registry: Registry;
  let repo: string;

  before(async () => {
    homeA = await tempHome("forkd-registry-a-");
    homeB = await tempHome("forkd-registry-b-");
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-registry-src-"));
    // Build steps run as the unprivileged build range, which must pass through the image cache's parents.
    await fs.chmod(dir, 0o711);
    imagesB = path.join(dir, "images-b");
    registry = new Registry(dir, await freePort());
    await registry.start();
    repo = `127.0.0.1:${registry.port}/forkd/chains`;
    const layout = await makeBusyboxLayout(path.join(dir, "img"));
    await saveArchive(layout, "oci-archive", path.join(dir, "image.tar"));
    await fs.writeFile(
      path.join(dir, "base.toml"),
      'format = 2\nname = "registry-base"\nmemory_mib = 256\ndisk_mib = 256\n[from]\narchive = "image.tar"\n',
    );
    await createSnapshot(homeA, {
      tag: "rb-base",
      template: path.join(dir, "base.toml"),
      templateFiles: true,
    });
    const services = await openServices(homeA);
    try {
      for (const [tag, state] of [
        ["rb-one", "one"],
        ["rb-two", "two"],
      ]) {
        const [source] = await services.sandboxes.spawn({ snapshotTag: "rb-base", n: 1, timeoutMs: 0 });
        const id = (source as { id: string }).id;
        await services.sandboxes.exec(id, ["sh", "-c", `mkdir -p /root && echo ${state} > /root/state.txt`]);
        await services.sandboxes.branch(id, { tag: tag as string, mode: "diff" });
        await services.sandboxes.kill(id);
      }
    } finally {
      await services.close({ killSandboxes: true });
    }
  });

  after(async () => {
    await registry?.stop();
    assert.deepEqual(await qemusMentioning(homeA.home), [], "no QEMU left running in A");
    assert.deepEqual(await qemusMentioning(homeB.home), [], "no QEMU left running in B");
    await homeA.cleanup();
    await homeB.cleanup();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it("push and pull round-trip a chain of two layers; the pulled chain spawns with its state", async () => {
    const pushed = await pushSnapshot(homeA, { tag: "rb-one", reference: `${repo}:one` });
    assert.deepEqual(pushed.chain, ["rb-base", "rb-one"]);
    assert.deepEqual(
      pushed.parts.map((p) => [p.part, p.uploaded]),
      [
        ["manifests", true],
        ["layer:rb-base", true],
        ["layer:rb-one", true],
        ["image", true],
      ],
    );
    const stored = await registry.blobs();
    for (const part of pushed.parts) assert.ok(stored.has(part.digest), `the registry stores ${part.part}`);

    const pathsB = { ...homeB, images: imagesB };
    const pulled = await pullSnapshot(pathsB, { reference: `${repo}:one` });
    assert.equal(pulled.digest, pushed.digest);
    assert.deepEqual(
      [pulled.head, pulled.installed, pulled.image],
      ["rb-one", ["rb-base", "rb-one"], "installed"],
    );
    assert.deepEqual((await entries(homeB.snapshots)).sort(), ["rb-base", "rb-one"]);
    assert.deepEqual(await entries(path.join(homeB.home, "cache", "registry")), [], "no transfer files left");
    const child = await forkChildren(pathsB, { tag: "rb-one", n: 1, exec: ["cat", "/root/state.txt"] });
    assert.equal(child.children[0]?.error, null);
    assert.equal(child.children[0]?.stdout, "one\n");

    // Pulling the same chain again installs nothing: every layer is there and identical.
    const again = await pullSnapshot(pathsB, { reference: `${repo}:one` });
    assert.deepEqual([again.installed, again.reused], [[], ["rb-base", "rb-one"]]);
  });

  it("a second push of a chain sharing the base uploads only the new layer", async () => {
    const uploadsBefore = await completedUploads(registry);
    const first = await pushSnapshot(homeA, { tag: "rb-one", reference: `${repo}:one-again` });
    const second = await pushSnapshot(homeA, { tag: "rb-two", reference: `${repo}:two` });
    const uploaded = (await completedUploads(registry)).slice(uploadsBefore.length);
    const byPart = Object.fromEntries(second.parts.map((p) => [p.part, p]));
    const base = byPart["layer:rb-base"];
    const image = byPart.image;
    assert.ok(base && image && byPart["layer:rb-two"] && byPart.manifests);
    assert.equal(
      base.digest,
      first.parts.find((p) => p.part === "layer:rb-base")?.digest,
      "the same base blob",
    );
    // From the registry's side: the base and image blobs were never uploaded again, the new layer was.
    assert.ok(!uploaded.includes(base.digest), "the base layer was not sent again");
    assert.ok(!uploaded.includes(image.digest), "the image was not sent again");
    assert.ok(uploaded.includes(byPart["layer:rb-two"]?.digest as string), "the new layer was sent");
    assert.ok(
      uploaded.every((d) => !first.parts.some((p) => p.digest === d && p.part !== "manifests")),
      `re-pushing rb-one sent none of its layers (uploads: ${uploaded.join(", ")})`,
    );
    // And from skopeo's: the base and image blobs were skipped as already present.
    assert.deepEqual(
      second.parts.map((p) => [p.part, p.uploaded]),
      [
        ["manifests", true],
        ["layer:rb-base", false],
        ["layer:rb-two", true],
        ["image", false],
      ],
    );
    const pathsB = { ...homeB, images: imagesB };
    const pulled = await pullSnapshot(pathsB, { reference: `${repo}:two` });
    assert.deepEqual([pulled.installed, pulled.reused], [["rb-two"], ["rb-base"]]);
    const child = await forkChildren(pathsB, { tag: "rb-two", n: 1, exec: ["cat", "/root/state.txt"] });
    assert.equal(child.children[0]?.stdout, "two\n");
  });

  it("refuses what is not a forkd snapshot, and a pack for another QEMU, before downloading anything", async () => {
    const pathsB = { ...homeB, images: imagesB };
    // An ordinary image in the same registry.
    const layout = path.join(dir, "img", "layout");
    const ordinary = `127.0.0.1:${registry.port}/plain/busybox:1`;
    await new Promise<void>((resolve, reject) => {
      const p = spawn("skopeo", [
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        `oci:${layout}:latest`,
        `docker://${ordinary}`,
      ]);
      p.on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`skopeo exited ${code}`))));
    });
    await assert.rejects(pullSnapshot(pathsB, { reference: ordinary }), /is not a forkd snapshot/);

    // rb-one's artifact with a pack manifest claiming another QEMU: refused on the manifest alone.
    const pushed = await pushSnapshot(homeA, { tag: "rb-one", reference: `${repo}:one` });
    const forged = path.join(dir, "forged");
    await fs.mkdir(path.join(forged, "blobs", "sha256"), { recursive: true });
    await fs.writeFile(path.join(forged, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}');
    const put = async (bytes: Buffer) => {
      const hex = createHash("sha256").update(bytes).digest("hex");
      await fs.writeFile(path.join(forged, "blobs", "sha256", hex), bytes);
      return { digest: `sha256:${hex}`, size: bytes.length };
    };
    const pulledConfig = await new Promise<string>((resolve, reject) => {
      let out = "";
      const p = spawn("skopeo", [
        "inspect",
        "--raw",
        "--config",
        "--tls-verify=false",
        `docker://${repo}:one`,
      ]);
      p.stdout.on("data", (d: Buffer) => {
        out += d.toString();
      });
      p.on("exit", (code) => (code === 0 ? resolve(out) : reject(new Error(`skopeo exited ${code}`))));
    });
    const config = await put(
      Buffer.from(JSON.stringify({ ...JSON.parse(pulledConfig), qemuVersion: "6.2.0" }, null, 2)),
    );
    const layers = [];
    for (const part of pushed.parts) {
      const bytes = Buffer.from(`not downloaded ${part.part}`);
      layers.push({ mediaType: "application/vnd.forkd.pack.part.v1.tar+zstd", ...(await put(bytes)) });
    }
    const manifest = await put(
      Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: { mediaType: "application/vnd.forkd.pack.v1+json", ...config },
          layers,
        }),
      ),
    );
    await fs.writeFile(
      path.join(forged, "index.json"),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [
          {
            mediaType: "application/vnd.oci.image.manifest.v1+json",
            ...manifest,
            annotations: { "org.opencontainers.image.ref.name": "f" },
          },
        ],
      }),
    );
    await new Promise<void>((resolve, reject) => {
      const p = spawn("skopeo", [
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        `oci:${forged}:f`,
        `docker://${repo}:forged`,
      ]);
      p.on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`skopeo exited ${code}`))));
    });
    const requestsBefore = (await registry.requests()).length;
    await assert.rejects(
      pullSnapshot(pathsB, { reference: `${repo}:forged`, tag: "forged" }),
      (err: unknown) => {
        assert.ok(err instanceof ForkdError && err.code === "conflict", String(err));
        assert.match(err.message, /made with QEMU 6\.2\.0/);
        return true;
      },
    );
    const blobGets = (await registry.requests())
      .slice(requestsBefore)
      .filter(([method, uri]) => method === "GET" && uri.includes("/blobs/") && !uri.endsWith(config.digest));
    assert.deepEqual(blobGets, [], "no part was downloaded");
    assert.ok(!(await entries(homeB.snapshots)).includes("forged"));
  });

  it("a template from.image pulls from the registry (plain HTTP on loopback) and builds", async () => {
    // The ordinary busybox image the previous test pushed.
    const file = path.join(dir, "from-registry.toml");
    await fs.writeFile(
      file,
      `format = 2\nname = "from-registry"\nmemory_mib = 256\ndisk_mib = 256\n[from]\nimage = "127.0.0.1:${registry.port}/plain/busybox:1"\n[[steps]]\nrun = "echo pulled > /pulled.txt"\n`,
    );
    const built = await buildImage(await loadTemplate(file, { allowFiles: true }), {
      cacheDir: path.join(dir, "images-registry"),
    });
    assert.equal(built.steps?.[0]?.cached, false);
    assert.match(built.steps?.[0]?.description ?? "", /^image 127\.0\.0\.1:\d+\/plain\/busybox:1$/);
    assert.equal(await debugfsCat(built.rootfs, "/pulled.txt"), "pulled\n");
    assert.match(
      await debugfsCat(built.rootfs, "/etc/passwd"),
      /^app:x:4242:/m,
      "the registry image's own files",
    );
  });

  it("TLS: plain HTTP only on loopback unless --insecure; references are checked", () => {
    assert.equal(checkReference("127.0.0.1:5000/a/b:1", false).tlsVerify, false);
    assert.equal(checkReference("localhost:5000/a:1", false).tlsVerify, false);
    assert.equal(checkReference("registry.example:5000/a:1", false).tlsVerify, true);
    assert.equal(checkReference("registry.example:5000/a:1", true).tlsVerify, false);
    assert.equal(checkReference("team/app:1", false).tlsVerify, true);
    assert.throws(() => checkReference("--help", false), /not a registry reference/);
    assert.throws(() => checkReference("host/UPPER:1", false), /not a registry reference/);
  });
});
