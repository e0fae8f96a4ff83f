#!/usr/bin/env bash
# The Kubernetes tools forkd's cluster tests run, built from their Go modules through the machine's own Go
# configuration (its module proxy and checksum database), once per machine:
#   kube-apiserver and kubectl   from k8s.io/kubernetes (its staging modules replaced by their published
#                                versions of the same release: k8s.io/kubernetes requires them at v0.0.0)
#   etcd                         from go.etcd.io/etcd/server/v3
#   helm                         from helm.sh/helm/v4
# The versions are pinned by scripts/k8s-tools/<module>/go.mod and go.sum (the go command checks every
# download against go.sum). Each module's binaries go to $FORKD_K8S_CACHE/<module>-<version>/ (default cache
# /var/cache/forkd/k8s), outside the repository like the guest images; a directory is complete once it is
# there (built in a staging directory, then renamed) and records what it was built from in build-info.json.
# A directory built from other go.mod/go.sum contents is rebuilt.
#
# usage: scripts/k8s-tools.sh [build]   build what is missing (about 15 CPU-minutes the first time), then
#                                       print the tools' paths as JSON
#        scripts/k8s-tools.sh paths     print the paths as JSON without building; exit 3 if one is missing
#        scripts/k8s-tools.sh wait      as paths, after any build under way has ended (the tests use this: CI
#                                       builds the tools in the background while the first tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
cache="${FORKD_K8S_CACHE:-/var/cache/forkd/k8s}"
modules_dir="$repo/scripts/k8s-tools"
# The module whose version names each tool directory, and the packages built from it (name=package).
declare -A main_module=([kubernetes]=k8s.io/kubernetes [etcd]=go.etcd.io/etcd/server/v3 [helm]=helm.sh/helm/v4)
declare -A packages=(
  [kubernetes]="kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl"
  [etcd]="etcd=go.etcd.io/etcd/server/v3"
  [helm]="helm=helm.sh/helm/v4/cmd/helm"
)
order=(etcd kubernetes helm)

die() {
  echo "k8s-tools: $*" >&2
  exit 1
}

# The version go.mod requires of a module (a `require` line or an entry of a require block).
required_version() {
  awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"
}

modules_hash() {
  cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-64
}

tool_dir() {
  local version
  version=$(required_version "$modules_dir/$1" "${main_module[$1]}")
  [ -n "$version" ] || die "scripts/k8s-tools/$1/go.mod requires no ${main_module[$1]}"
  echo "$cache/$1-$version"
}

is_current() {
  local dir
  dir=$(tool_dir "$1")
  [ -f "$dir/build-info.json" ] && grep -q "\"modules_sha256\": \"$(modules_hash "$modules_dir/$1")\"" "$dir/build-info.json"
}

# Linker flags that make each tool report its real version (as its own release build does).
ldflags_for() {
  local version=$1 module=$2 flags="-s -w"
  case "$module" in
  kubernetes)
    local minor
    minor=$(echo "$version" | cut -d. -f2)
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      flags="$flags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    ;;
  helm) flags="$flags -X helm.sh/helm/v4/internal/version.version=$version" ;;
  esac
  echo "$flags"
}

# The first Go >= 1.26 of: the one on PATH, the machine image's /usr/local/go (Debian 12's golang-go is 1.19).
pick_go() {
  local candidate goversion
  for candidate in "$(command -v go || true)" /usr/local/go/bin/go; do
    [ -x "$candidate" ] || continue
    goversion=$(GOTOOLCHAIN=local "$candidate" env GOVERSION)
    goversion=${goversion#go}
    if [ "${goversion%%.*}" -gt 1 ] || { [ "${goversion%%.*}" -eq 1 ] && [ "$(echo "$goversion" | cut -d. -f2)" -ge 26 ]; }; then
      export PATH="$(dirname "$candidate"):$PATH"
      return
    fi
  done
  die "no Go >= 1.26 found (k8s.io/kubernetes v1.37 needs it; on PATH: $(command -v go || echo none))"
}

build_module() {
  local module=$1 dir version staging started entry name pkg
  dir=$(tool_dir "$module")
  version=${dir##*-}
  mkdir -p "$cache"
  staging=$(mktemp -d "$cache/.staging-$module-XXXXXX")
  started=$(date +%s)
  echo "k8s-tools: building $module $version into $dir" >&2
  for entry in ${packages[$module]}; do
    name=${entry%%=*}
    pkg=${entry#*=}
    (cd "$modules_dir/$module" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
      go build -trimpath -ldflags "$(ldflags_for "$version" "$module")" -o "$staging/$name" "$pkg")
  done
  cat >"$staging/build-info.json" <<EOF
{
  "module": "${main_module[$module]}",
  "version": "$version",
  "go": "$(GOTOOLCHAIN=local go env GOVERSION)",
  "modules_sha256": "$(modules_hash "$modules_dir/$module")",
  "build_seconds": $(($(date +%s) - started))
}
EOF
  rm -rf "$dir"
  mv "$staging" "$dir"
  echo "k8s-tools: built $module $version in $(($(date +%s) - started)) s" >&2
}

print_paths() {
  local missing=0 first=1 module entry name dir
  printf '{'
  for module in "${order[@]}"; do
    dir=$(tool_dir "$module")
    for entry in ${packages[$module]}; do
      name=${entry%%=*}
      [ $first -eq 1 ] || printf ','
      first=0
      printf '\n  "%s": "%s"' "$name" "$dir/$name"
      [ -x "$dir/$name" ] || missing=1
    done
  done
  printf '\n}\n'
  if [ $missing -ne 0 ] || ! all_current; then
    echo "k8s-tools: not built yet (or built from other go.mod/go.sum): run scripts/k8s-tools.sh" >&2
    return 3
  fi
}

all_current() {
  local module
  for module in "${order[@]}"; do is_current "$module" || return 1; done
}

case "${1:-build}" in
paths) print_paths ;;
wait)
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock -s 9 # a build holds the lock exclusively while it runs
  print_paths
  ;;
build)
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9 # another checkout building the same tools: wait for it, then use what it built
  rm -rf "$cache"/.staging-* # what an interrupted build left (only a holder of the lock builds)
  for module in "${order[@]}"; do
    is_current "$module" || {
      pick_go
      build_module "$module"
    }
  done
  print_paths
  ;;
*) die "usage: scripts/k8s-tools.sh [build|paths|wait]" ;;
esac
