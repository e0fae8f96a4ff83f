/**
 * `snapshot-diff`: a new layer on top of snapshot `from` made by running a command: spawn a sandbox from `from`
 * (transient: a daemon killed mid-way kills it on restart instead of re-attaching), run `command` (a non-zero
 * exit or a timeout aborts with its output), BRANCH it in diff mode as `tag`, kill it.
 */

import { crashPoint } from "../../common/crash-points.js";
import { conflict, ForkdError, invalidArgument } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import type { BranchOutcome, ForkChild, SandboxInfo } from "../sandbox-service.js";
import type { DaemonSnapshots } from "../snapshots/daemon-snapshots.js";
import type { Branching } from "./branching.js";
import type { GuestCalls } from "./guest-calls.js";
import type { Spawner } from "./spawn.js";
import type { Teardown } from "./teardown.js";

/** Default limit for the command of a snapshot-diff (package installs under TCG take minutes). */
export const SNAPSHOT_DIFF_EXEC_TIMEOUT_MS = 30 * 60_000;

export interface SnapshotDiffContext {
  snapshots: Pick<DaemonSnapshots, "store">;
  spawner: Pick<Spawner, "children">;
  guest: Pick<GuestCalls, "exec">;
  branching: Pick<Branching, "branch">;
  teardown: Pick<Teardown, "kill">;
}

export interface SnapshotDiffRequest {
  from: string;
  tag: string;
  command: string[];
  timeoutMs?: number;
  owner?: string | null;
  signal?: AbortSignal;
}

export type SnapshotDiffOutcome = BranchOutcome & { exit_code: number; stdout: string; stderr: string };

export async function snapshotDiff(
  ctx: SnapshotDiffContext,
  request: SnapshotDiffRequest,
): Promise<SnapshotDiffOutcome> {
  assertTag(request.from, "from");
  assertTag(request.tag);
  if (!Array.isArray(request.command) || request.command.length === 0) {
    throw invalidArgument("exec must be a non-empty command");
  }
  if (await ctx.snapshots.store.exists(request.tag)) {
    throw conflict(`snapshot ${JSON.stringify(request.tag)} already exists`);
  }
  const timeoutMs = request.timeoutMs ?? SNAPSHOT_DIFF_EXEC_TIMEOUT_MS;
  // Transient: a daemon killed mid-way must not leave it running forever (it has no lifetime) for the restart
  // to re-attach (seen in the fault suite: diff.ran left it running).
  const [child] = await ctx.spawner.children(
    { snapshotTag: request.from, n: 1, timeoutMs: 0, owner: request.owner, signal: request.signal },
    "all-or-nothing",
    "snapshot-diff",
  );
  const id = ((child as ForkChild).sandbox as SandboxInfo).id;
  crashPoint("diff.spawned");
  try {
    const ran = await ctx.guest.exec(id, request.command, { timeoutMs, signal: request.signal });
    const stdout = ran.stdout.toString("utf8");
    const stderr = ran.stderr.toString("utf8");
    if (ran.timedOut || ran.exitCode !== 0) {
      const why = ran.timedOut ? `timed out after ${timeoutMs} ms` : `exited with ${ran.exitCode}`;
      throw new ForkdError(
        "unprocessable",
        `snapshot-diff ${request.tag}: the command ${why}\n${tail(stdout)}${tail(stderr)}`,
        {
          detail: { exit_code: ran.exitCode, stdout, stderr },
        },
      );
    }
    // Page cache and journal are in the captured RAM anyway; sync makes the disk layer self-explanatory.
    await ctx.guest.exec(id, ["sync"], { timeoutMs: 60_000 });
    crashPoint("diff.ran");
    const outcome = await ctx.branching.branch(id, {
      tag: request.tag,
      mode: "diff",
      signal: request.signal,
    });
    crashPoint("diff.branched");
    return { ...outcome, exit_code: ran.exitCode, stdout, stderr };
  } finally {
    await ctx.teardown.kill(id).catch(() => {});
  }
}

/** The last few KiB of a command's output, for an error message. */
function tail(text: string): string {
  const t = text.length > 4096 ? `…${text.slice(-4096)}` : text;
  return t && !t.endsWith("\n") ? `${t}\n` : t;
}
