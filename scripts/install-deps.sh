#!/usr/bin/env bash
# Installs what forkd needs on a Debian 12 host (as root): QEMU, the image builder's tools, iproute2 and nftables
# (sandbox networks), Go (the guest agent and the sandbox launcher are static Go binaries built from src/ with
# the standard library only), a C compiler (the small library confined QEMUs preload, src/isolation/ro-ram),
# and the npm dependencies; plus what the Python SDK's tests use (python3-venv and python3-wheel to build and
# install its wheel with no index, mypy to type-check it) and the venv the Python E2B tests run in (the newest
# E2B SDKs and agent frameworks, installed with the machine's own pip configuration), and Chromium (the web console's browser tests drive
# Debian's chromium through playwright-core; no browser download). Then the identity sandboxed QEMUs run under:
# a system user forkd-vm that holds the uid range they use (uid = base + pid) in /etc/subuid and /etc/subgid, so
# no other account is ever given those ids (the daemon does the same at start if it is missing), and the forkd
# group whose members may use the daemon's socket (both in packaging/accounts.sh). Uses the machine's own apt
# and npm configuration. Safe to run again.
#
# Node.js 20 or later with npm must be there, or installable from the configured apt sources (Debian 13's
# nodejs, or NodeSource's if its source is configured): Debian 12's own nodejs is 18 (its npm a separate, old
# package) and bookworm-backports has none, so on a plain Debian 12 this stops before installing anything and
# says how to get one.
#
# Packaging and its tests (docs: the README's Install section): g++ and make to compile better-sqlite3 where npm
# cannot fetch a prebuilt binary for this Node.js, dpkg-dev (dpkg-shlibdeps) for scripts/build-deb.sh, and
# systemd for systemd-analyze, which checks the unit (a container may have no systemd package).
#
# Format-2 templates (docs/templates.md) add skopeo (copying images), umoci (unpacking and repacking layers),
# bubblewrap (the build-step sandbox) and buildah (Dockerfiles); the registry tests run Debian's
# docker-registry on a loopback port of their own. python3-pip: a networked build step reaches the host's
# configured package indexes, and pip says which are its (its configuration and its default index).
#
# The cluster tests (test/cluster) run a real kube-apiserver, etcd, kubectl and helm, which no Debian or npm
# package provides at a usable version: scripts/k8s-tools.sh builds them from their Go modules once per machine
# (cached in /var/cache/forkd/k8s; about 20 CPU-minutes the first time, nothing after). It needs Go >= 1.26.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: this installs Debian packages and must run as root; run it (or the script that called it) with sudo" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq

# Node.js >= 20 with npm, or stop here (before anything is installed) saying how to get one.
scripts/check-node.sh

apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs cpio kmod iproute2 nftables zstd ca-certificates golang-go \
  gcc libc6-dev passwd busybox-static python3 python3-venv python3-wheel mypy chromium \
  skopeo umoci bubblewrap buildah docker-registry python3-pip \
  g++ make dpkg-dev systemd >/dev/null
# The package starts a registry service on :5000; forkd's tests run their own and need no service.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# The forkd group (the daemon's socket), the forkd-vm user holding the sandboxed QEMUs' uid range and the
# forkd-build user holding the range build steps run as.
packaging/accounts.sh
npm ci --no-audit --no-fund
npm run build
# The Python E2B tests' venv and wheels, with the machine's own pip configuration (scripts/python-test-deps.mjs).
node scripts/python-test-deps.mjs
# FORKD_K8S_TOOLS=later leaves the Kubernetes tools to the caller: .ci/run builds them in the background while the
# first tests run (the tests that need them wait for that build: scripts/k8s-tools.sh wait).
if [ "${FORKD_K8S_TOOLS:-build}" = later ]; then
  echo "install-deps: the Kubernetes tools are left to the caller (FORKD_K8S_TOOLS=later)" >&2
else
  scripts/k8s-tools.sh build >/dev/null
fi
