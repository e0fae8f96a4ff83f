/** What the runtime adds to a guest's kernel command line: the TSC setting always, no ASLR under TCG only. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { GUEST_RUNTIME_CMDLINE, guestRuntimeCmdline } from "../../src/controller/machines/boot.js";

describe("guest runtime kernel arguments", () => {
  test("TCG guests boot without address-space randomisation unless FORKD_TCG_GUEST_ASLR=1", () => {
    assert.deepEqual(guestRuntimeCmdline("tcg", {}).split(" "), [GUEST_RUNTIME_CMDLINE, "norandmaps"]);
    assert.equal(guestRuntimeCmdline("tcg", { FORKD_TCG_GUEST_ASLR: "1" }), GUEST_RUNTIME_CMDLINE);
  });

  test("KVM guests keep it", () => {
    assert.equal(guestRuntimeCmdline("kvm", {}), GUEST_RUNTIME_CMDLINE);
    assert.ok(!guestRuntimeCmdline("kvm", {}).includes("norandmaps"));
  });
});
