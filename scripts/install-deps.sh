#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, Go (the guest
# agent is a static Go binary, built from src/agent/guest with the standard library only), and the npm
# dependencies. Uses the machine's own apt and npm configuration. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio kmod iproute2 zstd ca-certificates golang-go busybox-static >/dev/null
npm ci --no-audit --no-fund
npm run build
