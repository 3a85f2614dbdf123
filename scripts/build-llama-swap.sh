#!/usr/bin/env bash
# build-llama-swap.sh builds llama-swap (the proxy that
# BenchmarkRelayVsLlamaSwap puts beside the queen) outside the repository
# and prints the binary's path:
#
#   APIARY_LLAMA_SWAP=$(scripts/build-llama-swap.sh)
#
# LLAMA_SWAP_VERSION  the tag to build (default v250)
# LLAMA_SWAP_SRC      a git repository holding that tag: a URL, or a local
#                     clone or bare git directory (a mirror, for a machine
#                     without access to GitHub); default the project's
#                     public repository on GitHub
#
# The binary goes to ${XDG_CACHE_HOME:-~/.cache}/apiary/llama-swap-<version>/
# llama-swap and is built once per version. Only the Go binary is built:
# without the embed_ui build tag llama-swap compiles without its web UI
# (which needs npm), and nothing on the relay path depends on it. Its Go
# dependencies come through the Go module proxy as for any Go build. Its
# source is cloned into a temporary directory and removed afterwards; none
# of it enters this repository.
set -euo pipefail

version=${LLAMA_SWAP_VERSION:-v250}
src=${LLAMA_SWAP_SRC:-https://github.com/mostlygeek/llama-swap.git}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/apiary/llama-swap-$version
bin=$cache/llama-swap

if [[ -x $bin ]]; then
	echo "$bin"
	exit 0
fi

# A local repository is cloned through file://, where --depth applies
# (git ignores it, with a warning, for a plain path).
if [[ -d $src ]]; then
	src=file://$(cd "$src" && pwd)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -c advice.detachedHead=false clone --quiet --depth 1 --branch "$version" "$src" "$work/src" >&2 ||
	git clone --quiet "$src" "$work/src" >&2
git -C "$work/src" -c advice.detachedHead=false checkout --quiet "$version"
commit=$(git -C "$work/src" rev-parse --short HEAD)
mkdir -p "$cache"
(
	cd "$work/src"
	# CGO off: llama-swap needs none, and this keeps the build away from
	# the CGO flags a caller may have exported for apiary's own build.
	CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
		-ldflags "-X main.version=$version -X main.commit=$commit" -o "$bin.tmp" .
)
mv "$bin.tmp" "$bin"
echo "$bin"
