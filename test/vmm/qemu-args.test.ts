/** buildQemuArgs: the flags that matter for boot, snapshot and restore, and refusal of unsafe values. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { parseJitText } from "../../src/vmm/incoming.js";
import {
  AGENT_PORT_NAME,
  buildQemuArgs,
  DEVICE_STATE_FD,
  type MachineSpec,
  restoreCompatibilityKey,
} from "../../src/vmm/qemu-args.js";

const parent: MachineSpec = {
  accel: "tcg",
  tcgTbSizeMiB: 16,
  cpuModel: "max",
  memoryMiB: 512,
  vcpus: 1,
  memoryFile: { path: "/srv/snap/memory.bin", shared: true },
  kernel: "/img/vmlinuz",
  initrd: "/img/initrd.img",
  kernelCmdline: "console=ttyS0 loglevel=4 panic=-1 root=/dev/vda",
  disk: { overlayPath: "/run/p/disk.qcow2" },
  agent: { socketPath: "/run/p/agent.sock" },
  qmpSocketPath: "/run/p/qmp.sock",
  consoleSocketPath: "/run/p/console.sock",
};

const child: MachineSpec = {
  ...parent,
  memoryFile: { path: "/srv/snap/memory.bin", shared: false },
  disk: { overlayPath: "/run/c/disk.qcow2" },
  agent: { socketPath: "/run/c/agent.sock" },
  qmpSocketPath: "/run/c/qmp.sock",
  consoleSocketPath: "/run/c/console.sock",
  restore: { deviceStatePath: "/srv/snap/devices.state" },
};

/** The value following `flag`, for every occurrence. */
function values(args: string[], flag: string): string[] {
  return args.flatMap((arg, i) => (arg === flag ? [args[i + 1] as string] : []));
}

function expectInvalid(spec: MachineSpec, pattern: RegExp): void {
  assert.throws(
    () => buildQemuArgs(spec),
    (err: unknown) =>
      err instanceof ForkdError && err.code === "invalid_argument" && pattern.test(err.message),
  );
}

describe("buildQemuArgs", () => {
  test("parent: microvm with file-backed shared RAM, TCG with a small translation cache", () => {
    const args = buildQemuArgs(parent);
    assert.deepEqual(values(args, "-M"), [
      "microvm,acpi=on,ioapic2=off,x-option-roms=off,suppress-vmdesc=on,memory-backend=mem",
    ]);
    assert.deepEqual(values(args, "-accel"), ["tcg,tb-size=16"]);
    assert.deepEqual(values(args, "-object"), [
      "memory-backend-file,id=mem,size=512M,mem-path=/srv/snap/memory.bin,share=on",
    ]);
    assert.deepEqual(values(args, "-m"), ["512M"]);
    assert.ok(
      args.includes("-nodefaults") && args.includes("-no-user-config") && args.includes("-no-reboot"),
    );
    assert.deepEqual(values(args, "-append"), ["console=ttyS0 loglevel=4 panic=-1 root=/dev/vda"]);
    assert.deepEqual(values(args, "-qmp"), ["unix:/run/p/qmp.sock,server=on,wait=off"]);
    assert.ok(!args.includes("-incoming") && !args.includes("-S"));
  });

  test("agent chardev: QEMU is the client of a host listener, port named org.forkd.agent", () => {
    const args = buildQemuArgs(parent);
    assert.ok(values(args, "-chardev").includes("socket,id=agent,path=/run/p/agent.sock,server=off"));
    assert.ok(
      values(args, "-device").includes(`virtserialport,chardev=agent,name=${AGENT_PORT_NAME},id=port0`),
    );
  });

  test("child: MAP_PRIVATE RAM, device state from fd 3, no configuration section expected", () => {
    const args = buildQemuArgs(child);
    assert.ok(values(args, "-object")[0]?.endsWith("mem-path=/srv/snap/memory.bin,share=off"));
    assert.deepEqual(values(args, "-incoming"), [`fd:${DEVICE_STATE_FD}`]);
    assert.deepEqual(values(args, "-global"), ["migration.send-configuration=off"]);
    // A restored child never boots: no kernel to load (and no 8 MiB copy of it kept by QEMU).
    assert.deepEqual(
      [values(args, "-kernel"), values(args, "-initrd"), values(args, "-append")],
      [[], [], []],
    );
  });

  test("a deferred child (warm pool) waits with -incoming defer and the same devices", () => {
    const deferred: MachineSpec = {
      ...child,
      restore: { deviceStatePath: child.restore?.deviceStatePath as string, deferred: true },
    };
    const args = buildQemuArgs(deferred);
    assert.deepEqual(values(args, "-incoming"), ["defer"]);
    assert.deepEqual(values(args, "-global"), ["migration.send-configuration=off"]);
    assert.deepEqual(values(args, "-device"), values(buildQemuArgs(child), "-device"));
    assert.equal(restoreCompatibilityKey(deferred), restoreCompatibilityKey(child));
  });

  test("x-query-jit's text parses into translated code, TB count and flushes", () => {
    const text =
      "Translation buffer state:\ngen code size       4186112/16772096\nTB count            7475\n" +
      "TB avg target size  16 max=512 bytes\n\nStatistics:\nTB flush count      1\nTB invalidate count 0\n";
    assert.deepEqual(parseJitText(text), { codeBytes: 4186112, tbCount: 7475, flushes: 1 });
    assert.equal(parseJitText("[TCG profiler not compiled]"), null);
  });

  test("parent and child have identical device ids and order (the restore invariant)", () => {
    const devices = (spec: MachineSpec) => values(buildQemuArgs(spec), "-device");
    assert.deepEqual(devices(parent), devices(child));
    assert.equal(restoreCompatibilityKey(parent), restoreCompatibilityKey(child));
    const moreMemory = { ...child, memoryMiB: 1024 };
    assert.notEqual(restoreCompatibilityKey(parent), restoreCompatibilityKey(moreMemory));
    const withRng = { ...child, rng: true };
    assert.notEqual(restoreCompatibilityKey(parent), restoreCompatibilityKey(withRng));
    // The translation cache size is host-side only: a child may use another one.
    const biggerCache = { ...child, tcgTbSizeMiB: 32 };
    assert.equal(restoreCompatibilityKey(parent), restoreCompatibilityKey(biggerCache));
  });

  test("the optional virtio-rng device has a fixed id", () => {
    const args = buildQemuArgs({ ...parent, rng: true });
    assert.ok(values(args, "-device").includes("virtio-rng-device,id=rng0"));
  });

  test("no disk, no agent, anonymous RAM, start paused, KVM", () => {
    const args = buildQemuArgs({
      ...parent,
      accel: "kvm",
      cpuModel: "host",
      disk: null,
      agent: undefined,
      memoryFile: undefined,
      startPaused: true,
    });
    assert.deepEqual(values(args, "-accel"), ["kvm"]);
    assert.deepEqual(values(args, "-M"), [
      "microvm,acpi=on,ioapic2=off,x-option-roms=off,suppress-vmdesc=on",
    ]);
    assert.equal(values(args, "-object").length, 0);
    assert.equal(values(args, "-blockdev").length, 0);
    assert.ok(!values(args, "-device").some((d) => d.startsWith("virtserialport")));
    assert.ok(args.includes("-S"));
  });

  test("TCG guests get the host TSC frequency on the kernel command line; KVM guests do not", () => {
    assert.deepEqual(values(buildQemuArgs({ ...parent, tscKhz: 2_600_000 }), "-append"), [
      `${parent.kernelCmdline} tsc_early_khz=2600000`,
    ]);
    const kvm = buildQemuArgs({ ...parent, accel: "kvm", tscKhz: 2_600_000 });
    assert.deepEqual(values(kvm, "-append"), [parent.kernelCmdline]);
  });

  test("commas in any path are refused, naming the field", () => {
    expectInvalid(
      { ...parent, consoleSocketPath: "/run/p/console.sock,append=on" },
      /consoleSocketPath .*comma/,
    );
    expectInvalid(
      { ...parent, agent: { socketPath: "/run/a,server=on/agent.sock" } },
      /agent\.socketPath .*comma/,
    );
    expectInvalid({ ...parent, memoryFile: { path: "/x,share=on", shared: false } }, /memoryFile\.path/);
    expectInvalid({ ...parent, disk: { overlayPath: "/d,file.driver=host_device" } }, /disk\.overlayPath/);
    expectInvalid({ ...parent, kernel: "/k,x" }, /kernel/);
    expectInvalid({ ...parent, qmpSocketPath: "/q,wait=on" }, /qmpSocketPath/);
  });

  test("relative paths, over-long socket paths and bad numbers are refused", () => {
    expectInvalid({ ...parent, kernel: "vmlinuz" }, /kernel must be an absolute path/);
    expectInvalid({ ...parent, qmpSocketPath: `/${"x".repeat(120)}/qmp.sock` }, /longer than 107 bytes/);
    expectInvalid({ ...parent, memoryMiB: 512 * 1024 * 1024 }, /memoryMiB/);
    expectInvalid({ ...parent, vcpus: 0 }, /vcpus/);
    expectInvalid({ ...parent, tcgTbSizeMiB: 1.5 }, /tcgTbSizeMiB/);
    expectInvalid({ ...parent, cpuModel: "max,+vmx" }, /cpuModel/);
    expectInvalid({ ...parent, agent: { socketPath: "/run/a.sock", portName: "a b" } }, /portName/);
    expectInvalid({ ...parent, kernelCmdline: "a\nb" }, /newlines/);
    expectInvalid({ ...parent, kernelCmdline: "x".repeat(3000) }, /kernelCmdline/);
    expectInvalid({ ...parent, accel: "hvf" as never }, /accel/);
    expectInvalid({ ...child, memoryFile: undefined }, /restore needs memoryFile/);
  });
});
