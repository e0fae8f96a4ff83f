/**
 * Crash points of the snapshot store's writers through the daemon: POST /v1/snapshots (a template booted into a
 * warm parent), compact, pack (GET .../pack) and unpack (POST /v1/snapshots/unpack). After the restart the new
 * snapshot is complete (a child restored from it answers) or not there at all, the parent VM of an interrupted
 * snapshot is gone, and nothing is left in the transfers directory (see harness.ts for the rest).
 */
import assert from "node:assert/strict";
import type { CrashPoint } from "../../src/common/crash-points.js";
import { deleteSnapshot, type FaultCase, type FaultContext, faultSuite } from "./harness.js";

/** `tag` is absent, or ready and a child restored from it answers. */
async function absentOrBootable(ctx: FaultContext, tag: string): Promise<void> {
  const r = await ctx.api("GET", `/v1/snapshots/${tag}`);
  if (r.status === 404) return;
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json<{ status: string }>().status, "ready", r.text);
  const child = await ctx.spawn({ snapshot_tag: tag });
  assert.equal(await ctx.exec(child, "echo up"), "up\n");
  assert.equal((await ctx.api("DELETE", `/v1/sandboxes/${child}`)).status, 204);
}

const noAnswer = (r: { status: number; text: string }) => {
  throw new Error(`answered ${r.status}: ${r.text.slice(0, 300)}`);
};

function writerCase(
  point: CrashPoint,
  tagOf: (ctx: FaultContext) => string,
  drive: (ctx: FaultContext, tag: string) => Promise<void>,
  representative = false,
): FaultCase {
  return {
    point,
    representative,
    drive: (ctx) => drive(ctx, tagOf(ctx)),
    check: (ctx) => absentOrBootable(ctx, tagOf(ctx)),
    teardown: (ctx) => deleteSnapshot(ctx, tagOf(ctx)),
  };
}

const slug = (p: CrashPoint) => p.replace(".", "-");

const create = (point: CrashPoint, representative = false) =>
  writerCase(
    point,
    () => `crash-${slug(point)}`,
    async (ctx, tag) =>
      noAnswer(await ctx.api("POST", "/v1/snapshots", { json: { tag, template: "minimal" } })),
    representative,
  );

const compact = (point: CrashPoint, representative = false) =>
  writerCase(
    point,
    () => `crash-${slug(point)}`,
    async (ctx, tag) =>
      noAnswer(await ctx.api("POST", `/v1/snapshots/${ctx.tag}/compact`, { json: { to: tag } })),
    representative,
  );

/** A pack of the shared snapshot (its image is in the shared cache), made once by a daemon that is not armed. */
let packed: Buffer | undefined;
const packOnce = async (ctx: FaultContext) => {
  if (packed) return;
  const r = await ctx.api("GET", `/v1/snapshots/${ctx.tag}/pack?without_image=true`);
  assert.equal(r.status, 200, r.text.slice(0, 300));
  packed = r.body;
};

const pack = (point: CrashPoint, representative = false): FaultCase => ({
  point,
  representative,
  drive: async (ctx) => noAnswer(await ctx.api("GET", `/v1/snapshots/${ctx.tag}/pack?without_image=true`)),
});

const unpack = (point: CrashPoint, representative = false): FaultCase => {
  const tag = `crash-${slug(point)}`;
  return {
    point,
    representative,
    setup: packOnce,
    drive: async (ctx) =>
      noAnswer(
        await ctx.api("POST", `/v1/snapshots/unpack?tag=${tag}`, {
          headers: { "content-type": "application/zstd" },
          body: packed,
        }),
      ),
    check: (ctx) => absentOrBootable(ctx, tag),
    teardown: (ctx) => deleteSnapshot(ctx, tag),
  };
};

faultSuite("snapshot writers survive a daemon killed at any step", [
  compact("compact.claimed"),
  compact("compact.staged"),
  compact("compact.written", true),
  compact("compact.committed"),
  pack("pack.verified"),
  pack("pack.writing", true),
  pack("pack.written"),
  unpack("unpack.received"),
  unpack("unpack.read", true),
  unpack("unpack.layer"),
  unpack("unpack.published"),
  create("snapshot.claimed"),
  create("snapshot.staged"),
  create("snapshot.booted", true),
  create("snapshot.saved"),
  create("snapshot.committed"),
]);
