/**
 * Who a step's `user` is: names and numbers resolved from the image's own /etc/passwd and /etc/group (never the
 * host's). Root (uid 0) needs no forkd-runas.
 */
import fs from "node:fs/promises";
import { ForkdError } from "../../common/errors.js";
import { resolveInRoot } from "../rootfs.js";

export interface Credentials {
  uid: number;
  gid: number;
  groups: number[];
  home: string | undefined;
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

async function readGuestLines(root: string, file: string): Promise<string[][]> {
  const text = await fs.readFile(await resolveInRoot(root, file, true), "utf8").catch(() => "");
  return text
    .split("\n")
    .filter((l) => l !== "" && !l.startsWith("#"))
    .map((l) => l.split(":"));
}

/**
 * The credentials `user` ("name", "uid", "name:group", "uid:gid") stands for in the image at `root`, read from
 * its own /etc/passwd and /etc/group (never the host's). Root (uid 0) is null: no forkd-runas needed.
 */
export async function resolveCredentials(root: string, user: string): Promise<Credentials | null> {
  const [userPart = "", groupPart] = user.split(":");
  const passwd: PasswdEntry[] = (await readGuestLines(root, "/etc/passwd")).map((f) => ({
    name: f[0] ?? "",
    uid: Number(f[2]),
    gid: Number(f[3]),
    home: f[5] ?? "/",
  }));
  const groups = await readGuestLines(root, "/etc/group");
  const numeric = /^[0-9]+$/.test(userPart);
  const entry = numeric
    ? passwd.find((p) => p.uid === Number(userPart))
    : passwd.find((p) => p.name === userPart);
  if (!entry && !numeric) {
    throw new ForkdError(
      "invalid_argument",
      `user ${JSON.stringify(userPart)} is not in the image's /etc/passwd`,
    );
  }
  const uid = entry?.uid ?? Number(userPart);
  let gid = entry?.gid ?? uid;
  if (groupPart !== undefined) {
    if (/^[0-9]+$/.test(groupPart)) gid = Number(groupPart);
    else {
      const g = groups.find((f) => f[0] === groupPart);
      if (!g)
        throw new ForkdError(
          "invalid_argument",
          `group ${JSON.stringify(groupPart)} is not in the image's /etc/group`,
        );
      gid = Number(g[2]);
    }
  }
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) {
    throw new ForkdError(
      "invalid_argument",
      `user ${JSON.stringify(user)}: the image's passwd entry is malformed`,
    );
  }
  if (uid === 0 && gid === 0) return null;
  const supplementary =
    entry === undefined || groupPart !== undefined
      ? []
      : groups
          .filter((f) => (f[3] ?? "").split(",").includes(entry.name))
          .map((f) => Number(f[2]))
          .filter((g) => Number.isInteger(g) && g !== gid);
  return { uid, gid, groups: [...new Set(supplementary)], home: entry?.home };
}
