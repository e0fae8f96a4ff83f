#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, iproute2 and nftables
# (sandbox networks), Go (the guest agent and the sandbox launcher are static Go binaries built from src/ with
# the standard library only), and the npm dependencies; plus what the Python SDK's tests use (python3-venv and
# python3-wheel to build and install its wheel with no index, mypy to type-check it). Uses the machine's own apt
# and npm configuration. Safe to run again.
#
# Format-2 templates (docs/templates.md) add skopeo (copying images), umoci (unpacking and repacking layers),
# bubblewrap (the build-step sandbox) and buildah (Dockerfiles); the registry tests run Debian's
# docker-registry on a loopback port of their own.
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
  busybox-static python3 python3-venv python3-wheel mypy \
  skopeo umoci bubblewrap buildah docker-registry >/dev/null
# The package starts a registry service on :5000; forkd's tests run their own and need no service.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
npm ci --no-audit --no-fund
npm run build
