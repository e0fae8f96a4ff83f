/**
 * A host program for the no-stray-QEMU tests: starts a paused QEMU through spawnQemu, prints its pid as one
 * JSON line, then waits to be signalled (or dies the way argv[2] says).
 */
import path from "node:path";
import { spawnQemu } from "../../src/vmm/qemu-process.js";
import { pausedQemuArgs } from "./helpers.js";

const mode = process.argv[2] ?? "wait";
const dir = process.argv[3] ?? "/tmp";
const qemu = await spawnQemu({ args: pausedQemuArgs(path.join(dir, "host-program-qmp.sock")) });
process.stdout.write(`${JSON.stringify({ qemuPid: qemu.pid, hostPid: process.pid })}\n`);
if (mode === "throw") {
  setTimeout(() => {
    throw new Error("host program crashed on purpose");
  }, 50);
} else if (mode === "exit") {
  setTimeout(() => process.exit(3), 50);
} else {
  setInterval(() => {}, 1000);
}
