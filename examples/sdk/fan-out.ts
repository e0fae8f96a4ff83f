/**
 * Fan-out: fork several sandboxes from one warm snapshot, give each a different input, collect the answers.
 * Each child starts from the parent's warm Python (numpy imported) and diverges from there on its own.
 *
 *   node --import tsx examples/sdk/fan-out.ts [n]
 *
 * Settings as in quickstart.ts (FORKD_URL, FORKD_TOKEN, FORKD_SNAPSHOT).
 */
import { Sandbox } from "../../src/sdk/index.js";

const n = Number(process.argv[2] ?? 4);
const snapshotTag = process.env.FORKD_SNAPSHOT ?? "pyagent";

// One request forks all n children (all or nothing); each lives at most two minutes.
const sandboxes = await Sandbox.createMany(n, { snapshotTag, timeoutMs: 120_000 });
try {
  const answers = await Promise.all(
    sandboxes.map(async (sandbox, i) => {
      const { result, error } = await sandbox.runCode(
        `import numpy, random\nrandom.seed(${i})\nseed = ${i}\nfloat(numpy.linalg.norm(numpy.arange(${i + 1})))`,
      );
      return { id: sandbox.id, input: i, result, error: error?.name ?? null };
    }),
  );
  console.table(answers);
} finally {
  // Kill them all, even if one failed.
  await Promise.allSettled(sandboxes.map((sandbox) => sandbox.kill()));
}
