/** The TCG translation-cache knob: validated, and only ever host-side (snapshots stay restorable). */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { machineSpec, tcgCacheMiB } from "../../src/controller/machines/machine.js";
import { buildQemuArgs, restoreCompatibilityKey } from "../../src/vmm/qemu-args.js";

const shape = {
  accel: "tcg" as const,
  cpuModel: "max",
  memoryMiB: 512,
  vcpus: 1,
  kernel: "/img/vmlinuz",
  initrd: "/img/initrd.img",
  kernelCmdline: "console=ttyS0",
};
const instance = {
  runDir: "/run/forkd/sb-1",
  memoryFile: "/snap/memory.bin",
  shared: false,
  disk: "/run/d.qcow2",
};

describe("FORKD_TCG_CACHE_MIB", () => {
  test("unset means the default; a valid value reaches QEMU's -accel", () => {
    assert.equal(tcgCacheMiB({}), undefined);
    assert.equal(tcgCacheMiB({ FORKD_TCG_CACHE_MIB: "24" }), 24);
    const previous = process.env.FORKD_TCG_CACHE_MIB;
    process.env.FORKD_TCG_CACHE_MIB = "32";
    try {
      const spec = machineSpec(shape, instance);
      const args = buildQemuArgs(spec);
      assert.equal(args[args.indexOf("-accel") + 1], "tcg,tb-size=32");
      delete process.env.FORKD_TCG_CACHE_MIB;
      assert.equal(restoreCompatibilityKey(spec), restoreCompatibilityKey(machineSpec(shape, instance)));
    } finally {
      if (previous === undefined) delete process.env.FORKD_TCG_CACHE_MIB;
      else process.env.FORKD_TCG_CACHE_MIB = previous;
    }
  });

  test("anything but an integer in 1..1024 is refused with a message naming the variable", () => {
    for (const bad of ["0", "-1", "1.5", "abc", "2048", " 8"]) {
      assert.throws(
        () => tcgCacheMiB({ FORKD_TCG_CACHE_MIB: bad }),
        (err: unknown) =>
          err instanceof ForkdError &&
          err.code === "invalid_argument" &&
          /FORKD_TCG_CACHE_MIB/.test(err.message),
        bad,
      );
    }
  });
});
