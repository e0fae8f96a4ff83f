/**
 * Host-side usage from /proc, measured on real processes: a child that holds 64 MiB of its own pages and spins
 * shows them as private, resident and proportional memory and as CPU; a process that is gone gives null; the
 * host's numbers agree with Node's own view of the machine.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import os from "node:os";
import { after, before, describe, it } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { parseProcStatCpu, smapsRollup, UsageSampler } from "../../src/controller/host/usage.js";

const HELD_BYTES = 64 * 1024 * 1024;
// Fills a buffer (every page written, so private and resident), says so, then spins.
const HOG = `const b = Buffer.alloc(${HELD_BYTES}, 1); process.stdout.write("ready\\n"); for (;;) b[0]++;`;

describe("usage measured from /proc", () => {
  let hog: ChildProcess;

  before(async () => {
    hog = spawn(process.execPath, ["-e", HOG], { stdio: ["ignore", "pipe", "inherit"] });
    await once(hog.stdout as NodeJS.ReadableStream, "data");
  });

  after(() => {
    if (hog.exitCode === null) hog.kill("SIGKILL");
  });

  it("reports a process's private, proportional and resident memory", async () => {
    const memory = await smapsRollup(hog.pid as number);
    assert.ok(memory);
    assert.ok(memory.private >= HELD_BYTES, `private ${memory.private} < ${HELD_BYTES}`);
    assert.ok(memory.pss >= memory.private, "PSS counts all private pages plus a share of the shared ones");
    assert.ok(memory.rss >= memory.pss, "RSS counts shared pages in full");
  });

  it("reports CPU as a rate over the window since the previous sample", async () => {
    const sampler = new UsageSampler();
    const first = await sampler.sandbox("sb-hog", hog.pid as number);
    assert.ok(first);
    await delay(1500);
    const second = await sampler.sandbox("sb-hog", hog.pid as number);
    assert.ok(second);
    assert.ok(second.cpu_window_ms >= 1400 && second.cpu_window_ms < 5000, `window ${second.cpu_window_ms}`);
    assert.ok(second.cpu_seconds > first.cpu_seconds, "CPU time grows while it spins");
    // A spinning process gets a good share of a core even on a loaded 2-core host.
    assert.ok(second.cpu_used_pct > 15 && second.cpu_used_pct <= 100 * os.availableParallelism() + 5);
  });

  it("gives null for a process that is gone, and for a pid that cannot be one", async () => {
    const gone = spawn(process.execPath, ["-e", ""]);
    const pid = gone.pid as number;
    await once(gone, "exit");
    assert.equal(await new UsageSampler().sandbox("sb-gone", pid), null);
    assert.equal(await smapsRollup(0), null);
    assert.equal(await smapsRollup(-1), null);
  });

  it("reports the host as Node sees it", async () => {
    const counts = { starting: 0, running: 2, pausing: 0, paused: 0, resuming: 0, stopping: 0, dead: 1 };
    const host = await new UsageSampler().host(counts);
    assert.equal(host.cpu_count, os.availableParallelism());
    assert.equal(host.mem_total_bytes, os.totalmem());
    assert.ok(host.mem_available_bytes > 0 && host.mem_available_bytes <= host.mem_total_bytes);
    assert.ok(host.cpu_used_pct >= 0 && host.cpu_used_pct <= 100);
    assert.ok(host.daemon_rss_bytes > 0);
    assert.deepEqual(host.sandboxes, counts);
  });

  it("parses the cpu line of /proc/stat, leaving idle and iowait out of busy", () => {
    const stat = "cpu  100 5 50 1000 20 3 2 1 40 0\ncpu0 1 2 3 4 5 6 7 8 9 0\nbtime 1700000000\n";
    assert.deepEqual(parseProcStatCpu(stat), { busy: 161, total: 1181 });
    assert.deepEqual(parseProcStatCpu("no cpu line"), { busy: 0, total: 0 });
  });
});
