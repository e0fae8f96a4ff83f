#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine (as root): install what is needed, build the pyagent
# image, snapshot a warm parent, fork 100 children that each evaluate numpy.zeros(5).tolist(), and print the
# benchmark table (bench/results/spawn.{json,md}).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
node bin/forkd.js doctor || true
node bin/forkd.js image build pyagent
node bin/forkd.js snapshots --json | grep -q '"tag": "pyagent"' || node bin/forkd.js snapshot --tag pyagent
node scripts/bench.mjs spawn
