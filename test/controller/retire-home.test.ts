/**
 * `forkd teardown` (retireHome) on real VMs: a sandbox left running by a stopped daemon is killed, and the
 * home's bridge, host rules, cgroup parents and in-memory cache go; the home's files stay. Refused while a
 * daemon holds the home.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { ForkdError } from "../../src/common/errors.js";
import { cacheDirs, homeKey } from "../../src/controller/machines/restore-plan.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { retireHome } from "../../src/controller/sandboxes/retire-home.js";
import { detectCgroupLayout } from "../../src/isolation/cgroup.js";
import { resolveNetworkConfig } from "../../src/net/config.js";
import { hostTableName } from "../../src/net/nft.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const run = promisify(execFile);
const succeeds = (file: string, args: string[]) =>
  run(file, args).then(
    () => true,
    () => false,
  );

describe("teardown of a home", {
  timeout: 10 * 60_000,
  skip: process.getuid?.() !== 0 && "needs root",
}, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;

  before(async () => {
    home = await tempHome("forkd-teardown-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
  });
  after(async () => {
    await home.cleanup();
  });

  it("kills what a stopped daemon left running and removes the home's host state, keeping its files", async () => {
    const config = resolveNetworkConfig({}, process.env, home.home);
    const services = await openServices(home);
    let id: string;
    try {
      const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
      id = info!.id;
      await assert.rejects(
        retireHome(home),
        (err: unknown) => err instanceof ForkdError && err.code === "conflict",
      );
    } finally {
      // A daemon stop: the sandbox keeps running.
      await services.close();
    }
    assert.equal((await qemusMentioning(home.home)).length, 1, "the sandbox outlived its daemon");
    assert.ok(await succeeds("ip", ["link", "show", "dev", config.bridge]), "the home's bridge is there");
    const layout = await detectCgroupLayout(homeKey(home.home));
    const parents = Object.values(layout.hierarchies).map((h) => h.parent);
    assert.ok(parents.length > 0 && parents.every((dir) => existsSync(dir)), "cgroup parents were made");

    const report = await retireHome(home);
    assert.deepEqual(report.killed, [id]);
    assert.equal(report.bridge, config.bridge);
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left");
    assert.equal(await succeeds("ip", ["link", "show", "dev", config.bridge]), false, "bridge removed");
    assert.equal(
      await succeeds("nft", ["list", "table", "inet", hostTableName(config)]),
      false,
      "host rules removed",
    );
    for (const dir of parents) assert.equal(existsSync(dir), false, `${dir} removed`);
    assert.equal(existsSync(cacheDirs(home).tmpfsDir), false, "in-memory cache removed");
    assert.ok(existsSync(path.join(home.snapshots, tag)), "snapshots stay");
    assert.ok(existsSync(path.join(home.home, "state.db")), "the state database stays");

    const again = await retireHome(home);
    assert.deepEqual(again.killed, [], "a second teardown has nothing to kill");
  });
});
