/**
 * Pause/resume and forkd v0.5 workspaces through the real `forkd` CLI and the reference workspace routes, on a
 * real daemon with real VMs: `forkd spawn --on-timeout pause`, `forkd pause|resume`, `forkd ls --status`, and
 * `forkd workspace create|suspend|resume|list|delete`. A file written before a pause or suspend is there after
 * the resume, the sandbox keeps its id and its network (namespace address and egress policy), wrong-state calls
 * get the route's own error, and deleting the workspace leaves no QEMU and no pause layer.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readdir } from "node:fs/promises";
import { after, before, describe, it } from "node:test";
import { cliEntry, type DaemonProcess, startDaemonProcess } from "../api/daemon-process.js";
import { send } from "../api/raw-http.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

interface Network {
  kind: string;
  address: string | null;
  egress: { egress: string; allow_out: string[]; deny_out: string[] } | null;
}
interface Info {
  id: string;
  status: string;
  on_timeout: string;
  pause_tag: string | null;
  network: Network;
}
interface Workspace {
  name: string;
  status: string;
  live_sandbox_id?: string;
  current_state_tag?: string;
}

describe("forkd pause|resume and forkd workspace through the CLI", { timeout: 20 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let daemon: DaemonProcess;

  before(async () => {
    home = await tempHome("forkd-cli-pause-");
    tag = await linkSharedSnapshot(home.home, "minimal");
    daemon = await startDaemonProcess(home.home);
  });
  after(async () => {
    await daemon?.stop();
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
  });

  const forkd = (...args: string[]) =>
    new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = spawn(process.execPath, [...cliEntry(), ...args], {
        env: { ...process.env, FORKD_URL: `unix:${daemon.socketPath}`, FORKD_HOME: home.home },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d) => {
        stdout += d;
      });
      child.stderr.on("data", (d) => {
        stderr += d;
      });
      child.on("close", (code) => resolve({ code, stdout, stderr }));
    });
  const forkdJson = async <T>(...args: string[]): Promise<T> => {
    const run = await forkd(...args, "--json");
    assert.equal(run.code, 0, `forkd ${args.join(" ")}: ${run.stderr}`);
    return JSON.parse(run.stdout) as T;
  };
  const sh = async (id: string, script: string) => {
    const r = await send(daemon.socket, "POST", `/v1/sandboxes/${id}/exec`, {
      json: { args: ["sh", "-c", script] },
    });
    assert.equal(r.status, 200, r.text);
    return r.json<{ stdout: string }>().stdout;
  };

  it("pause and resume keep the sandbox's id, files and network; wrong states are refused", async () => {
    const [spawned] = await forkdJson<Info[]>(
      "spawn",
      "-t",
      tag,
      "--on-timeout",
      "pause",
      "--deny-out",
      "10.9.0.0/16",
    );
    const sandbox = spawned as Info;
    assert.equal(sandbox.on_timeout, "pause");
    await sh(sandbox.id, "echo kept > /root/cli.txt; sync");

    const paused = await forkdJson<{ sandbox: Info; tag: string; bytes_stored: number }>("pause", sandbox.id);
    assert.equal(paused.sandbox.status, "paused");
    assert.equal(paused.sandbox.pause_tag, paused.tag);
    assert.ok(paused.bytes_stored > 0);
    assert.deepEqual(await qemusMentioning(home.run), [], "a paused sandbox has no QEMU");
    const listed = await forkdJson<Info[]>("ls", "--status", "paused");
    assert.deepEqual(
      listed.map((s) => s.id),
      [sandbox.id],
    );
    const again = await forkd("pause", sandbox.id);
    assert.notEqual(again.code, 0);
    assert.match(again.stderr, /paused|not running/);
    const exec = await send(daemon.socket, "POST", `/v1/sandboxes/${sandbox.id}/exec`, {
      json: { args: ["true"] },
    });
    assert.equal(exec.status, 409, "a paused sandbox's calls answer 409");
    assert.match(exec.text, /paused/);
    const badId = await forkd("pause", "../etc");
    assert.notEqual(badId.code, 0);
    assert.match(badId.stderr, /invalid sandbox id/);

    const resumed = await forkdJson<Info>("resume", sandbox.id, "--timeout-ms", "600000");
    assert.equal(resumed.id, sandbox.id);
    assert.equal(resumed.status, "running");
    assert.deepEqual(resumed.network, sandbox.network, "same namespace address and egress policy");
    assert.equal(await sh(sandbox.id, "cat /root/cli.txt"), "kept\n");
    const twice = await forkd("resume", sandbox.id);
    assert.notEqual(twice.code, 0);
    assert.match(twice.stderr, /not paused|running/);
    assert.equal((await send(daemon.socket, "DELETE", `/v1/sandboxes/${sandbox.id}`)).status, 204);
  });

  it("workspaces: create, suspend, list, resume, delete", async () => {
    const created = await forkdJson<Workspace>("workspace", "create", "notes", "-t", tag);
    assert.equal(created.status, "running");
    const id = created.live_sandbox_id as string;
    assert.ok(id);
    const before = (await send(daemon.socket, "GET", `/v1/sandboxes/${id}`)).json<Info>();
    await sh(id, "echo draft > /root/notes.txt; sync");
    const duplicate = await send(daemon.socket, "POST", "/v1/workspaces", {
      json: { name: "notes", snapshot_tag: tag },
    });
    assert.equal(duplicate.status, 409, duplicate.text);
    const badName = await send(daemon.socket, "POST", "/v1/workspaces", {
      json: { name: "no/slashes", snapshot_tag: tag },
    });
    assert.equal(badName.status, 400, badName.text);

    const suspended = await forkdJson<Workspace>("workspace", "suspend", "notes", "--diff");
    assert.equal(suspended.status, "suspended");
    assert.ok(suspended.current_state_tag, "its suspend's layer is named");
    assert.ok((await readdir(home.snapshots)).includes(suspended.current_state_tag as string));
    const suspendAgain = await send(daemon.socket, "POST", "/v1/workspaces/notes/suspend", { json: {} });
    assert.equal(suspendAgain.status, 400, "v0.5 answers 400 for a suspend of a suspended workspace");
    const listed = await forkdJson<Workspace[]>("workspace", "list");
    assert.deepEqual(
      listed.map((w) => [w.name, w.status]),
      [["notes", "suspended"]],
    );
    const one = await send(daemon.socket, "GET", "/v1/workspaces/notes");
    assert.equal(one.status, 200);
    assert.equal(one.json<Workspace>().status, "suspended");

    const resumed = await forkdJson<Workspace>("workspace", "resume", "notes");
    assert.equal(resumed.status, "running");
    assert.equal(resumed.live_sandbox_id, id, "the same sandbox, unlike v0.5");
    const after = (await send(daemon.socket, "GET", `/v1/sandboxes/${id}`)).json<Info>();
    assert.deepEqual(after.network, before.network, "it keeps its namespace and policy");
    assert.equal(await sh(id, "cat /root/notes.txt"), "draft\n");
    const resumeAgain = await send(daemon.socket, "POST", "/v1/workspaces/notes/resume", { json: {} });
    assert.equal(resumeAgain.status, 400);

    const deleted = await forkd("workspace", "delete", "notes");
    assert.equal(deleted.code, 0, deleted.stderr);
    assert.equal((await send(daemon.socket, "GET", "/v1/workspaces/notes")).status, 404);
    assert.equal((await send(daemon.socket, "GET", `/v1/sandboxes/${id}`)).status, 404);
    const missing = await forkd("workspace", "resume", "notes");
    assert.notEqual(missing.code, 0);
    assert.match(missing.stderr, /not found/);
    assert.deepEqual(await qemusMentioning(home.run), []);
    const layers = (await readdir(home.snapshots)).filter((n) => n.startsWith("pause-"));
    assert.deepEqual(layers, [], "deleting the workspace removed its pause layers");
  });
});
