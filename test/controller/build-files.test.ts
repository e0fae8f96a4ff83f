/**
 * The archives template builds' copy steps take (controller/builds/build-files.ts), with real tar archives made by
 * node-tar and hostile ones written header by header: a good upload (gzip or plain) is stored per tenant and
 * unpacks; an archive with an escaping path, a device or a hard link, an oversized upload and an archive that
 * unpacks past the limit are refused and nothing is published under the hash.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { after, before, describe, it } from "node:test";
import { gzipSync } from "node:zlib";
import { create, Header } from "tar";
import { ForkdError } from "../../src/common/errors.js";
import { BuildFiles } from "../../src/controller/builds/build-files.js";

const HASH = "a".repeat(64);

/** One tar entry (header block, then the data padded to 512) with whatever fields a hostile client picks. */
function rawEntry(fields: ConstructorParameters<typeof Header>[0], data = ""): Buffer {
  const header = new Header({ mode: 0o644, mtime: new Date(0), size: data.length, ...fields });
  const block = Buffer.alloc(512);
  header.encode(block, 0);
  const body = Buffer.alloc(Math.ceil(data.length / 512) * 512);
  body.write(data);
  return Buffer.concat([block, body]);
}

const archive = (...entries: Buffer[]) => Buffer.concat([...entries, Buffer.alloc(1024)]);

describe("template build files", () => {
  let dir: string;
  let context: string;

  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-build-files-"));
    context = path.join(dir, "context");
    await fs.mkdir(path.join(context, "site", "docs"), { recursive: true });
    await fs.writeFile(path.join(context, "site", "index.html"), "hello\n");
    await fs.writeFile(path.join(context, "site", "docs", "a.txt"), "nested\n");
    await fs.symlink("index.html", path.join(context, "site", "home.html"));
  });

  after(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  async function tarOf(gzip: boolean): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const chunk of create({ cwd: context, gzip, portable: true }, ["site"])) chunks.push(chunk);
    return Buffer.concat(chunks);
  }

  for (const gzip of [true, false]) {
    it(`stores a ${gzip ? "gzipped" : "plain"} upload per tenant and unpacks it`, async () => {
      const files = new BuildFiles(path.join(dir, `store-${gzip}`));
      await files.put(HASH, Readable.from([await tarOf(gzip)]), "team-a");
      assert.equal(await files.has(HASH, "team-a"), true);
      assert.equal(await files.has(HASH, "team-b"), false, "another tenant's hash is not this one's");
      assert.equal(await files.has(HASH, null), false);
      const dest = path.join(dir, `unpacked-${gzip}`);
      await files.unpack(HASH, "team-a", dest);
      assert.equal(await fs.readFile(path.join(dest, "site", "docs", "a.txt"), "utf8"), "nested\n");
      assert.equal(await fs.readlink(path.join(dest, "site", "home.html")), "index.html");
      await assert.rejects(files.unpack(HASH, "team-b", path.join(dir, "nothing")), /no files were uploaded/);
    });
  }

  const hostile: [string, Buffer, RegExp][] = [
    ["a path climbing out", archive(rawEntry({ path: "../evil", type: "File" }, "x")), /climbs out/],
    ["an absolute path", archive(rawEntry({ path: "/etc/evil", type: "File" }, "x")), /is absolute/],
    ["a device", archive(rawEntry({ path: "dev-null", type: "CharacterDevice" })), /CharacterDevice/],
    [
      "a hard link",
      archive(
        rawEntry({ path: "a", type: "File" }, "x"),
        rawEntry({ path: "b", type: "Link", linkpath: "a" }),
      ),
      /is a Link/,
    ],
    ["no entries", Buffer.alloc(1024), /not a (readable )?tar archive/],
    ["not a tar archive", gzipSync(Buffer.from("just text")), /not a readable tar archive|not a tar archive/],
  ];
  for (const [what, body, message] of hostile) {
    it(`refuses ${what} and publishes nothing`, async () => {
      const store = path.join(dir, "hostile");
      const files = new BuildFiles(store);
      await assert.rejects(files.put(HASH, Readable.from([body]), null), (err: unknown) => {
        assert.ok(err instanceof ForkdError, String(err));
        assert.equal(err.code, "invalid_argument");
        assert.match(err.message, message);
        return true;
      });
      assert.equal(await files.has(HASH, null), false);
      assert.deepEqual(await fs.readdir(path.join(store, "admin")), [], "no temporary file left");
    });
  }

  it("bounds the upload and what it unpacks to", async () => {
    const big = archive(rawEntry({ path: "big", type: "File" }, "z".repeat(64 * 1024)));
    const small = new BuildFiles(path.join(dir, "small"), {
      maxUploadBytes: 8 * 1024,
      maxUnpackedBytes: 1 << 30,
      maxEntries: 10,
    });
    await assert.rejects(small.put(HASH, Readable.from([big]), null), /larger than 8192 bytes/);
    const bomb = new BuildFiles(path.join(dir, "bomb"), {
      maxUploadBytes: 1 << 20,
      maxUnpackedBytes: 16 * 1024,
      maxEntries: 10,
    });
    await assert.rejects(bomb.put(HASH, Readable.from([gzipSync(big)]), null), /unpacked is larger/);
    assert.equal(await bomb.has(HASH, null), false);
  });
});
