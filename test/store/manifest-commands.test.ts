/**
 * A snapshot manifest's record of its template's `start` command and `ready` check (what a cold boot runs again):
 * manifests written before forkd recorded them still parse; what a format-2 template's parent ran is recorded
 * with its users resolved against the image and parses back as it was; every field out of shape or bounds is
 * refused at read, naming where.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { guestCommandsOf } from "../../src/controller/machines/start-ready.js";
import { type BuiltImage, parseTemplate } from "../../src/image/index.js";
import { MANIFEST_FORMAT, parseManifest, type SnapshotManifest } from "../../src/store/manifest.js";

/** A template-origin manifest as forkd wrote them before start and ready were recorded. */
const OLD_MANIFEST: SnapshotManifest = {
  format: MANIFEST_FORMAT,
  tag: "t1",
  createdAtUnix: 1_700_000_000,
  template: { name: "t1", interpreter: "none" },
  image: { hash: "h", buildId: "b", rootfs: "/r", kernel: "/k", initrd: "/i" },
  machine: {
    accel: "tcg",
    cpu: "max",
    memoryMiB: 256,
    vcpus: 1,
    cmdline: "console=ttyS0",
    tscKhz: null,
    compatKey: "k",
    nic: null,
    qemuVersion: "7.2.0",
  },
  memory: { format: "flat", ramBytes: 256 * 2 ** 20, pages: 65536 },
  origin: { kind: "template", mode: null, sourceSandbox: null, pauseMs: null },
  files: {},
  timings: { bootMs: 1, warmupMs: 0, saveMs: 1 },
  parent: null,
};

const withTemplate = (fields: Record<string, unknown>) =>
  JSON.stringify({ ...OLD_MANIFEST, template: { ...OLD_MANIFEST.template, ...fields } });

/** What guestCommandsOf reads of an image: its default user (format 2's image settings). */
const imageWithUser = (user: string | undefined) =>
  ({ manifest: user === undefined ? {} : { settings: { env: {}, workdir: "/", user } } }) as BuiltImage;

describe("a manifest's start command and ready check", () => {
  let dir: string;
  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-manifest-commands-"));
  });
  after(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  it("a manifest without them (written before they were recorded) parses, with none", () => {
    const parsed = parseManifest(JSON.stringify(OLD_MANIFEST), "old");
    assert.equal(parsed.template.start, undefined);
    assert.equal(parsed.template.ready, undefined);
  });

  it("records what the parent ran, users resolved against the image, and reads it back the same", async () => {
    const file = path.join(dir, "template.toml");
    const text = [
      "format = 2",
      'name = "svc"',
      "[from]",
      'debian = "bookworm"',
      "[start]",
      'command = "httpd -f -p 8000"',
      'cwd = "/srv"',
      'env = { MODE = "prod" }',
      "[ready]",
      'command = ["wget", "-q", "http://127.0.0.1:8000/"]',
      'user = "root"',
      "timeout_s = 12",
      "interval_ms = 250",
    ].join("\n");
    await fs.writeFile(file, text);
    const template = await parseTemplate(text, file);
    const commands = guestCommandsOf(template, imageWithUser("app"));
    assert.deepEqual(commands, {
      start: { argv: ["/bin/sh", "-c", "httpd -f -p 8000"], user: "app", cwd: "/srv", env: { MODE: "prod" } },
      ready: {
        argv: ["wget", "-q", "http://127.0.0.1:8000/"],
        user: "root",
        env: {},
        timeoutMs: 12_000,
        intervalMs: 250,
      },
    });
    const parsed = parseManifest(withTemplate({ ...commands }), "recorded");
    assert.deepEqual(parsed.template.start, commands.start);
    assert.deepEqual(parsed.template.ready, commands.ready);
    // An image without a default user: the start runs as root (no user recorded).
    assert.equal(guestCommandsOf(template, imageWithUser(undefined)).start?.user, undefined);
    assert.throws(
      () => guestCommandsOf(template, imageWithUser("1000:1000")),
      /not a name the guest agent can run start as; set start\.user/,
    );
  });

  it("refuses every field out of shape or bounds, naming where", () => {
    const start = { argv: ["/bin/true"], env: {} };
    const ready = { ...start, timeoutMs: 1000, intervalMs: 100 };
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ start: { ...start, argv: [] } }, /\/template\/start\/argv/],
      [{ start: { ...start, argv: "true" } }, /\/template\/start\/argv/],
      [{ start: { ...start, argv: ["x".repeat(64 * 1024 + 1)] } }, /\/template\/start\/argv\/0/],
      [{ start: { ...start, user: "root; rm -rf /" } }, /\/template\/start\/user/],
      [{ start: { ...start, cwd: "relative/dir" } }, /\/template\/start\/cwd/],
      [{ start: { ...start, env: { "BAD=NAME": "x" } } }, /\/template\/start\/env/],
      [{ start: { ...start, env: { OK: 1 } } }, /\/template\/start\/env\/OK/],
      [{ start: { ...start, shell: true } }, /\/template\/start/],
      [{ start: { env: {} } }, /\/template\/start/],
      [{ ready: { ...ready, timeoutMs: 0 } }, /\/template\/ready\/timeoutMs/],
      [{ ready: { ...ready, timeoutMs: 3601 * 1000 } }, /\/template\/ready\/timeoutMs/],
      [{ ready: { ...ready, intervalMs: 10 } }, /\/template\/ready\/intervalMs/],
      [{ ready: start }, /\/template\/ready/],
    ];
    for (const [fields, where] of cases) {
      assert.throws(
        () => parseManifest(withTemplate(fields), "hostile"),
        (err: Error) => /^hostile: manifest is invalid at /.test(err.message) && where.test(err.message),
        JSON.stringify(fields).slice(0, 200),
      );
    }
  });
});
