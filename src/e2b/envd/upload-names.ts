/**
 * An upload is written to a temporary name beside its target and renamed into place when complete, so a failed
 * upload never leaves a half-written file. E2B's envd writes in place, so its watchers see only the user's
 * file: the watch events of envd's WatchDir and pollable watchers hide the temporary names, and the rename that
 * puts an upload in place is reported as its target's create and write, as an in-place write shows them.
 */

import { randomBytes } from "node:crypto";
import path from "node:path";
import type { FsEvent } from "../../agent/host/types.js";

const TEMPORARY = /^\.(.+)\.forkd-upload-[0-9a-f]{12}$/;

/** The temporary name an upload to `target` is written under. */
export function uploadTemporary(target: string): string {
  const dir = path.posix.dirname(target);
  return path.posix.join(
    dir,
    `.${path.posix.basename(target)}.forkd-upload-${randomBytes(6).toString("hex")}`,
  );
}

/** A per-watch filter: events to pass on for each event the guest reported (none, one, or two). */
export function uploadEventFilter(): (event: FsEvent) => FsEvent[] {
  // Targets whose temporary was just renamed away: their next create is the upload landing.
  const landing = new Set<string>();
  return (event) => {
    const dir = path.posix.dirname(event.name);
    const match = TEMPORARY.exec(path.posix.basename(event.name));
    if (match) {
      if (event.op === "rename") landing.add(path.posix.join(dir, match[1] as string));
      return [];
    }
    if (event.op === "create" && landing.delete(event.name)) {
      return [event, { name: event.name, op: "write" }];
    }
    return [event];
  };
}
