#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, iproute2 and nftables
# (sandbox networks), Go (the guest agent and the sandbox launcher are static Go binaries built from src/ with
# the standard library only), a C compiler (the small library confined QEMUs preload, src/isolation/ro-ram),
# and the npm dependencies; plus what the Python SDK's tests use (python3-venv and python3-wheel to build and
# install its wheel with no index, mypy to type-check it), and Chromium (the web console's browser tests drive
# Debian's chromium through playwright-core; no browser download). Then the identity sandboxed QEMUs run under:
# a system user forkd-vm that holds the uid range they use (uid = base + pid) in /etc/subuid and /etc/subgid, so
# no other account is ever given those ids (the daemon does the same at start if it is missing); and the range
# image build steps run in, unprivileged (root of their user namespace only): forkd-build with 65536 ids from
# FORKD_BUILD_UID_BASE (default 1900000000), made the same way. Uses the machine's own apt and npm
# configuration. Safe to run again.
#
# Format-2 templates (docs/templates.md) add skopeo (copying images), umoci (unpacking and repacking layers),
# bubblewrap (the build-step sandbox) and buildah (Dockerfiles); the registry tests run Debian's
# docker-registry on a loopback port of their own. python3-pip: a networked build step reaches the host's
# configured package indexes, and pip says which are its (its configuration and its default index).
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
  gcc libc6-dev passwd busybox-static python3 python3-venv python3-wheel mypy chromium \
  skopeo umoci bubblewrap buildah docker-registry python3-pip >/dev/null
# The package starts a registry service on :5000; forkd's tests run their own and need no service.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# The sandboxed QEMUs' uid range: FORKD_VM_UID_BASE (default 2000000000) + every possible pid (2^22).
vm_base="${FORKD_VM_UID_BASE:-2000000000}"
vm_range="${vm_base}-$((vm_base + 4194304 - 1))"
if ! getent passwd forkd-vm >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
    --comment "forkd reserves the uid range of sandboxed QEMUs" forkd-vm
fi
if ! grep -qx "forkd-vm:${vm_base}:4194304" /etc/subuid 2>/dev/null ||
  ! grep -qx "forkd-vm:${vm_base}:4194304" /etc/subgid 2>/dev/null; then
  usermod --add-subuids "$vm_range" --add-subgids "$vm_range" forkd-vm
fi
# Build steps' ids: root of their user namespace is FORKD_BUILD_UID_BASE on the host (never an account's).
build_base="${FORKD_BUILD_UID_BASE:-1900000000}"
build_range="${build_base}-$((build_base + 65536 - 1))"
if ! getent passwd forkd-build >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
    --comment "forkd reserves the uid range build steps run as" forkd-build
fi
if ! grep -qx "forkd-build:${build_base}:65536" /etc/subuid 2>/dev/null ||
  ! grep -qx "forkd-build:${build_base}:65536" /etc/subgid 2>/dev/null; then
  usermod --add-subuids "$build_range" --add-subgids "$build_range" forkd-build
fi
npm ci --no-audit --no-fund
npm run build
