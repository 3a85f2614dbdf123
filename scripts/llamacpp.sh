#!/usr/bin/env bash
# llamacpp.sh builds the llama.cpp that apiary's worker links, once per pin,
# into a cache outside the tree, and prints where it is.
#
#   scripts/llamacpp.sh build    fetch, configure and build the libraries
#                                (skipped when the cache has them); prints
#                                the prefix
#   scripts/llamacpp.sh server   the same, and llama-server
#   scripts/llamacpp.sh prefix   prints the prefix (built or not)
#   scripts/llamacpp.sh needs    prints the tools `build` still needs, one a
#                                line (git, npm, cmake; nothing when the
#                                libraries are built): what scripts/deps.sh
#                                installs for it
#   scripts/llamacpp.sh levels   prints the CPU levels a build of
#                                LLAMA_CPU_LEVELS makes, one a line
#   scripts/llamacpp.sh cuda     build the CUDA backend of the same source
#                                and commit into the prefix (needs nvcc)
#
# Where llama.cpp comes from: the npm package node-llama-cpp ships the
# llama.cpp source tree of its release as a git bundle
# (package/llama/gitRelease.bundle; the release tag in
# llama/llama.cpp.info.json). The pin is the package version and the
# bundle's commit, checked after the clone; a bundle with another commit
# is refused. Nothing of llama.cpp is kept in this repository.
#
# The build is llama.cpp's own CMake build, Release, with ggml's backends
# as libraries loaded at run time (GGML_BACKEND_DL=ON) and one CPU backend
# per instruction-set level (GGML_CPU_ALL_VARIANTS=ON), shared libraries
# with an $ORIGIN run path, no OpenMP (ggml's own threads, as before), no
# network at configure time (no prebuilt web UI, no OpenSSL). llama-server
# is built from the same tree (`server`, which `make build` does not need):
# the engine tests and the benchmarks compare like with like. Shared libraries get unversioned names (one plain file
# each, nothing to keep in step on a node). The prefix holds:
#   lib/      libllama.so, libllama-common.so, libggml.so, libggml-base.so,
#             libmtmd.so (llama.cpp's multimodal library, tools/mtmd: the
#             image projector a vision model loads beside its GGUF),
#             libggml-cpu-<level>.so (and libggml-cuda.so after `cuda`):
#             what `make build` puts beside bin/apiary. Its
#             libllama-common.so is not llama.cpp's whole common library
#             (a chat, download and argument toolkit of about fifty files,
#             half the build's CPU time) but the part apiary calls, the
#             JSON-schema-to-grammar converter, compiled from the same
#             source files with everything it does not reach left out
#             (grammar_lib); llama-server gets the whole one, in server/
#   server/   llama-server with every library it loads beside it
#   include/  llama.h, ggml's headers, mtmd.h and mtmd-helper.h, common's
#             json-schema-to-grammar.h
#             and the headers it includes, ggml's private backend header
#   pin       the package version, tag, commit and commit date
#
# Knobs (environment): LLAMA_JOBS (nproc); LLAMA_CPU_LEVELS: all (the
# default); host, only the CPU backend this machine loads (`make demo`:
# a third of the cold build; a later full build adds the others); or
# test, host's and sse42 beside them (`make test`: the levels its tests
# load: sse42 on an emulated CPU without AVX, and forced by name); CUDA_ARCHS
# (for cuda: CMAKE_CUDA_ARCHITECTURES; default: this machine's GPU's
# compute capability, else native).
set -euo pipefail

NLC_VERSION=3.22.1
COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/apiary
PREFIX=$CACHE/llama.cpp/nlc-$NLC_VERSION-${COMMIT:0:10}
JOBS=${LLAMA_JOBS:-$(nproc)}
# LAYOUT names the build's options and the prefix's layout below: change
# it with them, so that a cache built otherwise is built again.
LAYOUT=5
# OPTIONS is the build's CMake configuration, the CUDA build's too, and
# scripts/gpu-proof.sh's.
. "$(dirname "${BASH_SOURCE[0]}")/llamacpp-options.sh"
LEVELS=${LLAMA_CPU_LEVELS:-all}
case $LEVELS in all | host | test) ;; *) echo "llamacpp: LLAMA_CPU_LEVELS=$LEVELS: want all, host or test" >&2; exit 2 ;; esac

log() { printf 'llamacpp: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# fetched reports whether the pinned source is in $PREFIX/src.
fetched() { [ -f "$PREFIX/src/CMakeLists.txt" ] && [ -f "$PREFIX/src.ok" ]; }

# built reports whether the libraries of $LEVELS are in the prefix (all
# holds test's, and test host's).
built() {
  [ -f "$PREFIX/built.$LAYOUT" ] ||
    { [ "$LEVELS" != all ] && [ -f "$PREFIX/built.$LAYOUT.test" ]; } ||
    { [ "$LEVELS" = host ] && [ -f "$PREFIX/built.$LAYOUT.host" ]; }
}

# needs prints the tools build still needs: git and npm to fetch the
# source, cmake to build it; none once the libraries are built.
needs() {
  built && return
  fetched || printf '%s\n' git npm
  echo cmake
}

# fetch clones the pinned source into $PREFIX/src, unless it is there.
fetch() {
  fetched && return
  command -v npm >/dev/null || die "npm is needed to fetch node-llama-cpp (scripts/deps.sh installs it)"
  command -v git >/dev/null || die "git is needed (scripts/deps.sh installs it)"
  local tmp
  tmp=$(mktemp -d)
  trap "rm -rf '$tmp'; trap - RETURN" RETURN
  log "fetching node-llama-cpp@$NLC_VERSION from the npm registry"
  (cd "$tmp" && npm pack --silent "node-llama-cpp@$NLC_VERSION" >/dev/null) || die "npm pack node-llama-cpp@$NLC_VERSION failed"
  tar -xzf "$tmp/node-llama-cpp-$NLC_VERSION.tgz" -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json ||
    die "node-llama-cpp@$NLC_VERSION ships no llama.cpp source bundle"
  rm -rf "$PREFIX/src" "$PREFIX/src.ok"
  mkdir -p "$PREFIX"
  git clone --quiet "$tmp/package/llama/gitRelease.bundle" "$PREFIX/src" 2>/dev/null || die "cloning the bundle failed"
  local got tag date
  got=$(git -C "$PREFIX/src" rev-parse HEAD)
  [ "$got" = "$COMMIT" ] || die "node-llama-cpp@$NLC_VERSION's bundle is commit $got, not the pinned $COMMIT"
  tag=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$tmp/package/llama/llama.cpp.info.json")
  date=$(git -C "$PREFIX/src" log -1 --format=%cI)
  printf 'package=node-llama-cpp@%s\ntag=%s\ncommit=%s\ndate=%s\n' "$NLC_VERSION" "$tag" "$COMMIT" "$date" >"$PREFIX/pin"
  touch "$PREFIX/src.ok"
}

# host_level prints the CPU level of ggml's x86 backends this CPU runs with
# the highest score (and on a second line the best one without AMX, when
# that is another), as ggml_backend_score counts (ggml/src/ggml-cpu/arch/
# x86/cpu-feats.cpp) from the features each level is built with
# (ggml/src/CMakeLists.txt).
host_level() {
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  awk -v flags="$flags" 'BEGIN {
    w["FMA"]=1; w["F16C"]=2; w["SSE42"]=4; w["BMI2"]=8; w["AVX"]=16; w["AVX2"]=32; w["AVX_VNNI"]=64
    w["AVX512"]=128; w["AVX512_VBMI"]=256; w["AVX512_BF16"]=512; w["AVX512_VNNI"]=1024; w["AMX_INT8"]=2048; w["AMX_TILE"]=0
    f["SSE42"]="sse4_2"; f["AVX"]="avx"; f["F16C"]="f16c"; f["FMA"]="fma"; f["AVX2"]="avx2"; f["BMI2"]="bmi2"
    f["AVX512"]="avx512f avx512cd avx512vl avx512dq avx512bw"; f["AVX512_VBMI"]="avx512vbmi"; f["AVX512_VNNI"]="avx512_vnni"
    f["AVX512_BF16"]="avx512_bf16"; f["AVX_VNNI"]="avx_vnni"; f["AMX_TILE"]="amx_tile"; f["AMX_INT8"]="amx_int8"
    n = split("x64:|sse42:SSE42|sandybridge:SSE42 AVX|ivybridge:SSE42 AVX F16C|piledriver:SSE42 AVX F16C FMA|haswell:SSE42 AVX F16C FMA AVX2 BMI2|skylakex:SSE42 AVX F16C FMA AVX2 BMI2 AVX512|cannonlake:SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI|cascadelake:SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VNNI|icelake:SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI|cooperlake:SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VNNI AVX512_BF16|zen4:SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16|alderlake:SSE42 AVX F16C FMA AVX2 BMI2 AVX_VNNI|sapphirerapids:SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8", levels, "|")
    best = "x64"; bestScore = 0; plain = "x64"; plainScore = 0
    for (i = 1; i <= n; i++) {
      split(levels[i], kv, ":"); score = 1; ok = 1; amx = 0
      m = split(kv[2], feats, " ")
      for (j = 1; j <= m; j++) {
        k = split(f[feats[j]], need, " ")
        for (l = 1; l <= k; l++) if (index(flags, " " need[l] " ") == 0) ok = 0
        score += w[feats[j]]
        if (feats[j] ~ /^AMX/) amx = 1
      }
      if (ok && score > bestScore) { best = kv[1]; bestScore = score }
      if (ok && !amx && score > plainScore) { plain = kv[1]; plainScore = score }
    }
    print best
    if (plain != best) print plain
  }'
}

# levels prints the CPU levels a build of $LEVELS makes, one a line:
# host's (host_level), and for test sse42 beside them; for
# all, the word all (every level CMake configures).
levels() {
  case $LEVELS in
    all) echo all ;;
    host) host_level ;;
    test) { host_level; echo sse42; } | sort -u ;;
  esac
}

# fast builds, in build directory $1, the targets named after it and
# every target they depend on, one at a time in dependency order with Unix
# Makefiles' target/fast (a target without its dependencies), leaving out
# the CPU levels not among $2 (ggml-cpu-<level> targets, space-separated):
# ggml's target depends on every level, and cmake --build --target would
# build them all.
fast() {
  local b=$1 keep=$2 t
  shift 2
  for t in $(awk -v roots="$*" -v keep=" $keep " '
    # Makefile2: "DIR/CMakeFiles/NAME.dir/all: DIR/CMakeFiles/DEP.dir/all"
    function name(p) { sub(/\.dir\/all$/, "", p); sub(/.*\//, "", p); return p }
    function wanted(n, level) {
      if (n !~ /^ggml-cpu-/) return 1
      level = n; sub(/-feats$/, "", level)
      return index(keep, " " level " ") > 0
    }
    function visit(n, i) {
      if (seen[n]++ || !wanted(n)) return
      for (i = 1; i <= ndeps[n]; i++) visit(dep[n, i])
      print n
    }
    /^[^#].*\.dir\/all: .*\.dir\/all$/ { n = name(substr($1, 1, length($1) - 1)); dep[n, ++ndeps[n]] = name($2) }
    END { k = split(roots, r, " "); for (i = 1; i <= k; i++) visit(r[i]) }
  ' "$b/CMakeFiles/Makefile2"); do
    make -C "$b" -j "$JOBS" "$t/fast" || return 1
  done
}

# build configures and builds the libraries and llama-server, and lays out
# the prefix.
build() {
  if built; then
    echo "$PREFIX"
    return
  fi
  fetch
  command -v cmake >/dev/null || die "cmake is needed (scripts/deps.sh installs it)"
  local start=$SECONDS b=$PREFIX/build
  log "building llama.cpp $(sed -n 's/^tag=//p' "$PREFIX/pin") ($COMMIT) with $JOBS jobs"
  cmake -S "$PREFIX/src" -B "$b" "${OPTIONS[@]}" -DGGML_CUDA=OFF \
    >"$PREFIX/configure.log" 2>&1 || { tail -30 "$PREFIX/configure.log" >&2; die "cmake configure failed (log: $PREFIX/configure.log)"; }
  # The CPU variants are MODULE libraries ggml loads: all of them, or the
  # one this machine loads.
  local variants
  if [ "$LEVELS" != all ]; then
    # The best level, and the best without AMX beside it when they
    # differ: a VM may report AMX that faults (the worker's probe then
    # loads the other one; docs/worker.md, "CPU builds"); for test, sse42
    # too.
    variants=$(levels | sed 's/^/ggml-cpu-/' | tr '\n' ' ')
    # shellcheck disable=SC2086
    fast "$b" "$variants" llama ggml mtmd >"$PREFIX/build.log" 2>&1 ||
      { tail -30 "$PREFIX/build.log" >&2; die "build failed (log: $PREFIX/build.log)"; }
  else
    cmake --build "$b" -j "$JOBS" --target llama ggml mtmd \
      >"$PREFIX/build.log" 2>&1 || { tail -30 "$PREFIX/build.log" >&2; die "build failed (log: $PREFIX/build.log)"; }
    variants=$(cmake --build "$b" --target help | grep -o 'ggml-cpu-[a-z0-9_]*' | sort -u)
  fi
  grammar_lib "$b" >>"$PREFIX/build.log" 2>&1 ||
    { tail -30 "$PREFIX/build.log" >&2; die "building the grammar converter failed (log: $PREFIX/build.log)"; }
  rm -rf "$PREFIX/lib" "$PREFIX/include" "$PREFIX/bin"
  mkdir -p "$PREFIX/lib" "$PREFIX/include"
  local f
  for f in libllama.so libggml.so libggml-base.so libmtmd.so $(for v in $variants; do echo "lib$v.so"; done); do
    cp "$b/bin/$f" "$PREFIX/lib/"
  done
  cp "$b/grammar/libllama-common.so" "$PREFIX/lib/"
  cp "$PREFIX/src/include/llama.h" "$PREFIX/src/include/llama-cpp.h" "$PREFIX/include/" 2>/dev/null || cp "$PREFIX/src/include/llama.h" "$PREFIX/include/"
  cp "$PREFIX"/src/ggml/include/*.h "$PREFIX/include/"
  cp "$PREFIX/src/ggml/src/ggml-backend-impl.h" "$PREFIX/src/ggml/src/ggml-impl.h" "$PREFIX/src/ggml/src/ggml-common.h" "$PREFIX/include/" 2>/dev/null || true
  cp "$PREFIX"/src/tools/mtmd/mtmd.h "$PREFIX"/src/tools/mtmd/mtmd-helper.h "$PREFIX/include/"
  cp "$PREFIX"/src/common/json-schema-to-grammar.h "$PREFIX"/src/common/json-schema.h "$PREFIX"/src/common/json.h "$PREFIX/include/"
  ls "$PREFIX"/lib/libggml-cpu-*.so >/dev/null 2>&1 || die "the build made no CPU backend libraries"
  if [ "$LEVELS" = all ]; then touch "$PREFIX/built.$LAYOUT"; else touch "$PREFIX/built.$LAYOUT.$LEVELS"; fi
  log "built in $((SECONDS - start))s: $PREFIX"
  echo "$PREFIX"
}

# grammar_lib builds $1/grammar/libllama-common.so: llama.cpp's
# JSON-schema-to-grammar converter (common/json-schema-to-grammar.cpp and
# the files it calls into), what apiary's binding uses of llama.cpp's
# common library. The sources are compiled a function a section, and the
# link keeps what the exported converter (json_schema_to_grammar,
# common_json) reaches: the rest of common.cpp (sampling, logging,
# downloads) and what only it needs are left out, and no symbol is left
# undefined (--no-undefined).
grammar_lib() {
  local b=$1 src=$PREFIX/src out=$1/grammar f pids=()
  rm -rf "$out"
  mkdir -p "$out"
  cat >"$out/exports.map" <<'MAP'
{
  global: extern "C++" { json_schema_to_grammar*; common_json::*; };
  local: *;
};
MAP
  for f in common json-schema-to-grammar json-schema json unicode trie; do
    "${CXX:-c++}" -std=c++17 -O3 -DNDEBUG -fPIC -ffunction-sections -fdata-sections \
      -I"$src/common" -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
      -c "$src/common/$f.cpp" -o "$out/$f.o" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$JOBS" ]; then wait "${pids[0]}" || return 1; pids=("${pids[@]:1}"); fi
  done
  for f in "${pids[@]}"; do wait "$f" || return 1; done
  "${CXX:-c++}" -shared -o "$out/libllama-common.so" "$out"/*.o -Wl,--gc-sections -Wl,--version-script="$out/exports.map" \
    -Wl,--no-undefined -Wl,--as-needed -Wl,-rpath,'$ORIGIN' -L"$b/bin" -lllama -lggml -lggml-base
}

# server builds llama-server in the same tree and puts it, with every
# library it loads, in $PREFIX/server.
server() {
  build >/dev/null
  if [ ! -x "$PREFIX/server/llama-server" ] || [ ! -f "$PREFIX/server.$LAYOUT" ]; then
    command -v cmake >/dev/null || die "cmake is needed to build llama-server (scripts/deps.sh installs it)"
    local start=$SECONDS b=$PREFIX/build
    log "building llama-server with $JOBS jobs"
    # Beside the CPU levels the prefix holds (all, or the host's or test's).
    fast "$b" "$(cd "$PREFIX/lib" && ls libggml-cpu-*.so | sed 's/^lib//;s/\.so$//' | tr '\n' ' ')" llama-server \
      >"$PREFIX/build-server.log" 2>&1 ||
      { tail -30 "$PREFIX/build-server.log" >&2; die "building llama-server failed (log: $PREFIX/build-server.log)"; }
    rm -rf "$PREFIX/server"
    mkdir -p "$PREFIX/server"
    find "$b/bin" -maxdepth 1 -name 'lib*.so' ! -name 'libggml-cuda.so' -exec cp {} "$PREFIX/server/" \;
    cp "$b/bin/llama-server" "$PREFIX/server/"
    touch "$PREFIX/server.$LAYOUT"
    log "built llama-server in $((SECONDS - start))s"
  fi
  echo "$PREFIX"
}

# cuda builds libggml-cuda.so of the same source and commit into the
# prefix, for this machine's GPU architecture only.
cuda() {
  build >/dev/null
  command -v nvcc >/dev/null || die "no nvcc: the CUDA toolkit is needed (its bin/ on PATH)"
  local archs=${CUDA_ARCHS:-} cap b=$PREFIX/build-cuda
  if [ -z "$archs" ] && command -v nvidia-smi >/dev/null; then
    # every GPU's compute capability (9.0 → 90), once each
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
      tr -d ' .' | grep -E '^[0-9]+$' | sort -un | paste -sd ';') || true
    [ -n "$cap" ] && archs=$cap
  fi
  archs=${archs:-native}
  local cudav
  cudav=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  log "building libggml-cuda.so (CUDA $cudav, architectures $archs)"
  cmake -S "$PREFIX/src" -B "$b" "${OPTIONS[@]}" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    >"$PREFIX/configure-cuda.log" 2>&1 || { tail -30 "$PREFIX/configure-cuda.log" >&2; die "cmake configure failed (log: $PREFIX/configure-cuda.log)"; }
  cmake --build "$b" -j "$JOBS" --target ggml-cuda >"$PREFIX/build-cuda.log" 2>&1 ||
    { tail -30 "$PREFIX/build-cuda.log" >&2; die "building ggml-cuda failed (log: $PREFIX/build-cuda.log)"; }
  cp "$b/bin/libggml-cuda.so" "$PREFIX/lib/"
  printf '%s\n' "$cudav" >"$PREFIX/lib/libggml-cuda.cuda-version"
  log "built $PREFIX/lib/libggml-cuda.so"
  echo "$PREFIX"
}

case ${1:-} in
  build) build ;;
  server) server ;;
  prefix) echo "$PREFIX" ;;
  needs) needs ;;
  levels) levels ;;
  cuda) cuda ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
