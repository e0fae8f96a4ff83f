#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, iproute2 and nftables
# (sandbox networks), Go (the guest agent and the sandbox launcher are static Go binaries built from src/ with
# the standard library only), and the npm dependencies; plus what the Python SDK's tests use (python3-venv and
# python3-wheel to build and install its wheel with no index, mypy to type-check it), and Chromium (the web
# console's browser tests drive Debian's chromium through playwright-core; no browser download). Uses the machine's own apt
# and npm configuration. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: this installs Debian packages and must run as root; run it (or the script that called it) with sudo" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio kmod iproute2 nftables zstd ca-certificates golang-go \
  busybox-static python3 python3-venv python3-wheel mypy chromium >/dev/null
npm ci --no-audit --no-fund
npm run build
