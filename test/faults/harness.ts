/**
 * Fault injection through a real daemon on real VMs: for each case, a daemon armed with one crash point
 * (FORKD_CRASH_AT) is driven into it and SIGKILLs itself; a daemon started again on the same home reconciles;
 * then nothing may have leaked (test/support/leak-check.ts), no half snapshot may be visible through the API or
 * on disk, the database must be consistent, and the bystander sandbox spawned before the first case must
 * still answer exec. The case's own leftovers (dead records, snapshots it published) are then removed through
 * the API, so every case starts from the same state.
 *
 * `npm test` runs one representative point per operation; `npm run test:faults` (FORKD_FAULTS=all) every point.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomInt } from "node:crypto";
import { readdir } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { CRASH_AT_ENV, type CrashPoint } from "../../src/common/crash-points.js";
import { type DaemonProcess, startDaemonProcess } from "../api/daemon-process.js";
import { type RawResponse, send } from "../api/raw-http.js";
import { tempHome, waitFor } from "../support/host.js";
import { databaseProblems, inspectHome, packScratchDirs } from "../support/leak-check.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

export interface SandboxInfo {
  id: string;
  status: string;
  last_branch_tag?: string | null;
}

export interface FaultContext {
  home: Awaited<ReturnType<typeof tempHome>>;
  /** The shared warm snapshot linked into the home. */
  tag: string;
  /** Sends to the current daemon. */
  api(method: string, url: string, options?: Parameters<typeof send>[3]): Promise<RawResponse>;
  /** Spawns one sandbox (201 expected) and returns its id. */
  spawn(body?: Record<string, unknown>): Promise<string>;
  exec(id: string, script: string): Promise<string>;
  /** Ids this test has seen (their network objects and cgroups are checked too). */
  seen: Set<string>;
}

export interface FaultCase {
  point: CrashPoint;
  /** Shown after the point in the test's name (e.g. the BRANCH mode). */
  label?: string;
  /** One of these per operation runs in `npm test`. */
  representative?: boolean;
  /** Runs once before the armed daemon starts (against an unarmed one), e.g. to spawn a source sandbox. */
  setup?(ctx: FaultContext): Promise<void>;
  /** Drives the operation into the crash point (the request never gets an answer). */
  drive(ctx: FaultContext): Promise<void>;
  /** More checks after the restart (e.g. what the API must say about the operation's snapshot). */
  check?(ctx: FaultContext): Promise<void>;
  /** Removes what the case made on purpose (e.g. a source sandbox), after the checks. */
  teardown?(ctx: FaultContext): Promise<void>;
}

const execFileAsync = promisify(execFile);

export const SWEEP_ALL = process.env.FORKD_FAULTS === "all";

/** Gives up on a case whose armed daemon never reaches its crash point. */
const CRASH_TIMEOUT_MS = 10 * 60_000;

export function faultSuite(name: string, cases: FaultCase[]): void {
  const selected = SWEEP_ALL ? cases : cases.filter((c) => c.representative);
  describe(name, { timeout: 60 * 60_000 }, () => {
    let daemon: DaemonProcess | undefined;
    let bystander = "";
    let scratchBefore = new Set<string>();
    const seen = new Set<string>();
    let home: FaultContext["home"];
    const ctx = {} as FaultContext;

    let subnet = "";
    const start = async (crashAt?: CrashPoint) => {
      subnet ||= await freeSubnet();
      daemon = await startDaemonProcess(home.home, ["--net-subnet", subnet], {
        env: { [CRASH_AT_ENV]: crashAt ?? "" },
      });
      return daemon;
    };
    const api: FaultContext["api"] = (method, url, options) =>
      send((daemon as DaemonProcess).socket, method, url, options);

    before(async () => {
      home = await tempHome("forkd-faults-");
      const tag = await linkSharedSnapshot(home.home, "minimal");
      Object.assign(ctx, {
        home,
        tag,
        api,
        seen,
        spawn: async (body: Record<string, unknown> = {}) => {
          const r = await api("POST", "/v1/sandboxes", { json: { snapshot_tag: tag, n: 1, ...body } });
          assert.equal(r.status, 201, r.text);
          const id = (r.json<SandboxInfo[]>()[0] as SandboxInfo).id;
          seen.add(id);
          return id;
        },
        exec: async (id: string, script: string) => {
          const r = await api("POST", `/v1/sandboxes/${id}/exec`, { json: { args: ["sh", "-c", script] } });
          assert.equal(r.status, 200, r.text);
          return r.json<{ stdout: string }>().stdout;
        },
      } satisfies FaultContext);
      await start();
      bystander = await ctx.spawn();
      await ctx.exec(bystander, "echo kept > /root/bystander.txt; sync");
      scratchBefore = await packScratchDirs();
      assert.deepEqual((await inspectHome(home, seen, scratchBefore)).problems, [], "clean before any crash");
    });

    after(async () => {
      await daemon?.stop();
      await home?.cleanup();
    });

    for (const c of selected) {
      it(`crash at ${c.point}${c.label ? ` (${c.label})` : ""}`, async () => {
        if (c.setup) await c.setup(ctx);
        await (daemon as DaemonProcess).stop();
        const armed = await start(c.point);
        await reattached(ctx);
        let settledAt = 0;
        const driven = c.drive(ctx).then(
          () => "answered",
          (err: unknown) => {
            settledAt = Date.now();
            return String(err);
          },
        );
        // The request dies with the daemon; one that fails on its own first (e.g. refused) is a broken case.
        const exit = await Promise.race([
          armed.exited,
          new Promise<null>((r) => setTimeout(() => r(null), CRASH_TIMEOUT_MS).unref()),
          driven.then(() => new Promise<null>((r) => setTimeout(() => r(null), 10_000).unref())),
        ]);
        if (exit === null) await armed.crash();
        const outcome = await driven;
        assert.equal(
          exit?.signal,
          "SIGKILL",
          `the daemon must kill itself at ${c.point}; the request: ${outcome}, ${settledAt}`,
        );
        assert.notEqual(outcome, "answered", "the request got no answer");
        // Ids the dead daemon recorded belong to this home: their objects are checked after the restart.
        for (const s of (await inspectHome(home, seen, scratchBefore)).sandboxes) seen.add(s.id);

        await start();
        await reattached(ctx);
        assert.equal(await ctx.exec(bystander, "cat /root/bystander.txt"), "kept\n", "the bystander answers");
        await assertNoHalfSnapshots(ctx);
        assert.deepEqual(databaseProblems(home), [], "database consistent");
        if (c.check) await c.check(ctx);
        // Dead records go through the API (kill), which must also remove whatever they still own.
        const listed = (await api("GET", "/v1/sandboxes")).json<SandboxInfo[]>();
        for (const s of listed.filter((s) => s.status === "dead")) {
          const r = await api("DELETE", `/v1/sandboxes/${s.id}`);
          assert.equal(r.status, 204, r.text);
        }
        if (c.teardown) await c.teardown(ctx);
        const state = await inspectHome(home, seen, scratchBefore);
        assert.deepEqual(state.problems, [], `nothing leaked after a crash at ${c.point}`);
        const running = state.sandboxes.filter((s) => s.status === "running").map((s) => s.id);
        assert.deepEqual(running, [bystander], "only the bystander runs");
      });
    }
  });
}

/** Waits until every running sandbox answers (a restarted daemon re-attaches them in the background). */
async function reattached(ctx: FaultContext): Promise<void> {
  const listed = (await ctx.api("GET", "/v1/sandboxes")).json<SandboxInfo[]>();
  for (const s of listed.filter((s) => s.status === "running")) {
    await waitFor(`${s.id} re-attached`, 120_000, async () => {
      const r = await ctx.api("POST", `/v1/sandboxes/${s.id}/exec`, { json: { args: ["true"] } });
      if (r.status === 200) return true;
      // Marked dead meanwhile (could not re-attach): the checks after the crash look at that.
      const now = await ctx.api("GET", `/v1/sandboxes/${s.id}`);
      return now.status !== 200 || now.json<SandboxInfo>().status !== "running" ? true : undefined;
    });
  }
}

/**
 * Every snapshot the API lists is either ready (and complete on disk) or failed (and absent from disk); every
 * snapshot directory on disk is listed ready. Failed job records are removed (DELETE), as a user would.
 */
async function assertNoHalfSnapshots(ctx: FaultContext): Promise<void> {
  const listed = (await ctx.api("GET", "/v1/snapshots")).json<{ tag: string; status: string }[]>();
  const onDisk = new Set(await readdir(ctx.home.snapshots));
  for (const s of listed) {
    assert.notEqual(s.status, "writing", `snapshot ${s.tag} still says writing after the restart`);
    if (s.status === "ready") assert.ok(onDisk.has(s.tag), `${s.tag} is listed ready but not on disk`);
    else {
      assert.ok(!onDisk.has(s.tag), `${s.tag} is ${s.status} but has a directory`);
      const r = await ctx.api("DELETE", `/v1/snapshots/${s.tag}`);
      assert.equal(r.status, 204, r.text);
    }
  }
  const ready = new Set(listed.filter((s) => s.status === "ready").map((s) => s.tag));
  for (const name of onDisk)
    assert.ok(ready.has(name), `${path.join("snapshots", name)} is on disk but not listed`);
}

/**
 * A /20 no route of this host uses: the home's hashed default can collide with a bridge another test home left
 * (seen here), and a daemon refuses an overlapping subnet.
 */
async function freeSubnet(): Promise<string> {
  const { stdout } = await execFileAsync("ip", ["-4", "route"]);
  for (;;) {
    const candidate = `10.${200 + randomInt(50)}.${randomInt(16) * 16}.0/20`;
    if (!stdout.includes(candidate)) return candidate;
  }
}

/** Deletes a snapshot if it exists (204 or 404). */
export async function deleteSnapshot(ctx: FaultContext, tag: string): Promise<void> {
  const r = await ctx.api("DELETE", `/v1/snapshots/${tag}`);
  assert.ok(r.status === 204 || r.status === 404, `DELETE ${tag}: ${r.status} ${r.text}`);
}
