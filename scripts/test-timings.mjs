// A node:test reporter that prints, when the run ends, the slowest test files by wall time: where a run's
// minutes go, so the suite can be kept inside CI's budget (scripts/run-tests.mjs adds it beside the usual
// reporter). Node 20 reports no event per file, so a file's time is the wall time from the previous file's
// last event to its own last one (files run one at a time), beside the sum of its top-level tests' times.
// FORKD_TEST_TIMINGS=<path> also writes the whole table as JSON.
import { writeFileSync } from "node:fs";
import path from "node:path";

const SHOWN = 25;

export default async function* testTimings(source) {
  const started = Date.now();
  const files = new Map();
  let lastEventAt = started;
  for await (const event of source) {
    if (event.type !== "test:pass" && event.type !== "test:fail") continue;
    const { file, nesting, details } = event.data;
    if (!file) continue;
    const now = Date.now();
    const entry = files.get(file) ?? { file, wallMs: 0, testsMs: 0, failed: 0 };
    entry.wallMs += now - lastEventAt;
    if (nesting === 0) entry.testsMs += details?.duration_ms ?? 0;
    if (event.type === "test:fail") entry.failed += 1;
    files.set(file, entry);
    lastEventAt = now;
  }
  const table = [...files.values()].sort((a, b) => b.wallMs - a.wallMs);
  const totalS = (Date.now() - started) / 1000;
  if (process.env.FORKD_TEST_TIMINGS) {
    writeFileSync(process.env.FORKD_TEST_TIMINGS, `${JSON.stringify({ totalS, files: table }, null, 2)}\n`);
  }
  const root = path.join(process.cwd(), "dist", "test");
  yield `\n# slowest test files (wall s, tests s) of ${table.length}, ${totalS.toFixed(0)} s in all\n`;
  for (const { file, wallMs, testsMs } of table.slice(0, SHOWN)) {
    yield `#   ${(wallMs / 1000).toFixed(1).padStart(7)} ${(testsMs / 1000).toFixed(1).padStart(7)}  ${path.relative(root, file)}\n`;
  }
}
