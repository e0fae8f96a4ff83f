/**
 * Runs one CLI action: wires Ctrl-C to an AbortSignal (so QEMU children and staging directories are cleaned
 * up, not abandoned), and turns errors into a one-line message and an exit code.
 */
import { errorMessage, ForkdError } from "../common/errors.js";
import { EXIT } from "./exit-codes.js";

export type Action = (signal: AbortSignal) => Promise<number | undefined>;

export async function runCommand(action: Action): Promise<never> {
  const controller = new AbortController();
  let interrupts = 0;
  const onSignal = (sig: NodeJS.Signals) => {
    interrupts++;
    if (interrupts > 1) {
      process.stderr.write("forkd: interrupted again, exiting now\n");
      process.exit(EXIT.interrupted);
    }
    process.stderr.write(`\nforkd: ${sig}: stopping and cleaning up (Ctrl-C again to exit at once)\n`);
    controller.abort(new ForkdError("unavailable", "interrupted"));
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  let code: number;
  try {
    code = (await action(controller.signal)) ?? EXIT.ok;
    if (controller.signal.aborted) code = EXIT.interrupted;
  } catch (err) {
    if (controller.signal.aborted) {
      process.stderr.write("forkd: interrupted; cleaned up\n");
      code = EXIT.interrupted;
    } else {
      process.stderr.write(`forkd: ${errorMessage(err)}\n`);
      code = err instanceof ForkdError && err.code === "invalid_argument" ? EXIT.usage : EXIT.failure;
    }
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
  // process.exit drops what a pipe has not taken yet (a full pipe makes a write asynchronous): `forkd exec`'s
  // last output chunk was lost that way when the reader was slow.
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  process.exit(code);
}

/** Resolves once everything written to `stream` so far has been handed to the system. */
function flushed(stream: NodeJS.WriteStream): Promise<void> {
  return new Promise((resolve) => {
    if (stream.writableLength === 0 || stream.destroyed) resolve();
    else stream.write("", () => resolve());
  });
}
