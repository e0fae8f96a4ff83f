#!/bin/sh
# What the benchmarks need beyond scripts/install-deps.sh (the tests do not need these): Debian's gVisor
# (runsc) for bench/peers' gVisor rows. bench/peers still runs without it and says so in those rows.
set -eu
if [ "$(id -u)" -ne 0 ]; then
  echo "install-bench-deps: run as root (apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! command -v runsc >/dev/null 2>&1; then
  apt-get update -q
  apt-get install -y -q runsc
fi
runsc --version | head -1
