#!/usr/bin/env bash
# The forkd container image, built without a container engine from the release artifacts:
#
#   scripts/build-image.sh forkd_<version>_<arch>.deb [out-dir]   ->  out-dir/forkd-image (an OCI layout, tag <version>)
#   scripts/build-image.sh --push REF out-dir/forkd-image         ->  skopeo copies it to REF (docker://host:port/forkd:v)
#
# The .deb is what `npm run package` makes (npm pack's artifact, installed by scripts/build-deb.sh). The root
# filesystem is Debian 13 (trixie: its nodejs is 20, which the .deb's native modules were built for; Debian 12
# has only 18) made by mmdebstrap from the mirror this machine's own apt sources name, with the .deb and its
# Depends installed by apt; umoci adds it as the image's one layer and sets the entrypoint (`forkd`: the same
# image runs `forkd daemon` on nodes, `forkd gateway` and `forkd cluster-controller`). Reproducible: every time
# in the tarball and the image config is SOURCE_DATE_EPOCH (default: the .deb's mtime), so the same .deb and
# the same archive snapshot give the same layer digest. Needs root (mmdebstrap's chroot), mmdebstrap, umoci
# and, for --push, skopeo (all in Debian 12).
set -euo pipefail
usage() { echo "usage: scripts/build-image.sh forkd_<v>_<arch>.deb [out-dir] | --push REF OCI-LAYOUT-DIR" >&2; exit 2; }
[ $# -ge 1 ] || usage
if [ "$1" = "--push" ]; then
  [ $# -eq 3 ] || usage
  ref="$2"; layout="$3"
  tag=$(cat "$layout/forkd-tag")
  insecure=()
  # A registry on a loopback or private address of the tests is plain HTTP.
  case "$ref" in 127.*|localhost:*|10.*) insecure=(--dest-tls-verify=false) ;; esac
  exec skopeo copy "${insecure[@]}" "oci:$layout:$tag" "docker://$ref"
fi
[ $# -le 2 ] || usage
deb="$(realpath "$1")"
out="$(realpath "${2:-.}")"
[ -f "$deb" ] || { echo "build-image: no such package: $1" >&2; exit 2; }
for tool in mmdebstrap umoci dpkg-deb; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build-image: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done
version=$(dpkg-deb -f "$deb" Version)
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(stat -c %Y "$deb")}"

# The Debian mirror of this machine's apt sources (deb822 or one-line format), never a host name of ours.
mirror=$(
  { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } |
    grep -v -- '-security' | head -n1 || true
)
[ -n "$mirror" ] || { echo "build-image: no Debian mirror in this machine's apt sources" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/forkd-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp "$deb" "$work/forkd.deb"
echo "build-image: root filesystem (Debian trixie from $mirror, forkd $version and its Depends)" >&2
mmdebstrap --variant=apt --format=tar --mode=root \
  --include=ca-certificates \
  --customize-hook="copy-in $work/forkd.deb /tmp" \
  --customize-hook='chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends /tmp/forkd.deb' \
  --customize-hook='rm "$1"/tmp/forkd.deb' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*' \
  trixie "$work/rootfs.tar" "deb $mirror trixie main" >&2

layout="$out/forkd-image"
rm -rf "$layout"
mkdir -p "$out"
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci raw add-layer --image "$layout:$version" --history.created "$created" --history.created_by "scripts/build-image.sh" "$work/rootfs.tar"
umoci config --image "$layout:$version" --created "$created" --history.created "$created" \
  --history.created_by "scripts/build-image.sh (entrypoint)" \
  --config.entrypoint /usr/bin/forkd --config.cmd daemon --config.workingdir / \
  --config.label "org.opencontainers.image.title=forkd" --config.label "org.opencontainers.image.version=$version" \
  --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
umoci gc --layout "$layout"
echo "$version" > "$layout/forkd-tag"
echo "build-image: $layout:$version" >&2
