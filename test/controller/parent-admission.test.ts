/**
 * Parent boots are under admission (issue 20, item 8), on the real manager and snapshot service: while one
 * tenant's snapshot is being built (image, then a real parent VM), that tenant's next create is refused at once
 * with 429, and the host-wide bound holds for everyone; a boot whose template's RAM the host cannot spare is
 * refused before its VM starts, and leaves no snapshot, job or QEMU behind. Before, `POST /v1/snapshots` (and a
 * template build through it) started a parent VM whatever the host had left and however many were running.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const root = process.getuid?.() === 0;
const isCode = (code: string, pattern: RegExp) => (err: unknown) =>
  err instanceof ForkdError && err.code === code && pattern.test(err.message);

describe("admission of parent boots", { skip: !root && "needs root", timeout: 10 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tight: Awaited<ReturnType<typeof tempHome>>;

  before(async () => {
    home = await tempHome("forkd-parent-admission-");
    tight = await tempHome("forkd-parent-admission-mem-");
  });
  after(async () => {
    const left = [...(await qemusMentioning(home.home)), ...(await qemusMentioning(tight.home))];
    await home.cleanup();
    await tight.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("bounds snapshot builds per tenant and host-wide, at once", async () => {
    const services = await openServices(home, {
      limits: { maxConcurrentParentBoots: 2, tenantMaxParentBoots: 1 },
    });
    const building = new AbortController();
    try {
      const first = services.snapshots.create({
        tag: "adm-alice-1",
        template: "minimal",
        owner: "alice",
        signal: building.signal,
      });
      first.catch(() => {});
      await assert.rejects(
        services.snapshots.create({ tag: "adm-alice-2", template: "minimal", owner: "alice" }),
        isCode("too_many_requests", /tenant alice is already building 1 snapshot/),
      );
      const second = services.snapshots.create({
        tag: "adm-bob",
        template: "minimal",
        owner: "bob",
        signal: building.signal,
      });
      second.catch(() => {});
      await assert.rejects(
        services.snapshots.create({ tag: "adm-admin", template: "minimal" }),
        isCode("too_many_requests", /2 snapshots are already being built \(limit 2\)/),
      );
      building.abort();
      await Promise.allSettled([first, second]);
      const tags = (await services.snapshots.list()).map((s) => s.tag);
      assert.ok(!tags.includes("adm-alice-2") && !tags.includes("adm-admin"), `refused creates left ${tags}`);
    } finally {
      building.abort();
      await services.close({ killSandboxes: true });
    }
  });

  it("refuses a parent whose RAM the host cannot spare, before it boots, leaving nothing", async () => {
    const services = await openServices(tight, { limits: { reserveMiB: 1 << 30 } });
    try {
      await assert.rejects(
        services.snapshots.create({ tag: "adm-big", template: "minimal" }),
        isCode("unavailable", /not enough host memory: .*the parent VM of adm-big needs about \d+ MiB/),
      );
      assert.deepEqual(
        (await services.snapshots.list()).map((s) => s.tag).filter((t) => t === "adm-big"),
        [],
        "no snapshot or failed job is left",
      );
      assert.deepEqual(await qemusMentioning(tight.home), [], "no parent VM was started");
    } finally {
      await services.close({ killSandboxes: true });
    }
  });
});
