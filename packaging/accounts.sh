#!/bin/sh
# Creates the accounts forkd uses on a host, idempotently (as root). Run by scripts/install-deps.sh and by the
# Debian package's postinst; the daemon creates forkd-vm itself at start if it is missing
# (src/isolation/identity.ts), with the same settings.
#
#   group forkd     members may use the daemon's socket (/run/forkd/forkd.sock, mode 0660: --socket-group forkd)
#   user forkd-vm   a system user that holds the uid range sandboxed QEMUs run under (uid = base + their pid)
#                   in /etc/subuid and /etc/subgid, so that no other account is ever given those ids.
#                   FORKD_VM_UID_BASE (default 2000000000) + every possible pid (2^22 ids).
#   user forkd-build  holds the range image build steps run as (root of their user namespace is the range's
#                   first id, never the host's root): FORKD_BUILD_UID_BASE (default 1900000000), 65536 ids.
#                   The daemon creates it too (src/image/step-sandbox/identity.ts) at its first build.
#
# All stay when forkd is removed or purged: files and processes may still carry those ids, and a later
# account given them would own what is left (packaging/README.md).
set -eu

if ! getent group forkd >/dev/null; then
  groupadd --system forkd
fi

vm_base="${FORKD_VM_UID_BASE:-2000000000}"
vm_count=4194304
vm_range="${vm_base}-$((vm_base + vm_count - 1))"
if ! getent passwd forkd-vm >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
    --comment "forkd reserves the uid range of sandboxed QEMUs" forkd-vm
fi
if ! grep -qx "forkd-vm:${vm_base}:${vm_count}" /etc/subuid 2>/dev/null ||
  ! grep -qx "forkd-vm:${vm_base}:${vm_count}" /etc/subgid 2>/dev/null; then
  usermod --add-subuids "$vm_range" --add-subgids "$vm_range" forkd-vm
fi

build_base="${FORKD_BUILD_UID_BASE:-1900000000}"
build_count=65536
build_range="${build_base}-$((build_base + build_count - 1))"
if ! getent passwd forkd-build >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
    --comment "forkd reserves the uid range build steps run as" forkd-build
fi
if ! grep -qx "forkd-build:${build_base}:${build_count}" /etc/subuid 2>/dev/null ||
  ! grep -qx "forkd-build:${build_base}:${build_count}" /etc/subgid 2>/dev/null; then
  usermod --add-subuids "$build_range" --add-subgids "$build_range" forkd-build
fi
