#!/usr/bin/env bash
# Builds the Debian package from the npm release artifact (npm pack's forkd-<version>.tgz):
#
#   scripts/build-deb.sh forkd-<version>.tgz [out-dir]     ->  out-dir/forkd_<version>_<arch>.deb
#
# The artifact is installed by npm exactly as a user's `npm install -g` would (the shrinkwrapped dependencies;
# better-sqlite3 compiled and koffi's prebuilt binary unpacked for this machine's Node.js), into a staging
# prefix; the tree then becomes /usr/lib/forkd, with:
#   /usr/bin/forkd, forkd-controller, forkd-mcp   scripts that run /usr/lib/forkd/bin/*.js with /usr/bin/node
#                                                 (the nodejs package's, whose ABI the native modules match)
#   /lib/systemd/system/forkd.service             packaging/forkd.service, as shipped in the artifact
#   /usr/share/doc/forkd/                         copyright, README.md
# and packaging/debian/{control,postinst,prerm,postrm} of this checkout. Depends: nodejs of the major this was
# built with (native modules are built for its ABI), the libraries the native code links (dpkg-shlibdeps), and
# the Debian tools forkd runs (packaging/debian/control). Needs dpkg-dev (dpkg-shlibdeps) and npm; no root
# (dpkg-deb --root-owner-group).
set -euo pipefail
usage() { echo "usage: scripts/build-deb.sh forkd-<version>.tgz [out-dir]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
checkout="$(cd "$(dirname "$0")/.." && pwd)"
tgz="$(realpath "$1")"
out="$(realpath "${2:-.}")"
[ -f "$tgz" ] || { echo "build-deb: no such artifact: $1" >&2; exit 2; }
for tool in dpkg-deb dpkg-shlibdeps dpkg-architecture node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-deb: $tool is missing (apt-get install dpkg-dev; Node.js >= 20 with npm: scripts/check-node.sh)" >&2
    exit 1
  fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/forkd-deb.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/root"
lib="$root/usr/lib/forkd"

# --prefix also moves where npm reads its global config from: keep this machine's (registry, CA, proxy).
npm install --global --prefix "$work/npm" --globalconfig "$(npm config get globalconfig)" \
  --allow-scripts=better-sqlite3,koffi --no-audit --no-fund --loglevel=error "$tgz" >&2
mkdir -p "$root/usr/lib"
mv "$work/npm/lib/node_modules/forkd" "$lib"
version="$(node -p 'require(process.argv[1]).version' "$lib/package.json")"
# npm's 1.2.0-rc.1 sorts before 1.2.0; Debian's ~ does the same.
deb_version="${version//-/\~}"
arch="$(dpkg-architecture -qDEB_HOST_ARCH)"

# What only building needed: better-sqlite3's sources and objects (its addon is build/Release/better_sqlite3.node),
# koffi's binaries for other systems (it loads build/koffi/<platform>_<arch>/koffi.node).
nm="$lib/node_modules"
if [ -d "$nm/better-sqlite3/build" ]; then
  find "$nm/better-sqlite3/build" -mindepth 1 -maxdepth 1 ! -name Release -exec rm -rf {} +
  find "$nm/better-sqlite3/build/Release" -mindepth 1 -maxdepth 1 ! -name better_sqlite3.node -exec rm -rf {} +
  rm -rf "$nm/better-sqlite3/deps" "$nm/better-sqlite3/src"
fi
koffi_triplet="$(node -p 'process.platform + "_" + process.arch')"
if [ -d "$nm/koffi/build/koffi/$koffi_triplet" ]; then
  find "$nm/koffi/build/koffi" -mindepth 1 -maxdepth 1 ! -name "$koffi_triplet" -exec rm -rf {} +
  rm -rf "$nm/koffi/src" "$nm/koffi/vendor"
fi
if grep -rlF "$work" "$lib" >/dev/null 2>&1; then
  echo "build-deb: files under /usr/lib/forkd name the staging directory:" >&2
  grep -rlF "$work" "$lib" >&2
  exit 1
fi

mkdir -p "$root/usr/bin"
for cmd in forkd forkd-controller forkd-mcp; do
  cat >"$root/usr/bin/$cmd" <<EOF
#!/bin/sh
# $cmd of the forkd Debian package: /usr/lib/forkd/bin/$cmd.js under the nodejs package's node.
exec /usr/bin/node /usr/lib/forkd/bin/$cmd.js "\$@"
EOF
  chmod 0755 "$root/usr/bin/$cmd"
done
install -D -m 0644 "$lib/packaging/forkd.service" "$root/lib/systemd/system/forkd.service"
install -D -m 0644 "$checkout/packaging/debian/copyright" "$root/usr/share/doc/forkd/copyright"
install -D -m 0644 "$lib/README.md" "$root/usr/share/doc/forkd/README.md"

# Depends: the Node.js major the native modules were built for, and the libraries they link.
node_major="$(node -p 'process.versions.node.split(".")[0]')"
node_depends="nodejs (>= ${node_major}~), nodejs (<< $((node_major + 1))~)"
mkdir -p "$work/shlibs/debian"
printf 'Source: forkd\n\nPackage: forkd\nArchitecture: any\n' >"$work/shlibs/debian/control"
mapfile -t natives < <(find "$lib" -type f \( -name '*.node' -o -name '*.so' \))
shlibs="$(cd "$work/shlibs" && dpkg-shlibdeps -O "${natives[@]}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')"
[ -n "$shlibs" ] || { echo "build-deb: dpkg-shlibdeps found no library dependencies" >&2; exit 1; }

# Anything group- or world-writable in the tree would be writable by others once installed as root.
chmod -R go-w "$root"
mkdir -p "$root/DEBIAN"
installed_size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$deb_version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_size/" \
  -e "s/@NODE_DEPENDS@/$node_depends/" -e "s/@SHLIBS_DEPENDS@/$shlibs/" \
  "$checkout/packaging/debian/control" >"$root/DEBIAN/control"
for script in postinst prerm postrm; do
  install -m 0755 "$checkout/packaging/debian/$script" "$root/DEBIAN/$script"
done

mkdir -p "$out"
deb="$out/forkd_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >&2
echo "$deb"
