/**
 * Crash points of `forkd pack` and `forkd unpack` run as the CLI (no daemon: they work on the home's files). A
 * CLI killed mid-way leaves scratch behind that only its next run can clean (there is no daemon to reconcile):
 * the next pack removes a dead writer's partial archive and link farm, the next unpack a dead one's staging
 * directory; no half snapshot is ever visible. Whole sweep with FORKD_FAULTS=all, one point each otherwise.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdir, readdir } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { CRASH_AT_ENV, type CrashPoint } from "../../src/common/crash-points.js";
import { cliEntry } from "../api/daemon-process.js";
import { tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import { SWEEP_ALL } from "./harness.js";

interface Run {
  pid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

function forkd(home: string, args: string[], crashAt?: CrashPoint): Promise<Run> {
  const child = spawn(process.execPath, [...cliEntry(), ...args], {
    env: { ...process.env, FORKD_HOME: home, [CRASH_AT_ENV]: crashAt ?? "" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (c: Buffer) => {
    stderr += c.toString();
  });
  return new Promise((resolve) =>
    child.once("exit", (code, signal) => resolve({ pid: child.pid as number, code, signal, stderr })),
  );
}

const scratchOf = async (pid: number) =>
  (await readdir(os.tmpdir())).filter((n) => n.startsWith(`forkd-pack-${pid}.`));

describe("forkd pack and unpack (CLI) survive being killed at any step", { timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let outDir: string;
  before(async () => {
    home = await tempHome("forkd-faults-cli-");
    tag = await linkSharedSnapshot(home.home, "minimal");
    outDir = path.join(home.home, "packs");
    await mkdir(outDir);
  });
  after(() => home.cleanup());

  const packPoints: CrashPoint[] = SWEEP_ALL
    ? ["pack.verified", "pack.writing", "pack.written"]
    : ["pack.writing"];
  for (const point of packPoints) {
    it(`pack killed at ${point}; the next pack cleans up`, async () => {
      const out = path.join(outDir, `${point}.tar.zst`);
      const killed = await forkd(home.home, ["pack", "--tag", tag, "--out", out, "--without-image"], point);
      assert.equal(killed.signal, "SIGKILL", killed.stderr);
      const left = (await readdir(outDir)).filter((n) => n.startsWith(`${point}.tar.zst.partial-`));
      if (point === "pack.writing") {
        assert.equal(left.length, 1, "the kill left a partial archive (what the next pack must remove)");
        assert.equal((await scratchOf(killed.pid)).length, 1, "and a link farm");
      }
      const again = await forkd(home.home, ["pack", "--tag", tag, "--out", out, "--without-image"]);
      // pack.written renamed the archive into place before the kill: a second pack refuses to overwrite it.
      if (point === "pack.written") assert.notEqual(again.code, 0, again.stderr);
      else assert.equal(again.code, 0, again.stderr);
      assert.deepEqual(
        (await readdir(outDir)).filter((n) => n.startsWith(`${point}.tar.zst.`)),
        [],
        "no partial archive left",
      );
      assert.deepEqual(await scratchOf(killed.pid), [], "no link farm of the killed pack left");
    });
  }

  const unpackPoints: CrashPoint[] = SWEEP_ALL
    ? ["unpack.read", "unpack.layer", "unpack.published"]
    : ["unpack.read"];
  for (const point of unpackPoints) {
    it(`unpack killed at ${point}; no half snapshot, the next unpack cleans up`, async () => {
      const file = path.join(outDir, "source.tar.zst");
      if (!(await readdir(outDir)).includes("source.tar.zst")) {
        const made = await forkd(home.home, ["pack", "--tag", tag, "--out", file, "--without-image"]);
        assert.equal(made.code, 0, made.stderr);
      }
      const target = `cli-${point.replace(".", "-")}`;
      const killed = await forkd(home.home, ["unpack", file, "--tag", target], point);
      assert.equal(killed.signal, "SIGKILL", killed.stderr);
      const names = await readdir(home.snapshots);
      const visible = names.filter((n) => !n.startsWith("."));
      if (point === "unpack.read") assert.ok(!visible.includes(target), "nothing published before the kill");
      else assert.ok(visible.includes(target), "published before the kill");
      const again = await forkd(home.home, ["unpack", file, "--tag", target]);
      assert.equal(again.code, 0, again.stderr);
      assert.deepEqual(
        (await readdir(home.snapshots)).filter((n) => n.startsWith(".")),
        [],
        "no staging directory left",
      );
      const info = await forkd(home.home, ["snapshot-info", target, "--json"]);
      assert.equal(info.code, 0, info.stderr);
    });
  }
});
