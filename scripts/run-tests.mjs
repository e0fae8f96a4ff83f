#!/usr/bin/env node
// Runs the compiled test files (dist/test/**/*.test.js) one file at a time. Node 20's `--test <dir>` would
// also run every other .js file under a test/ directory (fixtures, helper programs) as if it were a test.
// Extra arguments filter by substring: `node scripts/run-tests.mjs agent vmm`. `--recipes` runs the heavy recipe
// tests instead (test/recipes/*.recipe-test.ts: large Debian builds, long warm-ups; `npm run test:recipes`), and
// `--install` the install tests (test/install/*.install-test.ts: pack, npm and .deb installs; `npm run test:install`),
// `--cluster` the cluster suite (test/cluster/*.cluster-test.ts: a local cluster of 3 nodes; `npm run test:cluster`).
// `--name=<regex>` (repeatable) runs only the test cases whose names match, in the files chosen (node's
// --test-name-pattern; a suite's before/after hooks still run): `--cluster --name='registry outage'`.
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../dist/test/", import.meta.url));
const args = process.argv.slice(2);
const SUITES = {
  "--recipes": ".recipe-test.js",
  "--install": ".install-test.js",
  "--cluster": ".cluster-test.js",
};
const suite = args.find((a) => a in SUITES);
const NAME = "--name=";
const names = args
  .filter((a) => a.startsWith(NAME))
  .map((a) => `--test-name-pattern=${a.slice(NAME.length)}`);
const needles = args.filter((a) => !(a in SUITES) && !a.startsWith(NAME));
const files = readdirSync(root, { recursive: true })
  .map(String)
  .filter((f) => f.endsWith(suite ? SUITES[suite] : ".test.js"))
  .filter((f) => needles.length === 0 || needles.some((needle) => f.includes(needle)))
  .sort()
  .map((f) => path.join(root, f));
if (files.length === 0) {
  console.error("no test files found under dist/test (run npm run build first)");
  process.exit(1);
}
// The usual reporter (spec on a terminal, TAP otherwise), and at the end the slowest files (scripts/test-timings.mjs).
const reporters = [
  `--test-reporter=${process.stdout.isTTY ? "spec" : "tap"}`,
  "--test-reporter-destination=stdout",
  `--test-reporter=${fileURLToPath(new URL("./test-timings.mjs", import.meta.url))}`,
  "--test-reporter-destination=stdout",
];
const result = spawnSync(
  process.execPath,
  ["--test", "--test-concurrency=1", ...reporters, ...names, ...files],
  {
    stdio: "inherit",
  },
);
process.exit(result.status ?? 1);
