/** Admission: capacity is reserved at once, so concurrent requests cannot all pass one limit. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { Admission, DEFAULT_ADMISSION_LIMITS } from "../../src/controller/sandboxes/admission.js";

const isCode = (code: string, pattern: RegExp) => (err: unknown) =>
  err instanceof ForkdError && err.code === code && pattern.test(err.message);

describe("admission", () => {
  const limits = { ...DEFAULT_ADMISSION_LIMITS, maxSandboxes: 10, maxConcurrentSpawns: 2, reserveMiB: 100 };

  it("counts the children of spawns still in flight against maxSandboxes", () => {
    let alive = 3;
    const admission = new Admission(
      limits,
      () => alive,
      () => 1_000_000,
    );
    const a = admission.reserveSpawn(4);
    assert.throws(
      () => admission.reserveSpawn(4),
      isCode("unavailable", /limit of 10 sandboxes \(3 alive, 4 starting\)/),
    );
    const b = admission.reserveSpawn(3);
    assert.throws(
      () => admission.reserveSpawn(1),
      isCode("too_many_requests", /2 spawn requests are already running/),
    );
    a.release();
    a.release();
    assert.deepEqual(admission.reserved().sandboxes, 3, "a release is counted once");
    alive += 4;
    assert.throws(() => admission.reserveSpawn(1), isCode("unavailable", /7 alive, 3 starting/));
    b.release();
    alive += 3;
    assert.deepEqual(admission.reserved(), { spawns: 0, sandboxes: 0, memoryMiB: 0, parentBoots: 0 });
    assert.throws(() => admission.reserveSpawn(1), isCode("unavailable", /10 alive\)/));
  });

  it("bounds parent boots host-wide and per tenant; admins only host-wide", () => {
    const admission = new Admission(
      { ...limits, maxConcurrentParentBoots: 3, tenantMaxParentBoots: 1 },
      () => 0,
      () => 1_000_000,
    );
    const alice = admission.reserveParentBoot("alice");
    assert.throws(
      () => admission.reserveParentBoot("alice"),
      isCode("too_many_requests", /tenant alice is already building 1 snapshot \(limit 1\)/),
    );
    const admin = admission.reserveParentBoot(null);
    const bob = admission.reserveParentBoot("bob");
    assert.throws(
      () => admission.reserveParentBoot(null),
      isCode("too_many_requests", /3 snapshots are already being built \(limit 3\)/),
    );
    alice.release();
    alice.release();
    assert.equal(admission.reserved().parentBoots, 2, "a release is counted once");
    admission.reserveParentBoot("alice").release();
    for (const r of [admin, bob]) r.release();
    assert.equal(admission.reserved().parentBoots, 0);
  });

  it("memory promised to work in progress is not available to the next request", () => {
    const admission = new Admission(
      { ...limits, perSandboxEstimateMiB: 50 },
      () => 0,
      () => 1000,
    );
    const spawn = admission.reserveSpawn(2, 300); // 2 x 50 + 300 (a tmpfs image)
    const branch = admission.reserveMemory(400, "a BRANCH of sb-1");
    assert.throws(
      () => admission.reserveMemory(150, "a BRANCH of sb-2"),
      isCode(
        "unavailable",
        /200 MiB available \(800 MiB promised to work in progress\), a BRANCH of sb-2 needs about 150 MiB/,
      ),
    );
    branch.release();
    admission.reserveMemory(150, "a BRANCH of sb-2").release();
    spawn.release();
    assert.equal(admission.reserved().memoryMiB, 0);
  });
});
