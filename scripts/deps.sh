#!/usr/bin/env bash
# Installs the Debian 12 packages apiary's build and tests need, only when
# they are missing. Go modules are pinned in go.mod and fetched by go itself.
#
#   scripts/deps.sh         what the build and the tests need (make test)
#   scripts/deps.sh build   what the build needs (make build, make demo): a
#                           C/C++ compiler and make for cgo, and for
#                           llama.cpp's own build what scripts/llamacpp.sh
#                           still needs (git and npm to fetch its source,
#                           cmake to build it; none of them once its
#                           libraries are in the cache)
#   ... --list              print the packages instead, one a line,
#                           installed or not; install nothing
#
# Nothing else: the demo runs bin/apiary alone, so `make demo` installs no
# browser, emulator, SSH server, database or init system
# (TestDemoInstallsOnlyWhatTheBuildNeeds).
set -euo pipefail

mode=test list=false
for arg in "$@"; do
  case $arg in
    build) mode=build ;;
    --list) list=true ;;
    *) echo "deps: unknown argument $arg (want: [build] [--list])" >&2; exit 2 ;;
  esac
done

pkgs=(
  gcc g++ make       # cgo
)
# The tools of llama.cpp's own build (scripts/llamacpp.sh): the worker's
# libraries and llama-server. The tests build llama-server, so they need
# cmake whatever the cache holds.
needs=$("$(dirname "$0")/llamacpp.sh" needs)
[ $mode = test ] && needs=$(printf '%s\ngit\nnpm\ncmake\n' "$needs" | sort -u)
for tool in $needs; do
  case $tool in
    git | cmake) pkgs+=("$tool") ;;
    npm) pkgs+=(nodejs npm) ;;
  esac
done
if [ $mode = test ]; then
  pkgs+=(
    postgresql-15      # the store's PostgreSQL tests start throwaway clusters from its binaries
    openssh-server openssh-client iproute2 # multi-node tests: scripts/netns.sh runs sshd in network namespaces; the queen runs the system ssh; the README's test runs its blocks in a network namespace of their own
    curl               # the README's and the docs' blocks, which tests run as written
    qemu-user          # runs apiary on an emulated CPU without AVX (internal/worker's CPU backend test)
    systemd            # systemd-analyze verify checks the units of apiary service install (internal/service)
    systemd-container  # systemd-nspawn boots systemd as PID 1 over this machine's root, where cmd/apiary's test starts the unit apiary service install wrote
    chromium           # the dashboard's browser tests (internal/queen) drive it headless through chromedp
    haproxy            # the failover test puts it in front of two queens, as docs/deploy.md does
  )
fi
if $list; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
  case $p in
    # scripts/llamacpp.sh fetches llama.cpp's source with npm (the
    # node-llama-cpp package ships it); the npm openai client's test
    # (internal/queen) runs node, and installs the pinned openai package
    # with npm into ~/.cache/apiary/npm.
    # Checked as commands: a node from elsewhere (e.g. NodeSource's
    # nodejs, which brings its own npm) serves as well, and Debian's npm
    # would conflict with it.
    nodejs) command -v node >/dev/null || missing+=(nodejs) ;;
    npm) command -v npm >/dev/null || missing+=(npm) ;;
    *) dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p") ;;
  esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if [[ " ${missing[*]} " == *" postgresql-15 "* ]]; then
  # The tests make their own clusters; keep the package from creating and
  # starting a default one.
  $sudo mkdir -p /etc/postgresql-common/createcluster.d
  echo 'create_main_cluster = false' | $sudo tee /etc/postgresql-common/createcluster.d/apiary.conf >/dev/null
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
