#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, Go (the guest
# agent is a static Go binary, built from src/agent/guest with the standard library only), and the npm
# dependencies. Uses the machine's own apt and npm configuration. Safe to run again.
#
# Format-2 templates (docs/templates.md) add skopeo (copying images), umoci (unpacking and repacking layers),
# bubblewrap (the build-step sandbox) and buildah (Dockerfiles); the registry tests run Debian's
# docker-registry on a loopback port of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio kmod iproute2 zstd ca-certificates golang-go busybox-static \
  skopeo umoci bubblewrap buildah docker-registry >/dev/null
# The package starts a registry service on :5000; forkd's tests run their own and need no service.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
npm ci --no-audit --no-fund
npm run build
