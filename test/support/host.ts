/** Test support: temporary forkd homes and checks that nothing was left running or lying around. */
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import Database from "better-sqlite3";
import { type ForkdPaths, resolvePaths } from "../../src/common/paths.js";
import { cacheDirs } from "../../src/controller/machines/restore-plan.js";
import { resolveNetworkConfig } from "../../src/net/config.js";
import { removeHostNetwork } from "../../src/net/host.js";
import { removeSandboxNetwork } from "../../src/net/namespace.js";

/** A fresh FORKD_HOME under /tmp sharing the machine's image cache (images are pure functions of recipes). */
export async function tempHome(prefix = "forkd-test-"): Promise<ForkdPaths & { cleanup(): Promise<void> }> {
  const home = await mkdtemp(path.join(os.tmpdir(), prefix));
  const paths = resolvePaths({ ...process.env, FORKD_HOME: home });
  return {
    ...paths,
    cleanup: async () => {
      await killProcessesMentioning(home);
      // Sandboxes outlive a daemon (and their namespaces with them): a test that stopped its daemon without
      // killing every sandbox would leave namespaces and veths behind once the home that records them is gone.
      if (process.getuid?.() === 0) {
        for (const id of await recordedNetworks(path.join(home, "state.db")))
          await removeSandboxNetwork(id).catch(() => {});
      }
      // Named by a record inside the home: read it before the home goes.
      const tmpfsDir = cacheDirs(paths).tmpfsDir;
      await rm(home, { recursive: true, force: true });
      await rm(tmpfsDir, { recursive: true, force: true });
      // The home's own bridge and host rules (a daemon of this home created them, if it ran as root).
      if (process.getuid?.() === 0) {
        await removeHostNetwork(resolveNetworkConfig({}, {}, home), home).catch(() => {});
      }
    },
  };
}

/** The sandboxes with a network recorded in the state database `file` (none if it does not exist). */
async function recordedNetworks(file: string): Promise<string[]> {
  let db: Database.Database | undefined;
  try {
    db = new Database(file, { readonly: true, fileMustExist: true });
    return (db.prepare("SELECT sandbox_id FROM sandbox_networks").all() as { sandbox_id: string }[]).map(
      (r) => r.sandbox_id,
    );
  } catch {
    return [];
  } finally {
    db?.close();
  }
}

/** PIDs of processes whose command line contains `needle` (e.g. QEMUs using files under a test home). */
export async function processesMentioning(needle: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = (await readFile(`/proc/${entry}/cmdline`, "utf8")).replaceAll("\0", " ");
      if (cmdline.includes(needle)) pids.push(Number(entry));
    } catch {
      // exited meanwhile
    }
  }
  return pids;
}

/** QEMU processes among `processesMentioning(needle)`. */
export async function qemusMentioning(needle: string): Promise<number[]> {
  const out: number[] = [];
  for (const pid of await processesMentioning(needle)) {
    const comm = await readFile(`/proc/${pid}/comm`, "utf8").catch(() => "");
    if (comm.startsWith("qemu-system")) out.push(pid);
  }
  return out;
}

async function killProcessesMentioning(needle: string): Promise<void> {
  for (const pid of await qemusMentioning(needle)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone
    }
  }
}

/** Polls `check` every 20 ms until it returns a value other than undefined, or throws after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  timeoutMs: number,
  check: () => Promise<T | undefined>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Entries of a directory, [] if it does not exist. */
export async function entries(dir: string): Promise<string[]> {
  return readdir(dir).catch(() => []);
}
