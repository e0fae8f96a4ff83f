#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, iproute2 and nftables
# (sandbox networks), Go (the launcher and guest agent are built from source), and the npm
# dependencies. Uses the machine's own apt and npm configuration. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio kmod iproute2 nftables golang-go zstd ca-certificates >/dev/null
npm ci --no-audit --no-fund
npm run build
