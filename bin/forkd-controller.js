#!/usr/bin/env node
// forkd v0.5's daemon command, `forkd-controller serve [options]` (its systemd and Kubernetes files run it): the same
// as `forkd daemon [options]`, which takes v0.5's flags (--bind, --state, --snapshot-root, --branch-concurrency, ...).
if (process.argv[2] !== "serve") {
  process.stderr.write(
    "forkd-controller: only `forkd-controller serve [options]` is provided (it is `forkd daemon`)\n",
  );
  process.exit(2);
}
process.argv[2] = "daemon";
await import("../dist/src/cli/main.js");
