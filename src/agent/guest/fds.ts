/**
 * Descriptors the agent inherited from whoever started it (anything above stdio) would otherwise be inherited
 * by every process it spawns: libuv closes nothing in the child beyond what it dup2()s. Marking them
 * close-on-exec at startup keeps exec'd processes and the Python worker down to their own stdio.
 * (The agent's own descriptors, like the virtio port, are opened with O_CLOEXEC by libuv already.)
 */
import { readdirSync } from "node:fs";
import type { Libc } from "./libc.js";

const F_GETFD = 1;
const F_SETFD = 2;
const FD_CLOEXEC = 1;

/** Returns the descriptors it marked. */
export function markInheritedCloseOnExec(libc: Libc): number[] {
  const marked: number[] = [];
  for (const entry of readdirSync("/proc/self/fd")) {
    const fd = Number(entry);
    if (!Number.isInteger(fd) || fd <= 2) continue;
    const flags = libc.fcntl(fd, F_GETFD) as number;
    if (flags < 0 || (flags & FD_CLOEXEC) !== 0) continue; // closed meanwhile (the readdir handle), or already set
    if ((libc.fcntl(fd, F_SETFD, "int", flags | FD_CLOEXEC) as number) === 0) marked.push(fd);
  }
  return marked;
}
