#!/usr/bin/env bash
# gpu-proof.sh builds llama.cpp's CUDA backend as a shared library from the
# same vendored ggml sources apiary links (the pinned ollama module), puts it
# beside apiary, and proves on a machine with an NVIDIA GPU that a hive
# offers the GPU, a worker runs on it, NVML's accounting matches the
# worker's vram_bytes, the driver gives the memory back when the worker
# stops, and how fast generation and prompt processing are next to
# llama-server built with CUDA. It writes its figures to OUT/results.md for
# docs/gpu.md.
#
#   scripts/gpu-proof.sh pack OUT    on the machine with Go (this repo): copy
#                                    bin/apiary*, the vendored ggml and
#                                    llama.cpp sources, this script and a
#                                    generated model (>= 1 GiB) into OUT
#   OUT/gpu-proof.sh build OUT       on the GPU machine (CUDA toolkit, cmake,
#                                    no Go): build libggml-cuda.so and a CUDA
#                                    llama-server, place the library beside
#                                    OUT/bin/apiary
#   OUT/gpu-proof.sh run OUT         on the GPU machine: the proof and the
#                                    benchmark; OUT/results.md
#   OUT/gpu-proof.sh all OUT         build, then run
#   scripts/gpu-proof.sh cuda        build libggml-cuda.so for this checkout
#                                    into bin/ (`make cuda`; needs go and nvcc)
#
# Knobs (environment):
#   GPU_PROOF_DIM, GPU_PROOF_LAYERS, GPU_PROOF_HEADS, GPU_PROOF_FF,
#   GPU_PROOF_VOCAB     shape of the generated model (2048, 12, 16, 5632,
#                       8000: about 2.4 GiB)
#   GPU_PROOF_DEVICE    the GPU to use (0)
#   GPU_PROOF_GEN       tokens generated per generation request (256)
#   GPU_PROOF_ROUNDS    requests per measurement, median taken (5)
#   CUDA_ARCHS          CMAKE_CUDA_ARCHITECTURES (this machine's GPUs, from
#                       nvidia-smi's compute_cap: 90 on an H100; native
#                       without nvidia-smi)
#   LLAMA_CPP_SRC       llama.cpp source tree for llama-server (pack: the
#                       tree scripts/bench-llama-server.sh build fetched, b7347)
#
# It has never run here: the machine this repository is developed on has no
# GPU. See docs/gpu.md for what was tested and what was not.
set -euo pipefail

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
DIM=${GPU_PROOF_DIM:-2048}
LAYERS=${GPU_PROOF_LAYERS:-12}
HEADS=${GPU_PROOF_HEADS:-16}
FF=${GPU_PROOF_FF:-5632}
VOCAB=${GPU_PROOF_VOCAB:-8000}
DEVICE=${GPU_PROOF_DEVICE:-0}
GEN=${GPU_PROOF_GEN:-256}
ROUNDS=${GPU_PROOF_ROUNDS:-5}
CUDA_ARCHS=${CUDA_ARCHS:-}
MIN_MODEL_BYTES=$((1 << 30))

log() { printf 'gpu-proof: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# pack copies what the GPU machine needs into $1.
pack() {
  local out=$1 root ollama llama
  root=$(cd "$(dirname "$SELF")/.." && pwd)
  [ -x "$root/bin/apiary" ] || die "no $root/bin/apiary: run make build first"
  command -v go >/dev/null || die "pack needs go (to find the pinned ollama module)"
  ollama=$(cd "$root" && go list -m -f '{{.Dir}}' github.com/ollama/ollama)
  llama=${LLAMA_CPP_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/apiary/llama-server/node-llama-cpp-3.14.5/src}
  [ -f "$llama/CMakeLists.txt" ] || die "no llama.cpp source at $llama: run scripts/bench-llama-server.sh build, or set LLAMA_CPP_SRC"
  mkdir -p "$out/bin" "$out/src/ollama" "$out/models"
  cp "$root"/bin/apiary* "$out/bin/"
  cp "$SELF" "$out/gpu-proof.sh"
  # The ollama module's CMakeLists.txt builds its vendored ggml; only that
  # tree is needed.
  cp "$ollama/CMakeLists.txt" "$out/src/ollama/"
  mkdir -p "$out/src/ollama/ml/backend/ggml"
  cp -r "$ollama/ml/backend/ggml/ggml" "$out/src/ollama/ml/backend/ggml/"
  chmod -R u+w "$out/src/ollama"
  rm -rf "$out/src/llama.cpp"
  cp -r "$llama" "$out/src/llama.cpp"
  local model=$out/models/proof.gguf
  "$out/bin/apiary" models testmodel "$model" --force --dim "$DIM" --layers "$LAYERS" --heads "$HEADS" --ff "$FF" --vocab "$VOCAB"
  local size
  size=$(stat -c %s "$model")
  [ "$size" -ge "$MIN_MODEL_BYTES" ] || die "the model is $size bytes, less than 1 GiB: raise GPU_PROOF_DIM/LAYERS/FF"
  log "packed $out ($(du -sh "$out" | cut -f1)); model $size bytes"
}

# cuda_archs prints the CUDA architectures to build for: $CUDA_ARCHS when
# set, else those of this machine's GPUs (nvidia-smi's compute_cap, 9.0 ->
# 90; one build for one architecture takes minutes, for all of them an
# hour), else native (CMake asks the GPU).
cuda_archs() {
  if [ -n "$CUDA_ARCHS" ]; then
    printf '%s\n' "$CUDA_ARCHS"
    return
  fi
  local caps
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    tr -d ' .' | grep -E '^[0-9]+$' | sort -un | paste -sd ';') || true
  printf '%s\n' "${caps:-native}"
}

# build_backend SRC BUILD BIN builds libggml-cuda.so and the
# libggml-base.so it links from the ollama sources in SRC, in BUILD, and
# places both in BIN with the CUDA version it needs
# (libggml-cuda.cuda-version): three plain files, which internal/sshnode
# copies to a node beside apiary. libggml-cuda.so finds libggml-base.so in
# its own directory (run path $ORIGIN), wherever that is; the SONAME is
# unversioned (CMAKE_PLATFORM_NO_VERSIONED_SONAME), so the file it needs
# is libggml-base.so itself, not a libggml-base.so.0 symlink.
build_backend() {
  local src=$1 build=$2 bin=$3
  command -v nvcc >/dev/null || die "no nvcc: the CUDA toolkit is needed (its bin/ on PATH)"
  command -v cmake >/dev/null || die "no cmake"
  command -v readelf >/dev/null || die "no readelf (binutils), to check the library's run path"
  local cuda archs
  cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$cuda" ] || die "cannot read the CUDA version from nvcc --version"
  archs=$(cuda_archs)
  log "building libggml-cuda.so with CUDA $cuda, architectures $archs"
  mkdir -p "$build"
  # '$ORIGIN' is for the dynamic loader, not the shell.
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" -DGGML_CPU_ALL_VARIANTS=OFF \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_RPATH='$ORIGIN' \
    -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON >"$build/build.log" 2>&1 ||
    { tail -30 "$build/build.log" >&2; die "cmake configure failed (log: $build/build.log)"; }
  cmake --build "$build" --target ggml-cuda -j "$(nproc)" >>"$build/build.log" 2>&1 ||
    { tail -30 "$build/build.log" >&2; die "building ggml-cuda failed (log: $build/build.log)"; }
  local lib base
  lib=$(find "$build" -name 'libggml-cuda.so' -print -quit)
  [ -n "$lib" ] || die "the build made no libggml-cuda.so"
  base=$(find "$build" -name 'libggml-base.so' -print -quit)
  [ -n "$base" ] || die "the build made no libggml-base.so"
  local dyn
  dyn=$(readelf -d "$lib")
  grep -Eq '\((RUNPATH|RPATH)\).*\[\$ORIGIN\]' <<<"$dyn" ||
    die "$lib has no run path \$ORIGIN: it would not find libggml-base.so beside it"$'\n'"$dyn"
  grep -q 'NEEDED.*\[libggml-base\.so\]' <<<"$dyn" ||
    die "$lib does not need libggml-base.so by that name"$'\n'"$dyn"
  # Plain files only; an earlier build's libggml-base.so.0 symlinks go.
  rm -f "$bin/libggml-cuda.so" "$bin"/libggml-base.so*
  cp -L "$lib" "$bin/libggml-cuda.so"
  cp -L "$base" "$bin/libggml-base.so"
  printf '%s\n' "$cuda" >"$bin/libggml-cuda.cuda-version"
  log "placed $bin/libggml-cuda.so and libggml-base.so (needs CUDA $cuda)"
}

# cuda builds the backend for this checkout into bin/ (`make cuda`; needs
# go and nvcc on the same machine).
cuda() {
  local root src
  root=$(cd "$(dirname "$SELF")/.." && pwd)
  command -v go >/dev/null || die "cuda needs go (to find the pinned ollama module); on a machine without go use pack, then build"
  src=$(cd "$root" && go list -m -f '{{.Dir}}' github.com/ollama/ollama)
  mkdir -p "$root/bin"
  build_backend "$src" "$root/build/cuda" "$root/bin"
}

# build makes $1/bin/libggml-cuda.so from the packed ollama sources, and
# $1/build/llama/bin/llama-server with CUDA.
build() {
  local out=$1 jobs
  [ -f "$out/src/ollama/CMakeLists.txt" ] || die "$out/src/ollama has no sources: run pack first"
  jobs=$(nproc)
  build_backend "$out/src/ollama" "$out/build/ggml" "$out/bin"

  log "building llama-server with CUDA from $out/src/llama.cpp"
  cmake -S "$out/src/llama.cpp" -B "$out/build/llama" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$(cuda_archs)" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >"$out/build-llama.log" 2>&1 ||
    { tail -30 "$out/build-llama.log" >&2; die "cmake configure of llama.cpp failed (log: $out/build-llama.log)"; }
  cmake --build "$out/build/llama" --target llama-server -j "$jobs" >>"$out/build-llama.log" 2>&1 ||
    { tail -30 "$out/build-llama.log" >&2; die "building llama-server failed (log: $out/build-llama.log)"; }
  log "built $(find "$out/build/llama" -name llama-server -type f -print -quit)"
}

# http METHOD URL [BODY] prints the answer's body; fails on a non-2xx.
http() {
  local args=(-sS --fail-with-body -X "$1" "$2")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' -d "$3")
  curl "${args[@]}"
}

# json EXPR evaluates a Python expression over the JSON on stdin (as j).
json() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

# wait_for CMD... retries CMD until it succeeds, for at most 120 s.
wait_for() {
  local deadline=$((SECONDS + 120))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out waiting for: $*"
    sleep 0.5
  done
}

# nvml_used PID prints the GPU memory (MiB) NVML reports for PID, or nothing.
nvml_used() {
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', *' -v p="$1" '$1 == p {print $2}'
}

# bench URL TOKEN prints "GEN_TOKS_PER_S PROMPT_TOKS_PER_S": the median of
# ROUNDS generation requests (GEN tokens, ignore_eos) and of ROUNDS prompt
# requests (a 500-token prompt, one token generated), from wall time.
bench() {
  python3 - "$1" "$2" "$GEN" "$ROUNDS" <<'PY'
import json, statistics, sys, time, urllib.request
url, token, gen, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def complete(prompt, n):
    body = json.dumps({"model": "proof", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json", "Authorization": "Bearer " + token})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        ans = json.load(r)
    return ans["usage"], time.monotonic() - t
complete("warm up", 8)
gen_rates = []
for _ in range(rounds):
    u, dt = complete("Once upon a time", gen)
    gen_rates.append(u["completion_tokens"] / dt)
long = " ".join(["the quick brown fox jumps over the lazy dog"] * 60)
prompt_rates = []
for _ in range(rounds):
    u, dt = complete(long, 1)
    prompt_rates.append(u["prompt_tokens"] / dt)
print(f"{statistics.median(gen_rates):.1f} {statistics.median(prompt_rates):.1f}")
PY
}

# run is the proof: hive, worker on the GPU, accounting, release, bench.
run() {
  local out=$1 bin model work
  bin=$out/bin/apiary
  model=$out/models/proof.gguf
  [ -x "$bin" ] || die "no $bin: run pack first"
  [ -f "$out/bin/libggml-cuda.so" ] || die "no $out/bin/libggml-cuda.so: run build first"
  command -v nvidia-smi >/dev/null || die "no nvidia-smi: is the NVIDIA driver installed?"
  work=$(mktemp -d)
  local pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
  mkdir -p "$work/models"
  ln -s "$model" "$work/models/proof.gguf"
  local res=$out/results.md
  {
    echo "# gpu-proof results"
    echo
    echo "- machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$DEVICE"), $(nproc) CPUs"
    echo "- backend: $out/bin/libggml-cuda.so, CUDA $(cat "$out/bin/libggml-cuda.cuda-version")"
    echo "- model: $(stat -c %s "$model") bytes (apiary models testmodel --dim $DIM --layers $LAYERS --heads $HEADS --ff $FF --vocab $VOCAB)"
  } >"$res"

  log "starting a hive"
  "$bin" hive --addr 127.0.0.1:19200 --data-dir "$work/hive" --models-dir "$work/models" >"$work/hive.log" 2>&1 &
  pids+=($!)
  local hive=http://127.0.0.1:19200
  wait_for http GET "$hive/health"
  local why
  why=$(http GET "$hive/v2/gpus" | json "next((g.get('unusable', '') for g in j['gpus'] if g['id'] == $DEVICE), 'no such device')")
  [ -z "$why" ] || die "the hive marks GPU $DEVICE unusable: $why"
  echo "- the hive offers GPU $DEVICE (GET /v2/gpus: no unusable reason)" >>"$res"

  log "starting a worker on GPU $DEVICE through the hive"
  local id pid
  id=$(http POST "$hive/v2/workers/start" "{\"model_ref\":\"proof\",\"gpu_device\":$DEVICE}" | json "j['worker_id']")
  wait_for sh -c "curl -sf $hive/v2/workers/$id | grep -q '\"status\": *\"ready\"'"
  local w vram used
  w=$(http GET "$hive/v2/workers/$id")
  pid=$(echo "$w" | json "j['pid']")
  vram=$(echo "$w" | json "j['vram_bytes']")
  used=$(nvml_used "$pid")
  [ -n "$used" ] || die "NVML lists no memory for the worker's pid $pid: it is not on the GPU"
  echo "- worker $id (pid $pid) ready on GPU $DEVICE: vram_bytes $vram, NVML $used MiB" >>"$res"
  [ $((vram / 1048576)) -eq "$used" ] || die "vram_bytes $vram is not NVML's $used MiB"

  log "stopping the worker; the driver must give its memory back"
  http POST "$hive/v2/workers/$id/stop" '{"reason":"gpu-proof"}' >/dev/null
  wait_for sh -c "[ -z \"\$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -w $pid)\" ]"
  # The hive's own check: it logs the release, or after 30 s the leak.
  local deadline=$((SECONDS + 60))
  until grep -q "the driver gave the worker's GPU memory back" "$work/hive.log"; do
    grep -q "GPU memory not given back" "$work/hive.log" && die "the hive reports leaked memory after the stop: $(grep 'not given back' "$work/hive.log")"
    [ $SECONDS -lt $deadline ] || die "the hive logged neither the release nor a leak within 60 s"
    sleep 0.5
  done
  why=$(http GET "$hive/v2/gpus" | json "next((g.get('unusable', '') for g in j['gpus'] if g['id'] == $DEVICE), 'no such device')")
  [ -z "$why" ] || die "after the stop GPU $DEVICE is unusable: $why"
  echo "- after the stop NVML lists no process $pid and the hive keeps GPU $DEVICE usable" >>"$res"

  log "benchmark: apiary worker vs llama-server, both on GPU $DEVICE"
  export APIARY_WORKER_TOKEN=gpu-proof
  CUDA_VISIBLE_DEVICES=$DEVICE "$bin" worker --model "$model" --port 18001 --gpu-device 0 --ctx-size 2048 >"$work/worker.log" 2>&1 &
  pids+=($!)
  wait_for curl -sf http://127.0.0.1:18001/health
  local a
  a=$(bench http://127.0.0.1:18001 gpu-proof)
  kill "${pids[-1]}"
  local ls
  ls=$(find "$out/build/llama" -name llama-server -type f -print -quit)
  CUDA_VISIBLE_DEVICES=$DEVICE "$ls" -m "$model" --port 18002 -ngl 999 -c 2048 --api-key gpu-proof >"$work/llama-server.log" 2>&1 &
  pids+=($!)
  wait_for curl -sf http://127.0.0.1:18002/health
  local b
  b=$(bench http://127.0.0.1:18002 gpu-proof)
  {
    echo
    echo "| server | generation tok/s | prompt tok/s |"
    echo "|---|---|---|"
    echo "| apiary worker | ${a% *} | ${a#* } |"
    echo "| llama-server (CUDA) | ${b% *} | ${b#* } |"
    echo
    echo "Median of $ROUNDS requests each; generation: $GEN tokens, prompt: 500 tokens. Measured by: scripts/gpu-proof.sh run $out"
  } >>"$res"
  cat "$res"
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
  -h|--help|help) usage ;;
  cuda) [ $# -eq 0 ] || { log "cuda takes no argument"; usage; }; cuda; exit ;;
  pack|build|run|all) ;;
  *) log "unknown step $cmd (want pack, build, run, all or cuda)"; usage ;;
esac
[ $# -eq 1 ] || { log "$cmd needs one argument: the output directory"; usage; }
OUT=$1
case $cmd in
  pack) pack "$OUT" ;;
  build) build "$OUT" ;;
  run) run "$OUT" ;;
  all) build "$OUT"; run "$OUT" ;;
esac
