/**
 * Starts bubblewrap as the build range's first id, unprivileged on the host, in a user namespace whose ids
 * 0..65535 are the range (identity.ts). bwrap creates the namespace; we, root, write its uid and gid maps
 * (as newuidmap would, without a subordinate-id entry for root) while bwrap waits on its --userns-block-fd,
 * so the sandbox is root in its namespace, holds capabilities only there, and owns nothing on the host but
 * the range's ids.
 *
 * fds handed to bwrap: 3 its --info-fd (it reports the namespace's first process), 4 its --userns-block-fd.
 * bwrap resolves every path it binds as the range's first id (even --bind-fd's /proc/self/fd links), so what
 * it binds must be reachable by that id: the callers keep such paths under directories only root and that id
 * may enter (ownership.ts).
 */

import type { ChildProcess } from "node:child_process";
import fs from "node:fs/promises";
import { errorMessage, ForkdError } from "../../common/errors.js";
import { type RunOptions, type RunResult, run } from "../run.js";
import type { BuildIdRange } from "./identity.js";

const INFO_FD = 3;
const BLOCK_FD = 4;
/** bwrap reports its child within this long, or it is killed. */
const INFO_TIMEOUT_MS = 30_000;

export interface NamespacedRun extends Omit<RunOptions, "credentials" | "extraFds" | "onSpawn"> {
  range: BuildIdRange;
  /** A network namespace (/run/netns/<name>) the sandbox joins (entered as root, before the ids change). */
  netns?: string;
}

/** Runs `bwrap <bwrapArgs>` (which must not name --unshare-user, --info-fd or --userns-block-fd itself). */
export function runInUserNamespace(bwrapArgs: readonly string[], options: NamespacedRun): Promise<RunResult> {
  const { range, netns, ...runOptions } = options;
  const userns = [
    "--unshare-user",
    "--userns-block-fd",
    String(BLOCK_FD),
    "--info-fd",
    String(INFO_FD),
    ...bwrapArgs,
  ];
  let mapping: Promise<void> | undefined;
  const onSpawn = (child: ChildProcess) => {
    mapping = mapWhenReady(child, range);
    mapping.catch((err: unknown) => {
      runOptions.onStderrLine?.(`forkd: mapping the build's user namespace failed: ${errorMessage(err)}`);
      if (child.pid !== undefined) {
        try {
          process.kill(-child.pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
    });
  };
  const extraFds = ["pipe", "pipe"] as const;
  const started = netns
    ? run(
        "nsenter",
        [`--net=${netns}`, `--setgid=${range.base}`, `--setuid=${range.base}`, "--", "bwrap", ...userns],
        { ...runOptions, extraFds, onSpawn },
      )
    : run("bwrap", userns, {
        ...runOptions,
        credentials: { uid: range.base, gid: range.base },
        extraFds,
        onSpawn,
      });
  return started.then(
    async (result) => {
      await mapping;
      return result;
    },
    async (err: unknown) => {
      const why = await mapping?.then(
        () => undefined,
        (e: unknown) => e,
      );
      if (why !== undefined && !runOptions.signal?.aborted) {
        throw new ForkdError("internal", `the build sandbox's user namespace: ${errorMessage(why)}`, {
          cause: err,
        });
      }
      throw err;
    },
  );
}

/** Reads bwrap's info, writes the maps of the namespace it made, then lets it go on. */
async function mapWhenReady(child: ChildProcess, range: BuildIdRange): Promise<void> {
  const info = child.stdio[INFO_FD] as NodeJS.ReadableStream | null;
  const block = child.stdio[BLOCK_FD] as NodeJS.WritableStream | null;
  if (!info || !block) throw new Error("bwrap's info and block pipes are missing");
  const text = await new Promise<string>((resolve, reject) => {
    let data = "";
    const timer = setTimeout(() => reject(new Error("bwrap did not report its child")), INFO_TIMEOUT_MS);
    info.setEncoding("utf8");
    info.on("data", (chunk: string) => {
      data += chunk;
      if (data.length > 65_536) reject(new Error("bwrap's info is too long"));
    });
    info.once("end", () => {
      clearTimeout(timer);
      resolve(data);
    });
    info.once("error", reject);
  });
  if (text === "") return; // bwrap failed before it made the namespace; its exit status says why
  const pid = (JSON.parse(text) as { "child-pid"?: unknown })["child-pid"];
  if (typeof pid !== "number" || !Number.isInteger(pid) || pid <= 1) {
    throw new Error(`bwrap reported no child pid: ${text.slice(0, 200)}`);
  }
  // Only bwrap's own child, already running as the range's first id, gets a map.
  const status = await fs.readFile(`/proc/${pid}/status`, "utf8");
  const ppid = Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]);
  const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
  if (ppid !== child.pid || uid !== range.base) {
    throw new Error(`process ${pid} is not bwrap's child in the build range (parent ${ppid}, uid ${uid})`);
  }
  const map = `0 ${range.base} ${range.count}\n`;
  await fs.writeFile(`/proc/${pid}/uid_map`, map);
  await fs.writeFile(`/proc/${pid}/gid_map`, map);
  block.on("error", () => {});
  block.end("1");
}
