/**
 * Confinement and limits on real VMs, seen as a hostile guest would meet them: its QEMU's uid, capabilities,
 * seccomp mode, mount namespace and cgroups read from /proc; CPU, memory and pids limits that hold while the
 * guest pushes against them (and hurt only that guest); a console log that stays within its cap while the guest
 * floods the serial port; a disk layer that stops at its cap. Then the same limits through a real daemon process
 * (HTTP and the spawn CLI), and a daemon SIGKILLed mid-spawn leaving no cgroup or run directory after restart.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFile, readlink, stat } from "node:fs/promises";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { homeKey } from "../../src/controller/machines/restore-plan.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";
import { type CgroupLayout, detectCgroupLayout, readCgroupLimits } from "../../src/isolation/cgroup.js";
import { DEFAULT_VM_UID_BASE } from "../../src/isolation/identity.js";
import { StateDb } from "../../src/store/db.js";
import { type DaemonProcess, startDaemonProcess } from "../api/daemon-process.js";
import { send } from "../api/raw-http.js";
import { entries, qemusMentioning, tempHome, waitFor } from "../support/host.js";
import { linkSharedSnapshot } from "../support/snapshots.js";

const root = process.getuid?.() === 0;
const CONSOLE_CAP = 64 * 1024;

async function status(pid: number): Promise<Record<string, string>> {
  const fields: Record<string, string> = {};
  for (const line of (await readFile(`/proc/${pid}/status`, "utf8")).split("\n")) {
    const at = line.indexOf(":");
    if (at > 0) fields[line.slice(0, at)] = line.slice(at + 1).trim();
  }
  return fields;
}

/** utime + stime of a process, in seconds. */
async function cpuSeconds(pid: number): Promise<number> {
  const text = await readFile(`/proc/${pid}/stat`, "utf8");
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

function cgroupDir(layout: CgroupLayout, controller: "memory" | "cpu" | "pids", id: string): string {
  const h = layout.hierarchies[controller];
  assert.ok(h, `the ${controller} controller`);
  return path.join(h.parent, id);
}

async function sandboxCgroupsLeft(layout: CgroupLayout): Promise<string[]> {
  const left: string[] = [];
  for (const h of Object.values(layout.hierarchies)) {
    for (const name of await entries(h.parent)) if (name.startsWith("sb-")) left.push(`${h.parent}/${name}`);
  }
  return left;
}

describe("confinement and limits on real VMs", { skip: !root && "needs root", timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let tag: string;
  let layout: CgroupLayout;
  let services: Awaited<ReturnType<typeof openServices>>;

  before(async () => {
    home = await tempHome("forkd-confine-vm-");
    tag = await linkSharedSnapshot(home.home, "pyagent");
    // Read before any daemon runs: on cgroup v2 the daemon may move its cgroup's processes into a leaf.
    layout = await detectCgroupLayout(homeKey(home.home));
    services = await openServices(home, { consoleLogBytes: CONSOLE_CAP, diskLimitMiB: 64 });
  });
  after(async () => {
    await services?.close({ killSandboxes: true });
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    assert.deepEqual(await sandboxCgroupsLeft(layout), [], "no cgroup left");
    await home.cleanup();
  });

  it("runs each QEMU as its own uid, with no capabilities, seccomp, its own mounts and its cgroups", async () => {
    const infos = await services.sandboxes.spawn({
      snapshotTag: tag,
      n: 2,
      memoryLimitMiB: 700,
      cpuLimitMillicores: 1500,
      pidsLimit: 100,
    });
    const [a, b] = infos as [(typeof infos)[0], (typeof infos)[0]];
    const db = new StateDb(path.join(home.home, "state.db"));
    try {
      const runDirOf = (id: string) => db.sandbox(id)?.run_dir as string;
      const uids = new Set<string>();
      for (const info of [a, b]) {
        const pid = info.pid as number;
        const s = await status(pid);
        assert.match(s.Name ?? "", /qemu/);
        const uid = DEFAULT_VM_UID_BASE + pid;
        assert.equal(s.Uid, `${uid}\t${uid}\t${uid}\t${uid}`, "uid base+pid, real/effective/saved/fs");
        assert.equal(s.Gid, `${uid}\t${uid}\t${uid}\t${uid}`);
        assert.equal(s.Groups, "", "no supplementary groups (no kvm here: TCG)");
        for (const set of ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]) {
          assert.equal(s[set], "0000000000000000", set);
        }
        assert.equal(s.NoNewPrivs, "1");
        assert.equal(s.Seccomp, "2", "QEMU's seccomp filter is on");
        uids.add(s.Uid as string);
        assert.notEqual(await readlink(`/proc/${pid}/ns/mnt`), await readlink("/proc/self/ns/mnt"));
        // What the process sees of the host's files: its own run directory, not its sibling's, not the home.
        const view = `/proc/${pid}/root`;
        const other = runDirOf(info.id === a.id ? b.id : a.id);
        await stat(path.join(view, runDirOf(info.id)));
        await assert.rejects(stat(path.join(view, other)), { code: "ENOENT" }, "a sibling's run dir");
        await assert.rejects(stat(path.join(view, home.home, "state.db")), { code: "ENOENT" });
        await assert.rejects(stat(path.join(view, "/root")), { code: "ENOENT" });
        // Its cgroups hold it from the start and say what was asked for.
        const procCgroup = await readFile(`/proc/${pid}/cgroup`, "utf8");
        for (const controller of ["memory", "cpu", "pids"] as const) {
          const dir = cgroupDir(layout, controller, info.id);
          const procs = (await readFile(path.join(dir, "cgroup.procs"), "utf8")).split("\n");
          assert.ok(procs.includes(String(pid)), `QEMU in its ${controller} cgroup`);
        }
        assert.ok(procCgroup.includes(`/${info.id}`), procCgroup);
        assert.deepEqual(await readCgroupLimits(layout, info.id), {
          memoryBytes: 700 * 2 ** 20,
          cpu: { quotaUs: 150_000, periodUs: 100_000 },
          pids: 100,
        });
        assert.deepEqual(info.limits, { memory_mib: 700, cpu_millicores: 1500, pids: 100, disk_mib: 64 });
      }
      assert.equal(uids.size, 2, "each sandbox has a uid of its own");
      // The RAM image and the disk chain of the snapshot are mapped read-only.
      const maps = await readFile(`/proc/${a.pid}/maps`, "utf8");
      for (const line of maps.split("\n").filter((l) => l.includes("/snapshots/"))) {
        assert.match(line, /^\S+ r.-p /, `snapshot mapping is private and not writable through: ${line}`);
      }
    } finally {
      db.close();
      await services.sandboxes.kill(a.id);
      await services.sandboxes.kill(b.id);
    }
    assert.deepEqual(await sandboxCgroupsLeft(layout), [], "kill removes the cgroups");
    assert.deepEqual(await entries(home.run), [], "and the run directories");
  });

  it("the defaults: memory = RAM + 256 MiB, one CPU per vCPU, 128 pids, the daemon's disk cap", async () => {
    const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
    const id = (info as { id: string }).id;
    try {
      assert.deepEqual(info?.limits, {
        memory_mib: 512 + 256,
        cpu_millicores: 1000,
        pids: 128,
        disk_mib: 64,
      });
      assert.deepEqual(await readCgroupLimits(layout, id), {
        memoryBytes: 768 * 2 ** 20,
        cpu: { quotaUs: 100_000, periodUs: 100_000 },
        pids: 128,
      });
    } finally {
      await services.sandboxes.kill(id);
    }
  });

  it("cpu.max holds against a busy guest; memory.max kills only the guest that passes it", async () => {
    const infos = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, cpuLimitMillicores: 300 });
    const [hog] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, memoryLimitMiB: 200 });
    const busy = infos[0] as (typeof infos)[0];
    const hogId = (hog as { id: string }).id;
    try {
      const pid = busy.pid as number;
      const statFile = path.join(cgroupDir(layout, "cpu", busy.id), "cpu.stat");
      const throttled = async () =>
        Number(/^nr_throttled (\d+)$/m.exec(await readFile(statFile, "utf8"))?.[1]);
      const throttledBefore = await throttled();
      const cpuBefore = await cpuSeconds(pid);
      const started = Date.now();
      await services.sandboxes.exec(busy.id, ["timeout", "10", "sh", "-c", "while :; do :; done"]);
      const wall = (Date.now() - started) / 1000;
      const used = (await cpuSeconds(pid)) - cpuBefore;
      console.log(`# cpu limit 0.3: QEMU used ${used.toFixed(2)} s of CPU in ${wall.toFixed(2)} s`);
      assert.ok(used / wall <= 0.3 * 1.2, `QEMU used ${used.toFixed(2)} s of CPU in ${wall.toFixed(2)} s`);
      assert.ok((await throttled()) > throttledBefore, "the kernel throttled it");

      // The hog dirties 400 MiB of guest RAM against a 200 MiB limit (no swap): its QEMU is OOM-killed.
      await services.sandboxes
        .exec(hogId, [
          "python3",
          "-c",
          "b = bytearray(400 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1",
        ])
        .catch(() => {});
      await waitFor("the hog to be dead", 60_000, async () =>
        services.sandboxes.get(hogId).status === "dead" ? true : undefined,
      );
      const db = new StateDb(path.join(home.home, "state.db"));
      const why = db.sandbox(hogId)?.error ?? "";
      db.close();
      console.log(`# memory limit 200 MiB: ${why.split("\n")[0]}`);
      assert.match(why, /OOM killer at its memory limit \(200 MiB\)/);
      assert.equal((await services.sandboxes.exec(busy.id, ["echo", "alive"])).stdout.toString(), "alive\n");
    } finally {
      await services.sandboxes.kill(busy.id);
      await services.sandboxes.kill(hogId).catch(() => {});
    }
  });

  it("QEMU's tasks stay within pids.max while the guest drives parallel I/O", async () => {
    const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, pidsLimit: 16 });
    const id = (info as { id: string }).id;
    const pidsDir = cgroupDir(layout, "pids", id);
    try {
      let most = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const current = await readFile(path.join(pidsDir, "pids.current"), "utf8").catch(() => "0");
          most = Math.max(most, Number(current));
          await new Promise((r) => setTimeout(r, 20));
        }
      })();
      // 24 writers with direct I/O: each in-flight request wants a worker thread of its own.
      const writers = Array.from(
        { length: 24 },
        (_, i) => `dd if=/dev/zero of=/var/tmp/w${i} bs=64k count=32 oflag=direct 2>/dev/null &`,
      ).join(" ");
      await services.sandboxes
        .exec(id, ["timeout", "60", "sh", "-c", `${writers} wait; echo done`])
        .catch(() => {});
      sampling = false;
      await sampler;
      const events = await readFile(path.join(pidsDir, "pids.events"), "utf8").catch(() => "max 0");
      console.log(`# pids limit 16: at most ${most} tasks; pids.events ${events.trim()}`);
      assert.ok(most > 1 && most <= 16, `at most ${most} tasks`);
    } finally {
      await services.sandboxes.kill(id).catch(() => {});
    }
  });

  it("the console log stays within its cap while the guest floods the serial port", async () => {
    const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1 });
    const id = (info as { id: string }).id;
    const db = new StateDb(path.join(home.home, "state.db"));
    const log = path.join(db.sandbox(id)?.run_dir as string, "console.log");
    db.close();
    try {
      const size = async () =>
        (await stat(log).then((s) => s.size)) +
        (await stat(`${log}.1`).then(
          (s) => s.size,
          () => 0,
        ));
      let most = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          most = Math.max(most, await size());
          await new Promise((r) => setTimeout(r, 20));
        }
      })();
      const flood =
        'i=0; while [ $i -lt 4000 ]; do echo "flood line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; i=$((i+1)); done > /dev/ttyS0; echo FLOOD-END > /dev/ttyS0';
      await services.sandboxes.exec(id, ["timeout", "300", "sh", "-c", flood]);
      await waitFor("the end marker in the log", 30_000, async () =>
        (await readFile(log, "utf8")).includes("FLOOD-END") ? true : undefined,
      );
      sampling = false;
      await sampler;
      const written = 4000 * 90;
      console.log(
        `# console: guest wrote ~${written} bytes, the log held at most ${most} (cap ${CONSOLE_CAP})`,
      );
      assert.ok(most <= CONSOLE_CAP, `log reached ${most} bytes`);
      assert.ok(most >= CONSOLE_CAP / 2, "and it did fill up");
      assert.ok(!(await readFile(`${log}.1`, "utf8")).includes("flood line 0 "), "the oldest output went");
    } finally {
      await services.sandboxes.kill(id);
    }
  });

  it("the disk layer stops at its cap: guest writes past it fail, the sandbox lives", async () => {
    const [info] = await services.sandboxes.spawn({ snapshotTag: tag, n: 1, diskLimitMiB: 32 });
    const id = (info as { id: string }).id;
    const db = new StateDb(path.join(home.home, "state.db"));
    const disk = path.join(db.sandbox(id)?.run_dir as string, "disk.qcow2");
    db.close();
    try {
      const wrote = await services.sandboxes.exec(id, [
        "sh",
        "-c",
        "dd if=/dev/urandom of=/var/tmp/big bs=1M count=96 conv=fsync 2>&1; echo rc=$?",
      ]);
      const out = wrote.stdout.toString();
      console.log(`# disk cap 32 MiB: guest dd says ${out.trim().split("\n").slice(-2).join(" | ")}`);
      assert.ok((await stat(disk)).size <= 32 * 2 ** 20, `overlay is ${(await stat(disk)).size} bytes`);
      assert.doesNotMatch(out, /rc=0/, "the guest's write failed");
      assert.equal(services.sandboxes.get(id).status, "running");
      assert.equal((await services.sandboxes.exec(id, ["echo", "alive"])).stdout.toString(), "alive\n");
    } finally {
      await services.sandboxes.kill(id);
    }
  });

  describe("through a daemon process", () => {
    let daemon: DaemonProcess | undefined;
    before(async () => {
      await services.close({ killSandboxes: true });
      services = undefined as unknown as typeof services;
    });
    after(async () => {
      await daemon?.stop();
    });

    it("takes limits from the API and the spawn CLI, refuses bad ones with 400", async () => {
      daemon = await startDaemonProcess(home.home);
      const bad = await send(daemon.socket, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: tag, n: 1, pids_limit: 3 },
      });
      assert.equal(bad.status, 400, bad.text);
      assert.match(bad.text, /pids_limit/);
      const answer = await send(daemon.socket, "POST", "/v1/sandboxes", {
        json: { snapshot_tag: tag, n: 1, memory_limit_mib: 600, cpu_limit_millicores: 700, pids_limit: 90 },
      });
      assert.equal(answer.status, 201, answer.text);
      const [viaApi] = answer.json<{ id: string; limits: unknown }[]>() as unknown as { id: string }[];
      const apiId = (viaApi as { id: string }).id;
      assert.deepEqual(await readCgroupLimits(layout, apiId), {
        memoryBytes: 600 * 2 ** 20,
        cpu: { quotaUs: 70_000, periodUs: 100_000 },
        pids: 90,
      });
      const self = fileURLToPath(import.meta.url);
      const cli = path.resolve(path.dirname(self), "..", "..", "src", "cli", `main${path.extname(self)}`);
      const ran = await new Promise<{ code: number | null; out: string }>((resolve) => {
        const child = spawn(
          process.execPath,
          [
            ...process.execArgv,
            cli,
            "spawn",
            "--daemon-url",
            `unix:${daemon?.socketPath}`,
            "--tag",
            tag,
            "--cpu-limit-millicores",
            "250",
            "--pids-limit",
            "64",
            "--json",
          ],
          { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, FORKD_TOKEN: "" } },
        );
        let out = "";
        child.stdout.on("data", (d: Buffer) => {
          out += d;
        });
        child.on("close", (code) => resolve({ code, out }));
      });
      assert.equal(ran.code, 0, ran.out);
      const [viaCli] = JSON.parse(ran.out) as { id: string }[];
      assert.deepEqual(await readCgroupLimits(layout, (viaCli as { id: string }).id), {
        memoryBytes: 768 * 2 ** 20,
        cpu: { quotaUs: 25_000, periodUs: 100_000 },
        pids: 64,
      });
      for (const id of [apiId, (viaCli as { id: string }).id]) {
        const killed = await send(daemon.socket, "DELETE", `/v1/sandboxes/${id}`);
        assert.ok(killed.status < 300, killed.text);
      }
    });

    it("a daemon SIGKILLed mid-spawn leaves no cgroup, run directory or QEMU after its restart", async () => {
      const d = daemon as DaemonProcess;
      const spawning = send(d.socket, "POST", "/v1/sandboxes", { json: { snapshot_tag: tag, n: 3 } }).catch(
        () => null,
      );
      await waitFor("a sandbox cgroup", 120_000, async () =>
        (await sandboxCgroupsLeft(layout)).length > 0 ? true : undefined,
      );
      await d.crash();
      await spawning;
      daemon = await startDaemonProcess(home.home);
      await waitFor("the orphans to be swept", 60_000, async () =>
        (await qemusMentioning(home.home)).length === 0 ? true : undefined,
      );
      assert.deepEqual(await sandboxCgroupsLeft(layout), [], "no cgroup left");
      assert.deepEqual(await entries(home.run), [], "no run directory left");
    });
  });
});
