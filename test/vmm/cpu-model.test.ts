/** The guest CPU model: TCG's default and its override, KVM's host CPU, and what a model string may say. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import {
  assertCpuModel,
  cpuModelFor,
  DEFAULT_TCG_CPU_MODEL,
  KVM_CPU_MODEL,
} from "../../src/vmm/cpu-model.js";
import { buildQemuArgs } from "../../src/vmm/qemu-args.js";

const invalid = (err: unknown) => err instanceof ForkdError && err.code === "invalid_argument";

describe("guest CPU model", () => {
  test("KVM runs the host's CPU whatever FORKD_TCG_CPU says; TCG runs the default unless it is set", () => {
    assert.equal(cpuModelFor("kvm", { FORKD_TCG_CPU: "Nehalem" }), KVM_CPU_MODEL);
    assert.equal(cpuModelFor("kvm", {}), "host");
    assert.equal(cpuModelFor("tcg", {}), DEFAULT_TCG_CPU_MODEL);
    assert.equal(cpuModelFor("tcg", { FORKD_TCG_CPU: "" }), DEFAULT_TCG_CPU_MODEL);
    assert.equal(cpuModelFor("tcg", { FORKD_TCG_CPU: "max,-avx,-avx2" }), "max,-avx,-avx2");
  });

  test("a bad FORKD_TCG_CPU is refused with a message naming the variable", () => {
    assert.throws(
      () => cpuModelFor("tcg", { FORKD_TCG_CPU: "max,+vmx" }),
      (err: unknown) => invalid(err) && /FORKD_TCG_CPU/.test((err as Error).message),
    );
  });

  test("model names with feature removals and ISA additions pass; anything else is refused", () => {
    for (const ok of [
      "max",
      "host",
      "Nehalem",
      "Haswell-noTSX",
      "max,-avx,-avx2,-la57",
      "qemu64,+sse4.2,+popcnt",
    ]) {
      assertCpuModel(ok);
    }
    for (const bad of [
      "",
      ",max",
      "max,+vmx",
      "max,+svm",
      "max,vmx=on",
      "max,,-avx",
      "max,-AVX",
      "max x",
      "max,-avx,id=x",
      "Nehalem,+hypervisor",
      "x".repeat(300),
      42,
    ]) {
      assert.throws(() => assertCpuModel(bad), invalid, String(bad));
    }
  });

  test("the model reaches QEMU's -cpu as one argument", () => {
    const args = buildQemuArgs({
      accel: "tcg",
      cpuModel: "max,-avx,-avx2",
      memoryMiB: 256,
      vcpus: 1,
      kernel: "/img/vmlinuz",
      initrd: "/img/initrd.img",
      kernelCmdline: "console=ttyS0",
      disk: null,
      qmpSocketPath: "/run/p/qmp.sock",
      consoleSocketPath: "/run/p/console.sock",
    });
    assert.equal(args[args.indexOf("-cpu") + 1], "max,-avx,-avx2");
  });
});
