#!/bin/sh
# A forkd cluster on this machine (docs/kubernetes.md): the real kube-apiserver and etcd, N node daemons (each
# in its own network namespace and home), the cluster controller, two gateway replicas and a loopback registry.
#   scripts/local-cluster.sh up [--nodes N] [--gateways G] [--dir D]   # prints shell assignments: eval "$(...)"
#   scripts/local-cluster.sh status                                    # JSON {nodes: [...], gateway: {...}}
#   scripts/local-cluster.sh down                                      # stops and removes all of it
# Needs root (namespaces, VMs), `npm run build` and the Kubernetes tools (scripts/k8s-tools.sh).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
main="$root/dist/src/local-cluster/main.js"
if [ ! -f "$main" ]; then
  echo "local-cluster.sh: $main is missing: run npm run build first" >&2
  exit 1
fi
exec node "$main" "$@"
