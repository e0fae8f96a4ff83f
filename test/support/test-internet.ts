/**
 * A test "internet" the host routes to: a network namespace behind a veth (host side INTERNET_GATEWAY), with
 * several addresses, an HTTP server on each and a DNS server (test/support/internet-host.ts). Sandboxes reach
 * it the way they reach the real internet: out of their namespace, through the bridge, routed and masqueraded
 * by the host. Its addresses are fixed, so one test process on the machine holds it at a time: another waits
 * (up to WAIT_MS) for the lock file the holder's pid is in.
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import fs from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { launcherBinary } from "../../src/isolation/launcher.js";
import type { Zone } from "./dns-server.js";

const run = promisify(execFile);

export const INTERNET_GATEWAY = "198.51.100.1";
export const INTERNET_DNS = "198.51.100.2";
export const INTERNET_HOSTS = {
  allowed: "198.51.100.10",
  denied: "198.51.100.11",
  wild: "198.51.100.12",
  cidrAllowed: "198.51.100.20",
  other: "198.51.100.30",
} as const;

export const INTERNET_ZONE: Zone = {
  "allowed.test": { a: [INTERNET_HOSTS.allowed], ttl: 300 },
  "denied.test": { a: [INTERNET_HOSTS.denied] },
  "a.wild.test": { a: [INTERNET_HOSTS.wild] },
  "other.test": { a: [INTERNET_HOSTS.other] },
};

export interface TestInternet {
  netns: string;
  dns: string;
  stop(): Promise<void>;
}

const LOCK = "/run/forkd-test-internet.lock";
const WAIT_MS = 30 * 60_000;

/** Takes the machine's test internet lock (waiting for another live holder; a dead one's is taken over). */
async function lockInternet(): Promise<() => Promise<void>> {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const handle = await fs.open(LOCK, "wx").catch(() => undefined);
    if (handle) {
      await handle.writeFile(String(process.pid));
      await handle.close();
      return () => fs.rm(LOCK, { force: true });
    }
    const holder = Number(await fs.readFile(LOCK, "utf8").catch(() => "0"));
    const alive =
      holder > 0 &&
      (await fs.stat(`/proc/${holder}`).then(
        () => true,
        () => false,
      ));
    if (!alive) await fs.rm(LOCK, { force: true });
    else if (Date.now() > deadline) throw new Error(`the test internet is held by process ${holder}`);
    else await new Promise((r) => setTimeout(r, 2000));
  }
}

export async function startTestInternet(): Promise<TestInternet> {
  const unlock = await lockInternet();
  try {
    const internet = await startLocked();
    return {
      ...internet,
      stop: async () => {
        await internet.stop();
        await unlock();
      },
    };
  } catch (err) {
    await unlock();
    throw err;
  }
}

async function startLocked(): Promise<TestInternet> {
  const netns = `fkt-inet-${process.pid}`;
  const hostIf = `fkti${process.pid}`.slice(0, 15);
  const addresses = [INTERNET_DNS, ...Object.values(INTERNET_HOSTS)];
  await removeAbandonedTestInternets();
  // Another test process (of a checkout without the lock) may hold the addresses: wait for it.
  for (const deadline = Date.now() + WAIT_MS; ; ) {
    const routed = (await run("ip", ["route", "show", "to", "match", INTERNET_DNS])).stdout;
    const specific = routed.split("\n").filter((line) => line.trim() !== "" && !line.startsWith("default "));
    if (specific.length === 0) break;
    if (Date.now() > deadline) {
      throw new Error(`the test internet's addresses are already routed on this host:\n${routed}`);
    }
    await new Promise((r) => setTimeout(r, 5000));
  }
  await run("ip", ["netns", "add", netns]);
  let server: ChildProcess | undefined;
  const stop = async () => {
    server?.kill("SIGKILL");
    await run("ip", ["link", "del", hostIf]).catch(() => {});
    await run("ip", ["netns", "del", netns]).catch(() => {});
  };
  try {
    await run("ip", ["link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", netns]);
    await run("ip", ["address", "add", `${INTERNET_GATEWAY}/24`, "dev", hostIf]);
    await run("ip", ["link", "set", hostIf, "up"]);
    for (const address of addresses)
      await run("ip", ["-n", netns, "address", "add", `${address}/24`, "dev", "eth0"]);
    await run("ip", ["-n", netns, "link", "set", "eth0", "up"]);
    await run("ip", ["-n", netns, "link", "set", "lo", "up"]);
    await run("ip", ["-n", netns, "route", "add", "default", "via", INTERNET_GATEWAY]);
    const self = fileURLToPath(import.meta.url);
    const program = path.join(path.dirname(self), `internet-host${path.extname(self)}`);
    server = spawn(
      launcherBinary(),
      [
        "--netns",
        `/run/netns/${netns}`,
        "--",
        process.execPath,
        ...process.execArgv,
        program,
        JSON.stringify(INTERNET_ZONE),
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    await new Promise<void>((resolve, reject) => {
      server?.stdout?.once("data", () => resolve());
      server?.once("exit", (code) => reject(new Error(`the test internet's servers exited (${code})`)));
    });
    return { netns, dns: INTERNET_DNS, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * A test run that was killed leaves its namespace and veth behind, and their route then refuses every later
 * run. Only ours are removed: the names carry the creating process's id, and only a process that is gone.
 */
async function removeAbandonedTestInternets(): Promise<void> {
  const namespaces = (await run("ip", ["netns", "list"])).stdout;
  for (const match of namespaces.matchAll(/^fkt-inet-(\d+)\b/gm)) {
    const pid = Number(match[1]);
    if (pid === process.pid || processExists(pid)) continue;
    await run("ip", ["link", "del", `fkti${pid}`.slice(0, 15)]).catch(() => {});
    await run("ip", ["netns", "del", `fkt-inet-${pid}`]).catch(() => {});
  }
}

function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
