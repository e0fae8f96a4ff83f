#!/usr/bin/env bash
# Makes sure a Node.js >= 20 with npm is there (scripts/install-deps.sh runs it after apt-get update, before it
# installs anything else): the one on PATH; else the nodejs candidate of the configured apt sources if it is new
# enough (Debian 13's own, or NodeSource's when its source is configured), installed with apt-get; else it stops
# with a message saying how to get one. On a plain Debian 12 it stops: Debian 12's nodejs is 18 (npm a separate,
# older package) and bookworm-backports has none (apt-cache policy nodejs, measured on Debian 12).
set -euo pipefail
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ "$(node_major)" -lt 20 ] || ! command -v npm >/dev/null 2>&1; then
  candidate="$(apt-cache policy nodejs 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -n "$candidate" ] && [ "$candidate" != "(none)" ] && dpkg --compare-versions "$candidate" ge 20~; then
    apt-get install -y -qq --no-install-recommends nodejs >/dev/null
    # Debian's own nodejs packages npm separately (NodeSource's includes it).
    command -v npm >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
fi
if [ "$(node_major)" -lt 20 ] || ! command -v npm >/dev/null 2>&1; then
  found="$(node --version 2>/dev/null || echo 'no node')"
  command -v npm >/dev/null 2>&1 || found="$found, no npm"
  cat >&2 <<EOF
forkd needs Node.js 20 or later, with npm; this machine has: $found.
Debian 12's own nodejs is Node.js 18 (and bookworm-backports has no newer one), so install Node.js 20 first:
  - NodeSource's Debian packages for Node.js 20.x (add their apt source as they document, then
    apt-get install nodejs; npm is included), or
  - the Node.js project's prebuilt Linux x64 binaries (node-v20.*-linux-x64.tar.xz) unpacked into /usr/local
    (tar -xJf node-v20.*-linux-x64.tar.xz -C /usr/local --strip-components=1).
Debian 13 and later ship a nodejs >= 20 (and npm) of their own, which this script installs by itself.
Then run scripts/install-deps.sh again.
EOF
  exit 1
fi
