/**
 * forkd SDK quick start: one sandbox, a streamed command, Python in the warm interpreter, a file round trip.
 *
 *   node --import tsx examples/sdk/quickstart.ts
 *
 * Talks to the daemon at FORKD_URL (default unix:/run/forkd/forkd.sock; FORKD_TOKEN over TCP). Spawns from the
 * snapshot FORKD_SNAPSHOT if set, else from the template "pyagent" (whose snapshot the daemon builds on first use).
 */
import { CommandExitError, Sandbox } from "../../src/sdk/index.js";

const from = process.env.FORKD_SNAPSHOT
  ? { snapshotTag: process.env.FORKD_SNAPSHOT }
  : { template: "pyagent" };

// `await using`: the sandbox is killed when this block ends, however it ends.
await using sandbox = await Sandbox.create({ ...from, timeoutMs: 60_000 });
console.log(`sandbox ${sandbox.id} is ${sandbox.info.status}`);

// Output arrives through the callbacks while the command runs.
const listing = await sandbox.commands.run("uname -sr; for i in 1 2 3; do echo tick $i; sleep 0.2; done", {
  onStdout: (data) => process.stdout.write(`  | ${data}`),
});
console.log(`exit code ${listing.exitCode}`);

// A failing command throws, carrying its output.
try {
  await sandbox.commands.run("echo 'no such thing' >&2; exit 3");
} catch (err) {
  if (!(err instanceof CommandExitError)) throw err;
  console.log(`failed as expected: exit ${err.exitCode}, stderr ${JSON.stringify(err.stderr)}`);
}

// numpy was imported before the snapshot, so this does not pay for the import.
const code = await sandbox.runCode("import numpy\nprint('computing')\nnumpy.arange(10).sum()");
console.log(
  `runCode: result=${code.result} stdout=${JSON.stringify(code.stdout)} error=${code.error?.name ?? null}`,
);

// Files are binary-safe.
const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
await sandbox.files.write("/tmp/bytes.bin", bytes);
const back = await sandbox.files.read("/tmp/bytes.bin", { format: "bytes" });
console.log(`file round trip: ${back.length} bytes, equal=${Buffer.from(back).equals(bytes)}`);
