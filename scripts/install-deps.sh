#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, iproute2 and nftables
# (sandbox networks), Go (the guest agent and the sandbox launcher are static Go binaries built from src/ with
# the standard library only), and the npm
# dependencies. Uses the machine's own apt and npm configuration. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio kmod iproute2 nftables zstd ca-certificates golang-go \
  busybox-static >/dev/null
npm ci --no-audit --no-fund
npm run build
