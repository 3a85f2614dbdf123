#!/usr/bin/env bash
# kube.sh builds and drives kubeplane, a real Kubernetes v1.37.2 control
# plane for tests (tools/kubeplane, a Go module of its own so that apiary's
# module never depends on Kubernetes).
#
#   scripts/kube.sh build               build the kubeplane binary once into
#                                       the cache (skipped when there); prints
#                                       its path
#   scripts/kube.sh background OWNER    start that build in the background at
#                                       the lowest CPU priority (nice 19: it
#                                       takes the CPU that whatever runs beside
#                                       it leaves idle), stopped, its whole
#                                       process group, if process OWNER ends
#                                       first; its output in the cache
#                                       directory's background.log. A build or
#                                       up started meanwhile waits for it (the
#                                       build lock)
#   scripts/kube.sh bin                 prints the binary's path (built or not)
#   scripts/kube.sh prefix              prints the cache directory it goes in
#   scripts/kube.sh up DIR [NODES]      build if needed, start etcd,
#                                       kube-apiserver, kube-scheduler,
#                                       kube-controller-manager and NODES (1)
#                                       stand-in nodes as background
#                                       processes with pid files and logs
#                                       under DIR; returns once the apiserver
#                                       is ready and every node is Ready;
#                                       prints DIR/kubeconfig (admin). Fails
#                                       when DIR's cluster already runs.
#   scripts/kube.sh kubectl DIR ARGS…   kubectl against DIR/kubeconfig
#   scripts/kube.sh down DIR            stop everything up started, every Pod
#                                       process included (SIGTERM, SIGKILL
#                                       after 15 s); exits 0 if nothing ran
#
# Environment for up: KUBE_NODE_PATH (directories searched before the
# node's PATH for Pod commands), KUBE_NODE_GPUS (nvidia.com/gpu capacity of
# each node; default 0, none).
#
# The binary lives in ${XDG_CACHE_HOME:-~/.cache}/apiary/kubeplane-<k8s
# version>-<first 12 hex digits of the sha256 of tools/kubeplane's go.mod,
# go.sum and non-test Go files>/kubeplane: a change to the sources makes a
# new one; tests alone do not. The build is one `go build`; cold it takes
# minutes (docs/kubernetes.md has the measured time).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/tools/kubeplane
K8S_VERSION=v1.37.2
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/apiary

grep -q "^	k8s.io/kubernetes $K8S_VERSION\$" "$SRC/go.mod" || {
  echo "kube.sh: $SRC/go.mod does not require k8s.io/kubernetes $K8S_VERSION; update K8S_VERSION in $0 with it" >&2
  exit 1
}

sources_hash() {
  (cd "$SRC" && find . -type f \( \( -name '*.go' ! -name '*_test.go' \) -o -name go.mod -o -name go.sum \) -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
}

PREFIX=$CACHE/kubeplane-$K8S_VERSION-$(sources_hash)
BIN=$PREFIX/kubeplane

build() {
  [[ -x $BIN ]] && return 0
  mkdir -p "$PREFIX"
  # One build at a time per binary: parallel tests share it.
  exec 9>"$PREFIX/build.lock"
  flock 9
  if [[ ! -x $BIN ]]; then
    echo "kube.sh: building kubeplane into $PREFIX (cold: several minutes)" >&2
    local start=$SECONDS
    # Without DWARF and the symbol table (-s -w): the link of this binary
    # (the whole control plane) is a large part of a cold make test's CPU,
    # and nothing here debugs it; stack traces keep their names.
    (cd "$SRC" && go build -ldflags='-s -w' -o "$BIN.tmp" .)
    mv "$BIN.tmp" "$BIN"
    echo "kube.sh: built in $((SECONDS - start)) s" >&2
  fi
  exec 9>&-
}

# background starts build in a process group of its own at nice 19, and
# a watcher that stops that group if $1 ends before it.
background() {
  local owner=${1:-}
  [[ $owner =~ ^[0-9]+$ ]] || { echo "usage: kube.sh background OWNER_PID" >&2; exit 2; }
  [[ -x $BIN ]] && return 0
  mkdir -p "$PREFIX"
  # A process group of its own (job control: its pid is its group's id),
  # in this session: a session of its own would be a scheduler autogroup
  # of its own, where nice means nothing to the rest.
  set -m
  nice -n 19 "$0" build >"$PREFIX/background.log" 2>&1 </dev/null &
  local pid=$!
  set +m
  (
    while kill -0 "$pid" 2>/dev/null; do
      if ! kill -0 "$owner" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null
        break
      fi
      sleep 2
    done
  ) >/dev/null 2>&1 </dev/null &
}

need_dir() {
  [[ -n ${1:-} ]] || { echo "usage: kube.sh $cmd DIR …" >&2; exit 2; }
}

cmd=${1:-}
shift || true
case $cmd in
  build) build; echo "$BIN" ;;
  background) background "$@" ;;
  bin) echo "$BIN" ;;
  prefix) echo "$PREFIX" ;;
  up)
    need_dir "${1:-}"
    build
    "$BIN" up "$@"
    echo "$(cd "$1" && pwd)/kubeconfig"
    ;;
  kubectl)
    need_dir "${1:-}"
    dir=$1; shift
    build
    exec "$BIN" kubectl --kubeconfig "$dir/kubeconfig" "$@"
    ;;
  down)
    need_dir "${1:-}"
    # Nothing ever started there: nothing to stop, no build needed.
    if ! compgen -G "$1/run/*.pid" >/dev/null && ! compgen -G "$1/pods/*/*/pgid" >/dev/null; then
      exit 0
    fi
    build
    exec "$BIN" down "$1"
    ;;
  *)
    echo "usage: kube.sh build | background OWNER_PID | bin | prefix | up DIR [NODES] | kubectl DIR ARGS… | down DIR" >&2
    exit 2
    ;;
esac
