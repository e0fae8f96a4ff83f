/**
 * Crash safety of pause and resume on real VMs with a real daemon process: the daemon SIGKILLs itself at every
 * named crash point of a pause and of a resume (FORKD_CRASH_AT, src/common/crash-points.ts), and a daemon killed
 * -9 from outside while a sandbox is paused. After each restart the sandbox is running (exactly one QEMU) or
 * paused (none, no run directory), never both and never lost, no staging directory is left, and what it wrote
 * before is still there. One sandbox goes through all of it. Kept disks (filesystem-only pauses) at a start: an
 * orphan a crash left after a cold boot, a planted stray and a symlink out of the home are swept (the link not
 * followed), a paused sandbox whose kept disk is gone is dead as lost, at the start or at its resume. Then a host
 * reboot while paused, simulated (a real
 * one cannot happen in a test): the daemon stops, the database's boot id changes and the sandbox's network
 * namespace is deleted, as a reboot leaves them; the restarted daemon resumes it with its address.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import Database from "better-sqlite3";
import { CRASH_AT_ENV, type CrashPoint } from "../../src/common/crash-points.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";
import { type DaemonProcess, startDaemonProcess } from "./daemon-process.js";
import { send } from "./raw-http.js";

interface Info {
  id: string;
  status: string;
  pause_tag: string | null;
  netns: string | null;
  network: { kind: string; address: string | null };
}

const run = promisify(execFile);
const root = process.getuid?.() === 0;

describe("pause and resume survive a daemon killed at any step", { timeout: 40 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let daemon: DaemonProcess | undefined;

  before(async () => {
    home = await tempHome("forkd-pause-crash-");
    tag = await linkSharedSnapshot(home.home, "minimal");
  });
  after(async () => {
    await daemon?.stop();
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  const start = async (crashAt?: CrashPoint) => {
    daemon = await startDaemonProcess(home.home, [], { env: { [CRASH_AT_ENV]: crashAt ?? "" } });
    return daemon;
  };
  const get = async (id: string) =>
    (await send((daemon as DaemonProcess).socket, "GET", `/v1/sandboxes/${id}`)).json<Info>();
  const exec = async (id: string, script: string) => {
    const r = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${id}/exec`, {
      json: { args: ["sh", "-c", script] },
    });
    assert.equal(r.status, 200, r.text);
    return r.json<{ stdout: string }>().stdout;
  };
  /** The request never gets an answer: the daemon killed itself at the crash point. */
  const crashes = async (method: string, url: string) => {
    const current = daemon as DaemonProcess;
    await assert.rejects(send(current.socket, method, url, { json: {} }), "the daemon died mid-request");
    assert.equal((await current.exited).signal, "SIGKILL");
  };
  /** Exactly one of the two states, with nothing of the other left. */
  const expectState = async (id: string, status: "running" | "paused") => {
    const info = await get(id);
    assert.equal(info.status, status);
    const qemus = await qemusMentioning(path.join(home.run, id));
    assert.equal(qemus.length, status === "running" ? 1 : 0, `QEMUs of ${id}: ${qemus}`);
    const leftovers = (await readdir(home.snapshots)).filter((n) => n.startsWith("."));
    assert.deepEqual(leftovers, [], "no staging or half-deleted snapshot left");
    if (status === "paused") {
      const runDirs = await readdir(home.run).catch(() => [] as string[]);
      assert.ok(!runDirs.includes(id), "a paused sandbox has no run directory");
      assert.ok(info.pause_tag, "its state layer is recorded");
      assert.ok((await readdir(home.snapshots)).includes(info.pause_tag));
    }
  };

  it("kill -9 at each step of a pause", async () => {
    await start("pause.stopped");
    const spawned = await send((daemon as DaemonProcess).socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 1 },
    });
    assert.equal(spawned.status, 201, spawned.text);
    const id = (spawned.json<Info[]>() as unknown as Info[])[0]?.id as string;
    await exec(id, "echo before-crashes > /root/kept.txt; sync");
    for (const [point, next, survives] of [
      ["pause.stopped", "pause.captured", "running"],
      ["pause.captured", "pause.published", "running"],
      ["pause.published", "pause.recorded", "paused"],
    ] as const) {
      void point;
      if ((await get(id)).status === "paused") {
        const resumed = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${id}/resume`);
        assert.equal(resumed.status, 200, resumed.text);
      }
      await crashes("POST", `/v1/sandboxes/${id}/pause`);
      await start(next);
      await expectState(id, survives);
      if (survives === "running") assert.equal(await exec(id, "cat /root/kept.txt"), "before-crashes\n");
    }
    // Paused by the restart that finished the published pause; resume and pause once more, crashing at the end.
    const resumed = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${id}/resume`);
    assert.equal(resumed.status, 200, resumed.text);
    assert.equal(
      await exec(id, "cat /root/kept.txt; echo second >> /root/kept.txt; sync"),
      "before-crashes\n",
    );
    await crashes("POST", `/v1/sandboxes/${id}/pause`);
    await start("resume.started");
    await expectState(id, "paused");

    for (const [next, survives] of [
      ["resume.launched", "paused"],
      ["resume.restored", "paused"],
      ["resume.recorded", "paused"],
      [undefined, "running"],
    ] as const) {
      await crashes("POST", `/v1/sandboxes/${id}/resume`);
      await start(next);
      await expectState(id, survives);
    }
    assert.equal(await exec(id, "cat /root/kept.txt"), "before-crashes\nsecond\n");

    // kill -9 from outside while paused, then a normal restart.
    const paused = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${id}/pause`);
    assert.equal(paused.status, 200, paused.text);
    await (daemon as DaemonProcess).crash();
    await start();
    await expectState(id, "paused");
    const again = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${id}/resume`);
    assert.equal(again.status, 200, again.text);
    assert.equal(await exec(id, "cat /root/kept.txt"), "before-crashes\nsecond\n");
    assert.equal((await send((daemon as DaemonProcess).socket, "DELETE", `/v1/sandboxes/${id}`)).status, 204);
    assert.deepEqual(await qemusMentioning(home.run), []);
    const layers = (await readdir(home.snapshots)).filter((n) => n.startsWith("pause-"));
    assert.deepEqual(layers, [], "killing it removed its pause layers");
  });

  it("a filesystem-only pause (memory: false) killed at each step: running, or paused with a whole kept disk", async () => {
    await daemon?.stop();
    await start("pause.stopped");
    const spawned = await send((daemon as DaemonProcess).socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 1 },
    });
    assert.equal(spawned.status, 201, spawned.text);
    const id = (spawned.json<Info[]>() as unknown as Info[])[0]?.id as string;
    // Not synced on purpose: the pause's own sync in the guest must get it to the disk.
    await exec(id, "echo before-the-pause > /root/fs-kept.txt");
    const keptDir = path.join(home.home, "kept-disks", id);
    const expectFs = async (status: "running" | "paused") => {
      assert.equal((await get(id)).status, status);
      const qemus = await qemusMentioning(path.join(home.run, id));
      assert.equal(qemus.length, status === "running" ? 1 : 0, `QEMUs of ${id}: ${qemus}`);
      const kept = await readdir(keptDir).catch(() => [] as string[]);
      assert.deepEqual(kept, status === "paused" ? ["disk.qcow2"] : [], "a whole kept disk iff paused");
    };
    const pauseCrashes = async () => {
      const current = daemon as DaemonProcess;
      await assert.rejects(
        send(current.socket, "POST", `/v1/sandboxes/${id}/pause`, { json: { memory: false } }),
        "the daemon died mid-request",
      );
      assert.equal((await current.exited).signal, "SIGKILL");
    };
    for (const [next, survives] of [
      ["pause.captured", "running"],
      ["pause.published", "running"],
      ["resume.restored", "paused"],
    ] as const) {
      await pauseCrashes();
      await start(next);
      await expectFs(survives);
      if (survives === "running") assert.equal(await exec(id, "cat /root/fs-kept.txt"), "before-the-pause\n");
    }
    // A cold boot killed once it runs: still paused, its kept disk whole; then one that finishes.
    await crashes("POST", `/v1/sandboxes/${id}/resume`);
    await start();
    await expectFs("paused");
    const resumed = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${id}/resume`);
    assert.equal(resumed.status, 200, resumed.text);
    await expectFs("running");
    assert.equal(await exec(id, "cat /root/fs-kept.txt"), "before-the-pause\n");
    assert.equal((await send((daemon as DaemonProcess).socket, "DELETE", `/v1/sandboxes/${id}`)).status, 204);
    assert.deepEqual(await qemusMentioning(home.run), []);
  });

  it("kept disks at the daemon's start: what no paused sandbox owns is swept, a paused one whose disk is gone is lost", async () => {
    await daemon?.stop();
    await start("resume.recorded");
    const current = () => daemon as DaemonProcess;
    const spawn = async () => {
      const spawned = await send(current().socket, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: tag, n: 1 },
      });
      assert.equal(spawned.status, 201, spawned.text);
      return (spawned.json<Info[]>() as unknown as Info[])[0]?.id as string;
    };
    const pauseFs = async (id: string) => {
      const r = await send(current().socket, "POST", `/v1/sandboxes/${id}/pause`, {
        json: { memory: false },
      });
      assert.equal(r.status, 200, r.text);
    };
    const keptRoot = path.join(home.home, "kept-disks");
    const entries = async () => (await readdir(keptRoot).catch(() => [] as string[])).sort();

    // A cold boot recorded running, the daemon killed before it removed the kept name: an orphan kept disk.
    const booted = await spawn();
    await exec(booted, "echo cold-booted > /root/sweep.txt");
    await pauseFs(booted);
    await crashes("POST", `/v1/sandboxes/${booted}/resume`);
    assert.deepEqual(
      await readdir(path.join(keptRoot, booted)),
      ["disk.qcow2"],
      "the crash left the kept name",
    );
    // Planted beside it: a kept disk of no sandbox, a symlink to outside the home, something not named like ours.
    const stray = "sb-0123456789ab";
    await mkdir(path.join(keptRoot, stray));
    await writeFile(path.join(keptRoot, stray, "disk.qcow2"), "no sandbox owns this");
    const outside = await mkdtemp(path.join(os.tmpdir(), "forkd-kept-outside-"));
    await writeFile(path.join(outside, "precious"), "not the daemon's");
    await symlink(outside, path.join(keptRoot, "sb-abcdefabcdef"));
    await writeFile(path.join(keptRoot, "not-a-sandbox"), "someone else's");

    await start();
    assert.equal((await get(booted)).status, "running");
    assert.equal((await qemusMentioning(path.join(home.run, booted))).length, 1, "its VM re-attached");
    assert.equal(await exec(booted, "cat /root/sweep.txt"), "cold-booted\n");
    assert.deepEqual(
      await entries(),
      ["not-a-sandbox"],
      "orphans and the symlink swept; the foreign entry left",
    );
    assert.equal(
      await readFile(path.join(outside, "precious"), "utf8"),
      "not the daemon's",
      "the link not followed",
    );
    await rm(outside, { recursive: true, force: true });

    // A paused sandbox whose kept disk went while the daemon was down: dead, saying it is lost.
    const lostAtStart = await spawn();
    await pauseFs(lostAtStart);
    await current().stop();
    await rm(path.join(keptRoot, lostAtStart), { recursive: true });
    await start();
    assert.equal((await get(lostAtStart)).status, "dead");
    const refused = await send(current().socket, "POST", `/v1/sandboxes/${lostAtStart}/resume`, { json: {} });
    assert.equal(refused.status, 409, refused.text);
    assert.match(
      refused.text,
      /lost: its kept disk \(a filesystem-only pause's\) was missing at the daemon's start/,
    );

    // One whose kept disk goes while the daemon runs: its resume answers 409 saying so, and it is dead.
    const lostAtResume = await spawn();
    await pauseFs(lostAtResume);
    await rm(path.join(keptRoot, lostAtResume), { recursive: true });
    const atResume = await send(current().socket, "POST", `/v1/sandboxes/${lostAtResume}/resume`, {
      json: {},
    });
    assert.equal(atResume.status, 409, atResume.text);
    assert.match(atResume.text, /cannot be resumed: lost: its kept disk .* was missing at its resume/);
    assert.equal((await get(lostAtResume)).status, "dead");
    assert.deepEqual(await qemusMentioning(path.join(home.run, lostAtResume)), []);

    for (const id of [booted, lostAtStart, lostAtResume]) {
      assert.equal((await send(current().socket, "DELETE", `/v1/sandboxes/${id}`)).status, 204);
    }
    assert.deepEqual(await entries(), ["not-a-sandbox"]);
    await rm(path.join(keptRoot, "not-a-sandbox"));
    assert.deepEqual(await qemusMentioning(home.run), []);
  });

  it("a paused sandbox survives a (simulated) host reboot and resumes with its address", {
    skip: !root && "needs root: sandbox networks",
  }, async () => {
    await daemon?.stop();
    await start();
    const spawned = await send((daemon as DaemonProcess).socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: tag, n: 1 },
    });
    assert.equal(spawned.status, 201, spawned.text);
    const before = (spawned.json<Info[]>() as unknown as Info[])[0] as Info;
    assert.equal(before.network.kind, "netns");
    await exec(before.id, "echo across-a-reboot > /root/reboot.txt; sync");
    const paused = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${before.id}/pause`);
    assert.equal(paused.status, 200, paused.text);
    await (daemon as DaemonProcess).stop();
    // What a reboot leaves: another boot id, and no network namespaces.
    const db = new Database(path.join(home.home, "state.db"));
    db.prepare("UPDATE meta SET value = ? WHERE key = 'boot_id'").run("00000000-0000-4000-8000-000000000000");
    db.close();
    await run("ip", ["netns", "delete", before.netns as string]);
    await start();
    await expectState(before.id, "paused");
    const resumed = await send((daemon as DaemonProcess).socket, "POST", `/v1/sandboxes/${before.id}/resume`);
    assert.equal(resumed.status, 200, resumed.text);
    const after = resumed.json<Info>();
    assert.equal(after.network.address, before.network.address, "the same address on the bridge");
    const { stdout } = await run("ip", ["netns", "list"]);
    assert.match(stdout, new RegExp(`^${before.netns}\\b`, "m"), "its namespace was made again");
    assert.equal(await exec(before.id, "cat /root/reboot.txt"), "across-a-reboot\n");
    assert.equal(
      (await send((daemon as DaemonProcess).socket, "DELETE", `/v1/sandboxes/${before.id}`)).status,
      204,
    );
  });
});
