/**
 * The users of a sandbox's /etc/passwd, as envd resolves them: the user a request acts as must exist, and
 * relative paths are relative to its home. Read from the guest once and kept; a name not found is looked up
 * again (a user added inside the sandbox appears), at most once per REREAD_MS per sandbox. Also the template's
 * working directory (its WORKDIR / setWorkdir, from the image's /opt/forkd/template.json), where E2B's envd
 * starts a process that names no cwd.
 */
import { ForkdError } from "../../common/errors.js";
import type { SandboxService } from "../../controller/sandbox-service.js";

export interface GuestUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

const ROOT: GuestUser = { name: "root", uid: 0, gid: 0, home: "/root" };
const REREAD_MS = 2000;
const MAX_PASSWD_BYTES = 1024 * 1024;
const TEMPLATE_SETTINGS = "/opt/forkd/template.json";
const MAX_TEMPLATE_SETTINGS_BYTES = 1024 * 1024;
/** Sandboxes whose users are remembered; the oldest is forgotten beyond this. */
const MAX_SANDBOXES = 4096;

interface Known {
  users: Map<string, GuestUser>;
  readAtMs: number;
}

/** The files of a sandbox, as the caller's view of the services gives them. */
type SandboxFiles = Pick<SandboxService["files"], "read">;

export class GuestUsers {
  private readonly known = new Map<string, Known>();
  private readonly workdirs = new Map<string, string | null>();

  /**
   * The user `name` of sandbox `id` (its /etc/passwd read through `files`, the caller's view); `unauthorized`
   * (E2B's answer) when the sandbox has no such user.
   */
  async lookup(files: SandboxFiles, id: string, name: string, signal?: AbortSignal): Promise<GuestUser> {
    if (name === "root") return ROOT;
    let known = this.known.get(id);
    if (known?.users.has(name)) return known.users.get(name) as GuestUser;
    if (known === undefined || Date.now() - known.readAtMs > REREAD_MS) {
      known = await this.read(files, id, signal);
    }
    const user = known.users.get(name);
    if (!user)
      throw new ForkdError("unauthorized", `invalid username: '${name}' (no such user in the sandbox)`);
    return user;
  }

  forget(id: string): void {
    this.known.delete(id);
    this.workdirs.delete(id);
  }

  /**
   * The working directory the sandbox's template set (absolute, not "/"), or undefined: then a process starts
   * in its user's home, as on E2B. Read once per sandbox (the template's file does not change).
   */
  async templateWorkdir(files: SandboxFiles, id: string, signal?: AbortSignal): Promise<string | undefined> {
    if (!this.workdirs.has(id)) {
      const text = await files
        .read(id, TEMPLATE_SETTINGS, { maxBytes: MAX_TEMPLATE_SETTINGS_BYTES, signal })
        .then((file) => file.data.toString("utf8"))
        .catch(() => undefined);
      if (this.workdirs.size >= MAX_SANDBOXES)
        this.workdirs.delete(this.workdirs.keys().next().value as string);
      this.workdirs.set(id, text === undefined ? null : workdirOf(text));
    }
    return this.workdirs.get(id) ?? undefined;
  }

  private async read(files: SandboxFiles, id: string, signal?: AbortSignal): Promise<Known> {
    const file = await files.read(id, "/etc/passwd", { maxBytes: MAX_PASSWD_BYTES, signal });
    const known: Known = { users: parsePasswd(file.data.toString("utf8")), readAtMs: Date.now() };
    this.known.delete(id);
    if (this.known.size >= MAX_SANDBOXES) this.known.delete(this.known.keys().next().value as string);
    this.known.set(id, known);
    return known;
  }
}

export function parsePasswd(text: string): Map<string, GuestUser> {
  const users = new Map<string, GuestUser>();
  for (const line of text.split("\n")) {
    const [name, , uid, gid, , home] = line.split(":");
    if (!name || uid === undefined || gid === undefined || home === undefined) continue;
    if (!/^\d+$/.test(uid) || !/^\d+$/.test(gid) || !home.startsWith("/")) continue;
    users.set(name, { name, uid: Number(uid), gid: Number(gid), home });
  }
  return users;
}

/** The `workdir` of a template.json, when it is an absolute directory other than the root. */
export function workdirOf(text: string): string | null {
  try {
    const workdir = (JSON.parse(text) as { workdir?: unknown }).workdir;
    return typeof workdir === "string" && workdir.startsWith("/") && workdir !== "/" ? workdir : null;
  } catch {
    return null;
  }
}
