// An E2B agent, unchanged: it runs on E2B's cloud or on a forkd daemon, depending only on three environment
// variables (see docs/e2b.md):
//
//   export E2B_API_URL=http://127.0.0.1:8889 E2B_SANDBOX_URL=http://127.0.0.1:8889 E2B_API_KEY=<a daemon token>
//   node examples/e2b/agent.mjs
//
// It computes in a sandbox, leaves state in memory and on disk, forks the sandbox three ways and lets each fork
// go its own way from that state.
import { Sandbox } from "@e2b/code-interpreter";

const sandbox = await Sandbox.create({ timeoutMs: 5 * 60_000 });
try {
  const first = await sandbox.runCode("import numpy as np\nsamples = np.linspace(0, 1, 5)\nsamples.tolist()");
  console.log(`samples: ${first.text}`);
  await sandbox.files.write("notes.txt", "written before the fork\n");
  await sandbox.runCode("history = ['parent']");

  const forks = await sandbox.fork({ count: 3, timeoutMs: 2 * 60_000 });
  const reports = await Promise.all(
    forks.map(async (fork, i) => {
      if (fork instanceof Error) return `fork ${i} did not start: ${fork.message}`;
      try {
        const step = await fork.runCode(`history.append('fork ${i}'); (samples * ${i + 1}).sum(), history`);
        const disk = await fork.commands.run("cat notes.txt && hostname");
        return `fork ${i}: ${step.text} | ${disk.stdout.trim().replace("\n", " | ")}`;
      } finally {
        await fork.kill();
      }
    }),
  );
  for (const report of reports) console.log(report);
  console.log(`parent still has: ${(await sandbox.runCode("history")).text}`);
} finally {
  await sandbox.kill();
}
