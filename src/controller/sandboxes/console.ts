/**
 * A sandbox's serial console as the service reads it: the end of the live VM's bounded log, or of the log its
 * run directory kept; and the last lines recorded with a sandbox whose VM ended on its own (a guest panic).
 */

import path from "node:path";
import { invalidArgument } from "../../common/errors.js";
import { MAX_CONSOLE_READ_BYTES } from "../../common/limits.js";
import type { SandboxRow } from "../../store/db.js";
import { printableConsole, readTail } from "../../vmm/console-log.js";
import { RUN_FILES } from "../machines/machine.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import { isIntIn } from "./spawn-request.js";

/** Console output kept in the record of a sandbox whose VM ended on its own. */
export const EXIT_CONSOLE_TAIL_BYTES = 2048;

/** The last `maxBytes` of sandbox `id`'s serial console (bounded per sandbox; see vmm/console-log.ts). */
export async function readConsole(live: LiveSandboxes, id: string, maxBytes: number): Promise<string> {
  const row = live.row(id);
  if (!isIntIn(maxBytes, 1, MAX_CONSOLE_READ_BYTES)) {
    throw invalidArgument(`bytes must be an integer in 1..${MAX_CONSOLE_READ_BYTES}`);
  }
  if (row.status === "dead") return "";
  const running = live.get(id);
  const data = running
    ? await running.handle.console.tail(maxBytes)
    : await readTail(path.join(row.run_dir, RUN_FILES.console), maxBytes).catch(() => Buffer.alloc(0));
  return printableConsole(data);
}

/** The end of the console log in `row`'s run directory (empty when there is none), as printable text. */
export async function exitConsoleTail(row: SandboxRow): Promise<string> {
  return printableConsole(
    await readTail(path.join(row.run_dir, RUN_FILES.console), EXIT_CONSOLE_TAIL_BYTES).catch(() =>
      Buffer.alloc(0),
    ),
  ).trim();
}
