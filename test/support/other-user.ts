/**
 * Another local user, for probes of what a local account that is not root (and not in forkd's groups) can do:
 * a system account `forkd-probe` with no home and no shell, created once per machine when a test first needs
 * it (tests run as root). Probes run as it through setpriv (util-linux): its uid and gid, no supplementary
 * groups, nothing inherited but the arguments (no_new_privs only when asked: it would also keep a setuid bit
 * from working, which some probes are about).
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);

export const PROBE_USER = "forkd-probe";

export interface LocalUser {
  name: string;
  uid: number;
  gid: number;
}

async function lookup(name: string): Promise<LocalUser | undefined> {
  const found = await run("getent", ["passwd", name]).catch(() => undefined);
  const fields = found?.stdout.trim().split(":");
  if (!fields || fields.length < 4) return undefined;
  return { name, uid: Number(fields[2]), gid: Number(fields[3]) };
}

/** The probe account (created if missing; another test process may create it at the same moment). */
export async function probeUser(): Promise<LocalUser> {
  const existing = await lookup(PROBE_USER);
  if (existing) return existing;
  await run("useradd", [
    "--system",
    "--user-group",
    "--no-create-home",
    "--home-dir",
    "/nonexistent",
    "--shell",
    "/usr/sbin/nologin",
    "--comment",
    "forkd tests, probes as an unprivileged local user",
    PROBE_USER,
  ]).catch(() => {});
  const made = await lookup(PROBE_USER);
  if (!made) throw new Error(`could not create the local user ${PROBE_USER}`);
  return made;
}

/** Runs `argv` as the probe user; resolves with its output and exit status (never rejects on a status). */
export async function runAsProbeUser(
  argv: string[],
  options: { timeoutMs?: number; cwd?: string; noNewPrivs?: boolean } = {},
): Promise<{ stdout: string; stderr: string; code: number }> {
  const user = await probeUser();
  const args = [
    `--reuid=${user.uid}`,
    `--regid=${user.gid}`,
    "--clear-groups",
    "--inh-caps=-all",
    ...(options.noNewPrivs ? ["--no-new-privs"] : []),
    "--",
    // setpriv resolves and execs its program while it still holds root's capabilities: the user's own
    // shell must look the program up, with the user's permissions only.
    "/bin/sh",
    "-c",
    'exec "$@"',
    "sh",
    ...argv,
  ];
  try {
    const { stdout, stderr } = await run("setpriv", args, {
      timeout: options.timeoutMs ?? 60_000,
      cwd: options.cwd ?? "/",
      env: { PATH: "/usr/bin:/bin" },
      maxBuffer: 16 * 1024 * 1024,
    });
    return { stdout, stderr, code: 0 };
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string; code?: number | string };
    return { stdout: e.stdout ?? "", stderr: e.stderr ?? "", code: typeof e.code === "number" ? e.code : -1 };
  }
}
