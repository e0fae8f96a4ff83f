/**
 * A daemon started under a strict umask (077, as a hardened service manager or an admin's shell may set) serves
 * spawns (issue 20, item 9): everything an unprivileged QEMU must open (its run directory, console and agent
 * sockets, disk layer, the snapshot's files) gets the modes it needs explicitly, whatever the umask. Before, every
 * spawn failed with 503: the confined QEMU, running as its own uid, could not open what the daemon made for it.
 * A real daemon process, real VMs.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { type DaemonProcess, startDaemonProcess } from "../api/daemon-process.js";
import { send } from "../api/raw-http.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const root = process.getuid?.() === 0;

describe("a daemon under umask 077", { skip: !root && "needs root", timeout: 15 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let daemon: DaemonProcess | undefined;
  let tag: string;

  before(async () => {
    home = await tempHome("forkd-umask-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    daemon = await startDaemonProcess(home.home, [], { umask: 0o077 });
  });
  after(async () => {
    await daemon?.stop();
    const left = await qemusMentioning(home.home);
    await home.cleanup();
    assert.deepEqual(left, [], "no QEMU left running");
  });

  it("spawns, runs a command and kills", async () => {
    const d = daemon as DaemonProcess;
    const spawned = await send(d.socket, "POST", "/v1/sandboxes", { json: { snapshot_tag: tag, n: 1 } });
    assert.equal(spawned.status, 201, `${spawned.text}\n${d.log()}`);
    const id = spawned.json<{ id: string }[]>()[0]?.id as string;
    const ran = await send(d.socket, "POST", `/v1/sandboxes/${id}/exec`, {
      json: { args: ["sh", "-c", "echo umask-ok"] },
    });
    assert.equal(ran.status, 200, ran.text);
    assert.match(ran.text, /umask-ok/);
    const killed = await send(d.socket, "DELETE", `/v1/sandboxes/${id}`);
    assert.ok(killed.status < 300, killed.text);
  });

  it("builds a snapshot whose files its children's QEMUs can read, and spawns from it", async () => {
    const d = daemon as DaemonProcess;
    const created = await send(d.socket, "POST", "/v1/snapshots", {
      json: { tag: "umask-minimal", template: "minimal" },
    });
    assert.equal(created.status, 201, `${created.text}\n${d.log()}`);
    const spawned = await send(d.socket, "POST", "/v1/sandboxes", {
      json: { snapshot_tag: "umask-minimal", n: 1 },
    });
    assert.equal(spawned.status, 201, `${spawned.text}\n${d.log()}`);
    const id = spawned.json<{ id: string }[]>()[0]?.id as string;
    const ran = await send(d.socket, "POST", `/v1/sandboxes/${id}/exec`, {
      json: { args: ["sh", "-c", "echo child-ok"] },
    });
    assert.equal(ran.status, 200, ran.text);
    assert.match(ran.text, /child-ok/);
    const killed = await send(d.socket, "DELETE", `/v1/sandboxes/${id}`);
    assert.ok(killed.status < 300, killed.text);
  });
});
