/** The accelerator probe boots real guests: TCG must boot, KVM must give a definite verdict with a reason. */
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import { PROBE_CACHE_FILE, probeAccelerator } from "../../src/vmm/accel.js";
import { liveQemuProcesses } from "../../src/vmm/qemu-process.js";
import { loadGuestFixture } from "../fixtures/guest.js";
import { tempDir } from "./helpers.js";

const guest = await loadGuestFixture();

describe("probeAccelerator", { skip: guest.skip }, () => {
  test("decides by booting: TCG boots the probe, KVM is usable or says why not; the verdict is cached", async (t) => {
    if (guest.skip !== undefined) return;
    const cacheFile = path.join(tempDir(t), PROBE_CACHE_FILE);
    // A real KVM boots the probe in about a second; on a PVM host the kernel hangs and the deadline decides.
    const kvmDeadlineMs = 8000;
    const started = Date.now();
    const probe = await probeAccelerator({
      kernel: guest.kernel,
      probeInitrd: guest.probeInitrd,
      deadlineMs: kvmDeadlineMs,
      cacheFile,
    });
    t.diagnostic(`probe took ${Date.now() - started} ms: ${JSON.stringify(probe)}`);

    assert.equal(probe.tcg.usable, true, probe.tcg.reason);
    assert.match(probe.tcg.reason, /^usable: the probe guest reached userspace in \d+ ms/);
    assert.ok((probe.tcg.bootMs ?? 0) > 0);

    assert.equal(typeof probe.kvm.usable, "boolean");
    if (probe.kvm.usable) {
      assert.equal(probe.accel, "kvm");
      assert.match(probe.kvm.reason, /^usable:/);
    } else {
      assert.equal(probe.accel, "tcg");
      assert.match(probe.kvm.reason, /^not usable: /);
      assert.match(probe.kvm.reason, /\/dev\/kvm/, "the reason reports the state of /dev/kvm");
      if (fs.existsSync("/sys/module/kvm_pvm") && fs.existsSync("/dev/kvm")) {
        // This project's build machines: stock kernels hang under PVM after "Probing EDD".
        assert.match(probe.kvm.reason, /did not reach userspace within 8s|QEMU stopped before/);
      }
    }
    assert.match(probe.qemuVersion, /^\d+\.\d+/);
    assert.equal(probe.cached, false);
    assert.deepEqual(liveQemuProcesses(), [], "every probe QEMU was killed");

    const again = await probeAccelerator({ kernel: guest.kernel, probeInitrd: guest.probeInitrd, cacheFile });
    assert.equal(again.cached, true);
    assert.equal(again.accel, probe.accel);
    assert.deepEqual(again.kvm, probe.kvm);
    const cache = JSON.parse(fs.readFileSync(cacheFile, "utf8"));
    assert.equal(cache.key.bootId, fs.readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim());
    assert.match(cache.key.kernelSha256, /^[0-9a-f]{64}$/);
  });

  test("an initrd that never prints the marker is 'not usable' with the console's last line, and no QEMU is left", async (t) => {
    if (guest.skip !== undefined) return;
    const dir = tempDir(t);
    const emptyInitrd = path.join(dir, "empty.cpio");
    fs.writeFileSync(emptyInitrd, "");
    const attempt = probeAccelerator({
      kernel: guest.kernel,
      probeInitrd: emptyInitrd,
      deadlineMs: 2000,
      tcgDeadlineMs: 5000,
      cacheFile: null,
    });
    await assert.rejects(attempt, (err: Error) => {
      // With no init the kernel panics and (panic=-1, -no-reboot) QEMU exits, or the deadline passes first on
      // a busy host: either way a definite "not usable" with the reason.
      assert.match(
        err.message,
        /no accelerator boots the guest kernel: kvm not usable: .*; tcg not usable: (QEMU stopped before|guest kernel did not reach userspace within 5s)/s,
      );
      return true;
    });
    assert.deepEqual(liveQemuProcesses(), []);
  });

  test("aborting a probe kills its QEMU and rejects", async () => {
    if (guest.skip !== undefined) return;
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error("probe cancelled by test")), 500);
    await assert.rejects(
      probeAccelerator({
        kernel: guest.kernel,
        probeInitrd: guest.probeInitrd,
        cacheFile: null,
        signal: controller.signal,
      }),
      /probe cancelled by test/,
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.deepEqual(liveQemuProcesses(), []);
  });
});
