/**
 * A host program for the no-stray-QEMU tests: starts a paused QEMU through spawnQemu, prints its pid as one
 * JSON line, then waits to be signalled (or dies the way argv[2] says). Without a mode it does nothing, so a
 * test runner that globs every file under test/ runs it harmlessly.
 */
import path from "node:path";
import { spawnQemu } from "../../src/vmm/qemu-process.js";
import { pausedQemuArgs } from "./helpers.js";

const MODES = ["wait", "exit", "throw", "handle-hup"];
const mode = process.argv[2] ?? "";
const dir = process.argv[3];
if (MODES.includes(mode) && dir) await main(mode, dir);

async function main(mode: string, dir: string): Promise<void> {
  const qemu = await spawnQemu({ args: pausedQemuArgs(path.join(dir, "host-program-qmp.sock")) });
  process.stdout.write(`${JSON.stringify({ qemuPid: qemu.pid, hostPid: process.pid })}\n`);
  if (mode === "throw") {
    setTimeout(() => {
      throw new Error("host program crashed on purpose");
    }, 50);
  } else if (mode === "handle-hup") {
    // A program with its own SIGHUP meaning (the daemon reopens its audit log): its QEMUs must live on.
    process.on("SIGHUP", () => process.stdout.write("hup\n"));
    setInterval(() => {}, 1000);
  } else if (mode === "exit") {
    setTimeout(() => process.exit(3), 50);
  } else {
    setInterval(() => {}, 1000);
  }
}
