/**
 * Whether (and how) this process confines the QEMUs it starts. `on` (the default): every QEMU runs through the
 * launcher as an unprivileged uid of its own with no capabilities, no_new_privs, a mount namespace that shows
 * only what it needs, QEMU's seccomp sandbox, and (for the daemon's sandboxes) cgroups. `off` exists to measure
 * what confinement costs (bench) and for hosts where it cannot work; it is never chosen silently: a root
 * process that cannot confine refuses to start VMs until told `FORKD_CONFINEMENT=off`.
 */
import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { errorMessage, ForkdError, invalidArgument } from "../common/errors.js";
import { ensureVmIdentity, type VmUidRange, vmUidRange } from "./identity.js";
import { launcherPrefix } from "./launcher.js";

export type ConfinementMode = "on" | "off";

export interface ConfinementConfig {
  mode: ConfinementMode;
  /** The uids QEMUs run as (uid = base + pid); null when QEMU runs as this process's own user. */
  uids: VmUidRange | null;
  /** QEMU's seccomp sandbox (needs no privilege: on whenever confinement is). */
  seccomp: boolean;
  /** Per-sandbox cgroups (the daemon's sandboxes). */
  cgroups: boolean;
  /** In words, for `forkd doctor` and logs. */
  summary: string;
}

/** `FORKD_CONFINEMENT` (on|off), default on. */
export function confinementMode(env: NodeJS.ProcessEnv = process.env): ConfinementMode {
  const raw = env.FORKD_CONFINEMENT;
  if (raw === undefined || raw === "" || raw === "on") return "on";
  if (raw === "off") return "off";
  throw invalidArgument(`FORKD_CONFINEMENT must be on or off, got ${JSON.stringify(raw)}`);
}

const resolved = new Map<string, Promise<ConfinementConfig>>();

/**
 * The confinement VMs of this process get. As root with `on`: the identity range is reserved (identity.ts)
 * and the launcher is tried once; if it cannot confine, this rejects (`unavailable`, with the launcher's
 * reason) rather than run QEMU as root. Not root: QEMU runs as this user (never root), with seccomp.
 */
export function resolveConfinement(
  mode: ConfinementMode = confinementMode(),
  env: NodeJS.ProcessEnv = process.env,
): Promise<ConfinementConfig> {
  const range = vmUidRange(env);
  const key = `${mode}:${range.base}`;
  let config = resolved.get(key);
  if (!config) {
    config = computeConfinement(mode, range);
    config.catch(() => resolved.delete(key));
    resolved.set(key, config);
  }
  return config;
}

async function computeConfinement(mode: ConfinementMode, range: VmUidRange): Promise<ConfinementConfig> {
  if (mode === "off") {
    return {
      mode,
      uids: null,
      seccomp: false,
      cgroups: false,
      summary: "off (FORKD_CONFINEMENT=off): QEMU runs as this process's user, unconfined",
    };
  }
  const uid = process.getuid?.() ?? 0;
  if (uid !== 0) {
    return {
      mode,
      uids: null,
      seccomp: true,
      cgroups: false,
      summary: `QEMU runs as this process's own user (uid ${uid}), with QEMU's seccomp sandbox; no uid per sandbox, mount namespace or cgroups without root`,
    };
  }
  await ensureVmIdentity(range);
  const problem = await launcherCannotConfine(range);
  if (problem !== null) {
    throw new ForkdError(
      "unavailable",
      `cannot confine QEMU here (${problem}); refusing to run it as root. Fix that, or set FORKD_CONFINEMENT=off to run QEMU unconfined`,
    );
  }
  return {
    mode,
    uids: range,
    seccomp: true,
    cgroups: true,
    summary: `on: each QEMU runs as uid ${range.base}+pid, no capabilities, no_new_privs, its own mount namespace, seccomp, cgroups`,
  };
}

/** Runs the launcher once with a confinement (a scratch run directory, /bin/true): null if it works. */
async function launcherCannotConfine(range: VmUidRange): Promise<string | null> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "forkd-confine-check-"));
  try {
    const [binary, ...args] = launcherPrefix({ confine: { uidBase: range.base, runDir: dir } });
    return await new Promise<string | null>((resolve) => {
      execFile(binary as string, [...args, "true"], { timeout: 30_000 }, (err, _stdout, stderr) => {
        if (!err) resolve(null);
        else if ((err as NodeJS.ErrnoException).code === "ENOENT")
          resolve(`${binary} is missing (npm run build)`);
        else resolve(String(stderr).trim() || errorMessage(err));
      });
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
