/** qemuVersion and qcow2 overlays through the real qemu tools. */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { createOverlay, qemuVersion } from "../../src/vmm/qemu-tools.js";
import { tempDir } from "./helpers.js";

describe("qemu tools", () => {
  test("qemuVersion parses the emulator's banner", async () => {
    const version = await qemuVersion();
    assert.match(version.version, /^\d+\.\d+(\.\d+)?$/);
    assert.ok(version.major >= 7);
    assert.match(version.banner, /^QEMU emulator version /);
    await assert.rejects(qemuVersion("/nonexistent/qemu"), (err: unknown) => err instanceof ForkdError);
  });

  test("createOverlay makes a qcow2 overlay on its backing file, with no temp file left", async (t) => {
    const dir = tempDir(t);
    const base = path.join(dir, "base.raw");
    fs.writeFileSync(base, Buffer.alloc(1024 * 1024));
    const parent = path.join(dir, "parent.qcow2");
    const child = path.join(dir, "child.qcow2");
    await createOverlay({ backing: base, backingFormat: "raw", overlay: parent });
    await createOverlay({ backing: parent, backingFormat: "qcow2", overlay: child });
    const info = JSON.parse(execFileSync("qemu-img", ["info", "--output=json", child], { encoding: "utf8" }));
    assert.equal(info.format, "qcow2");
    assert.equal(info["backing-filename"], parent);
    assert.equal(info["backing-filename-format"], "qcow2");
    assert.equal(info["virtual-size"], 1024 * 1024);
    assert.deepEqual(fs.readdirSync(dir).sort(), ["base.raw", "child.qcow2", "parent.qcow2"]);
  });

  test("createOverlay on a missing backing file fails with qemu-img's message and leaves nothing", async (t) => {
    const dir = tempDir(t);
    await assert.rejects(
      createOverlay({
        backing: path.join(dir, "missing.qcow2"),
        backingFormat: "qcow2",
        overlay: path.join(dir, "o.qcow2"),
      }),
      (err: unknown) =>
        err instanceof ForkdError && /qemu-img create failed: .*missing\.qcow2/s.test(err.message),
    );
    assert.deepEqual(fs.readdirSync(dir), []);
    // A relative backing path is kept (layers are relocatable) and resolved from the overlay's directory.
    await assert.rejects(
      createOverlay({ backing: "rel.qcow2", backingFormat: "qcow2", overlay: path.join(dir, "o") }),
      (err: unknown) => err instanceof ForkdError && err.message.includes(path.join(dir, "rel.qcow2")),
    );
    await assert.rejects(
      createOverlay({ backing: path.join(dir, "missing.qcow2"), backingFormat: "qcow2", overlay: "o.qcow2" }),
      /overlay must be an absolute path/,
    );
    assert.deepEqual(fs.readdirSync(dir), []);
  });
});
