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

# reserve_range USER BASE COUNT COMMENT: a system user USER (its own group, no home, no shell) holding the ids
# BASE..BASE+COUNT-1 in /etc/subuid and /etc/subgid.
reserve_range() {
  user="$1"
  base="$2"
  count="$3"
  if ! getent passwd "$user" >/dev/null; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
      --comment "$4" "$user"
  fi
  if ! grep -qx "${user}:${base}:${count}" /etc/subuid 2>/dev/null ||
    ! grep -qx "${user}:${base}:${count}" /etc/subgid 2>/dev/null; then
    range="${base}-$((base + count - 1))"
    usermod --add-subuids "$range" --add-subgids "$range" "$user"
  fi
}

reserve_range forkd-vm "${FORKD_VM_UID_BASE:-2000000000}" 4194304 "forkd reserves the uid range of sandboxed QEMUs"
reserve_range forkd-build "${FORKD_BUILD_UID_BASE:-1900000000}" 65536 "forkd reserves the uid range build steps run as"
