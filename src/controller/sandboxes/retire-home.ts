/**
 * Retiring a forkd home from a host (`forkd teardown`; the Debian package runs it when it is removed): every
 * sandbox of the home is killed, and what the home set up outside itself is removed: its bridge and host rules,
 * its cgroup parents, its in-memory cache directory. The home's own files (snapshots, the state database, paused
 * sandboxes) and the image cache are left: they are state, kept until someone deletes them (a package purge).
 *
 * Refused while a daemon runs on the home (its lock): the daemon owns the sandboxes; stop it first, or kill
 * them through it (`forkd kill --all`). Sandboxes are killed the daemon's way (services opened, re-attached,
 * killed with their networks and cgroups) only when some are recorded, or a network is (a warm pool's VM has
 * one before it is a sandbox: a daemon killed with a full pool leaves only that record), so a clean home is torn
 * down without touching cgroups at all.
 */
import { existsSync } from "node:fs";
import { rm, rmdir } from "node:fs/promises";
import path from "node:path";
import { lockHome } from "../../common/home-lock.js";
import type { ForkdPaths } from "../../common/paths.js";
import { detectCgroupLayout } from "../../isolation/cgroup.js";
import { type NetworkConfigInput, resolveNetworkConfig } from "../../net/config.js";
import { removeHostNetwork } from "../../net/host.js";
import { StateDb } from "../../store/db.js";
import { cacheDirs, homeKey } from "../machines/restore-plan.js";
import { openServices } from "./manager.js";

export interface RetireReport {
  /** Sandboxes that were running (or starting) and were killed. */
  killed: string[];
  /** Bridge whose removal was asked for (it is removed only if this home owns it). */
  bridge: string;
  /** Recorded sandboxes left after the kill (paused ones: their state stays in the home). */
  remaining: string[];
}

export async function retireHome(
  paths: ForkdPaths,
  options: { network?: NetworkConfigInput } = {},
): Promise<RetireReport> {
  const lock = await lockHome(paths.home);
  try {
    const dbFile = path.join(paths.home, "state.db");
    let killed: string[] = [];
    if (existsSync(dbFile) && (recorded(dbFile).live.length > 0 || recorded(dbFile).networks > 0)) {
      killed = recorded(dbFile).live;
      // openServices takes the home lock itself.
      await lock.release();
      const services = await openServices(paths, { network: { network: options.network } });
      await services.close({ killSandboxes: true });
    }
    const config = resolveNetworkConfig(options.network, process.env, paths.home);
    await removeHostNetwork(config, paths.home);
    // The record naming the directory is inside the home: read it, never create one.
    const record = path.join(paths.home, "cache", "tmpfs-dir");
    if (existsSync(record)) await rm(cacheDirs(paths).tmpfsDir, { recursive: true, force: true });
    await removeCgroupParents(paths.home);
    return { killed, bridge: config.bridge, remaining: existsSync(dbFile) ? recorded(dbFile).all : [] };
  } finally {
    await lock.release();
  }
}

/** Sandboxes recorded in the home: all but paused ones have (or had: dead) a QEMU and host state to clean up; paused ones are only files. */
function recorded(dbFile: string): { live: string[]; all: string[]; networks: number } {
  const db = new StateDb(dbFile);
  try {
    const rows = db.sandboxes();
    return {
      live: rows.filter((r) => r.status !== "paused").map((r) => r.id),
      all: rows.map((r) => r.id),
      networks: db.networks().length,
    };
  } finally {
    db.close();
  }
}

/** The home's parent cgroups (`<own cgroup>/forkd/<home key>`) and their `forkd` parent, if empty. */
async function removeCgroupParents(home: string): Promise<void> {
  const layout = await detectCgroupLayout(homeKey(home));
  for (const h of Object.values(layout.hierarchies)) {
    for (const dir of [h.parent, path.dirname(h.parent)]) {
      // ENOENT: never created; EBUSY/ENOTEMPTY: still used (another home's cgroups, a process left).
      await rmdir(dir).catch(() => {});
    }
  }
}
