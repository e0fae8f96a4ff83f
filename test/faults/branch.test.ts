/**
 * Crash points of BRANCH in each mode (full, diff, live) and of snapshot-diff. After the restart the source
 * sandbox runs and answers (a VM the dead daemon left stopped is continued), and the new snapshot is either
 * complete (a child spawned from it answers) or not there at all (see harness.ts for the rest).
 */
import assert from "node:assert/strict";
import type { CrashPoint } from "../../src/common/crash-points.js";
import {
  deleteSnapshot,
  type FaultCase,
  type FaultContext,
  faultSuite,
  type SandboxInfo,
} from "./harness.js";

const BRANCH_POINTS: CrashPoint[] = [
  "branch.claimed",
  "branch.prepared",
  "branch.marked",
  "branch.stopped",
  "branch.captured",
  "branch.written",
  "branch.committed",
];
const REPRESENTATIVE: Record<string, CrashPoint> = {
  full: "branch.stopped",
  diff: "branch.written",
  live: "branch.captured",
};

/** The snapshot `tag` is either absent or complete: then a child restored from it sees the source's file. */
async function absentOrComplete(ctx: FaultContext, tag: string, marker: string): Promise<void> {
  const r = await ctx.api("GET", `/v1/snapshots/${tag}`);
  if (r.status === 404) return;
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json<{ status: string }>().status, "ready", r.text);
  const child = await ctx.spawn({ snapshot_tag: tag });
  assert.equal(await ctx.exec(child, "cat /root/branch-marker"), marker);
  assert.equal((await ctx.api("DELETE", `/v1/sandboxes/${child}`)).status, 204);
}

function branchCase(mode: "full" | "diff" | "live", point: CrashPoint): FaultCase {
  let source = "";
  const tag = `crash-${mode}-${point.replace(".", "-")}`;
  const marker = `${tag}\n`;
  return {
    point,
    label: mode,
    representative: REPRESENTATIVE[mode] === point,
    setup: async (ctx) => {
      source = await ctx.spawn(mode === "live" ? { live_fork: true } : {});
      await ctx.exec(source, `echo ${tag} > /root/branch-marker; sync`);
    },
    drive: async (ctx) => {
      const r = await ctx.api("POST", `/v1/sandboxes/${source}/branch`, { json: { tag, mode } });
      throw new Error(`answered ${r.status}: ${r.text}`);
    },
    check: async (ctx) => {
      const info = (await ctx.api("GET", `/v1/sandboxes/${source}`)).json<SandboxInfo>();
      assert.equal(info.status, "running", "the source survives its interrupted BRANCH");
      assert.equal(await ctx.exec(source, "cat /root/branch-marker"), marker, "and answers");
      await absentOrComplete(ctx, tag, marker);
    },
    teardown: async (ctx) => {
      assert.equal((await ctx.api("DELETE", `/v1/sandboxes/${source}`)).status, 204);
      await deleteSnapshot(ctx, tag);
    },
  };
}

function diffCase(point: CrashPoint, representative = false): FaultCase {
  const tag = `crash-snapdiff-${point.replace(".", "-")}`;
  return {
    point,
    representative,
    drive: async (ctx) => {
      const r = await ctx.api("POST", `/v1/snapshots/${ctx.tag}/diff`, {
        json: { tag, exec: `echo ${tag} > /root/branch-marker` },
      });
      throw new Error(`answered ${r.status}: ${r.text}`);
    },
    check: async (ctx) => {
      await absentOrComplete(ctx, tag, `${tag}\n`);
      // snapshot-diff's own sandbox is gone or dead, never left running.
      const listed = (await ctx.api("GET", "/v1/sandboxes")).json<SandboxInfo[]>();
      assert.equal(listed.filter((s) => s.status === "running").length, 1, JSON.stringify(listed));
    },
    teardown: (ctx) => deleteSnapshot(ctx, tag),
  };
}

faultSuite("BRANCH and snapshot-diff survive a daemon killed at any step", [
  ...(["full", "diff", "live"] as const).flatMap((mode) => BRANCH_POINTS.map((p) => branchCase(mode, p))),
  diffCase("diff.spawned"),
  diffCase("diff.ran", true),
  diffCase("diff.branched"),
]);
