/**
 * Crash points of spawn and of its network setup (netns, veth, nft rules): the spawn never answers, the restart
 * marks the half-spawned sandbox dead and removes everything it had (see harness.ts for what is checked).
 */
import assert from "node:assert/strict";
import type { CrashPoint } from "../../src/common/crash-points.js";
import { type FaultCase, type FaultContext, faultSuite, type SandboxInfo } from "./harness.js";

/** A spawn that uses every resource a spawn can take: a network namespace, a memory cgroup. */
const spawnAll = (ctx: FaultContext) =>
  ctx
    .api("POST", "/v1/sandboxes", { json: { snapshot_tag: ctx.tag, n: 1, memory_limit_mib: 768 } })
    .then(() => {});

/** The crashed spawn's sandbox is listed dead (never running) until deleted. */
const deadAfterRestart = async (ctx: FaultContext) => {
  const listed = (await ctx.api("GET", "/v1/sandboxes")).json<SandboxInfo[]>();
  const others = listed.filter((s) => s.status !== "running");
  assert.ok(others.length <= 1, `one crashed spawn at most: ${JSON.stringify(others)}`);
  for (const s of others) assert.equal(s.status, "dead");
};

const point = (p: CrashPoint, representative = false): FaultCase => ({
  point: p,
  representative,
  drive: spawnAll,
  check: deadAfterRestart,
});

faultSuite("spawn and network setup survive a daemon killed at any step", [
  point("spawn.recorded"),
  point("spawn.planned"),
  point("net.recorded"),
  point("net.linked", true),
  point("net.configured"),
  point("net.ruled"),
  point("spawn.launched", true),
  point("spawn.limited"),
  point("spawn.restored"),
  {
    // The database already said running: the restart re-attaches it like any survivor.
    point: "spawn.running",
    drive: spawnAll,
    check: async (ctx) => {
      const listed = (await ctx.api("GET", "/v1/sandboxes")).json<SandboxInfo[]>();
      const survivors = listed.filter((s) => s.status === "running" && !ctx.seen.has(s.id));
      assert.equal(survivors.length, 0, "its id was recorded before the crash");
      const spawned = listed.filter((s) => s.status === "running").map((s) => s.id);
      assert.equal(spawned.length, 2, `the bystander and the spawned sandbox: ${spawned}`);
      for (const id of spawned) assert.equal(await ctx.exec(id, "echo up"), "up\n");
    },
    teardown: async (ctx) => {
      const listed = (await ctx.api("GET", "/v1/sandboxes")).json<SandboxInfo[]>();
      const bystander = listed.find((s) => s.id === [...ctx.seen][0]);
      for (const s of listed) {
        if (s.id !== bystander?.id)
          assert.equal((await ctx.api("DELETE", `/v1/sandboxes/${s.id}`)).status, 204);
      }
    },
  },
]);
