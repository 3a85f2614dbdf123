#!/usr/bin/env bash
# gpu-proof.sh proves apiary on a machine with an NVIDIA GPU and no Go: it
# builds llama.cpp's CUDA backend and a CUDA llama-server from the source
# and commit apiary links (one CMake build, for that GPU's architecture
# only), places the backend beside apiary, and shows that a hive offers
# the GPU, a worker runs on it, NVML's accounting matches the worker's
# vram_bytes, the driver has the memory back soon after a stop, and how
# fast generation and prompt processing are next to that llama-server,
# side by side on the same model. It prints one table (OUT/results.md) with
# the issue's bars, each PASS or FAIL.
#
#   scripts/gpu-proof.sh pack OUT    on the machine with Go (after make
#                                    build): OUT/apiary-proof.tgz, about
#                                    33 MB: apiary (stripped), its
#                                    libraries, the llama.cpp source
#                                    (what its build needs) and this script
#   scripts/gpu-proof.sh build OUT   on the GPU machine (CUDA toolkit,
#                                    cmake, g++, python3, curl): unpack and
#                                    build; the backend beside OUT/bin/apiary
#   scripts/gpu-proof.sh run OUT     the proof and the benchmark
#   scripts/gpu-proof.sh all OUT     build, then run
#   scripts/gpu-proof.sh bench-cpu OUT
#                                    after build: apiary's worker against
#                                    that llama-server on the CPU alone
#                                    (internal/benchmark's harness, packed
#                                    as bench.test), the figure of
#                                    docs/benchmarks.md on this machine's
#                                    CPU; the report in OUT/bench-cpu.md;
#                                    GPU_PROOF_CPU_VARIANT=LEVEL holds both
#                                    sides to that CPU backend
#   scripts/gpu-proof.sh cuda        `make cuda` on a machine with Go and
#                                    nvcc (scripts/llamacpp.sh cuda)
#
# Knobs (environment):
#   GPU_PROOF_DIM, GPU_PROOF_LAYERS, GPU_PROOF_HEADS, GPU_PROOF_FF,
#   GPU_PROOF_VOCAB     shape of the generated model (2048, 12, 16, 5632,
#                       8000: about 2.4 GiB)
#   GPU_PROOF_DEVICE    the GPU to use (0)
#   GPU_PROOF_GEN       tokens generated per generation request (256)
#   GPU_PROOF_ROUNDS    rounds, alternating the two servers; medians (5)
#   CUDA_ARCHS          CMAKE_CUDA_ARCHITECTURES (default: the GPUs'
#                       compute capability from nvidia-smi, else native)
#
# It ran once, on an NVIDIA H200 (2026-11-27, every bar passed): its
# results, and what has not run on a GPU, are in docs/gpu.md.
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

log() { printf 'gpu-proof: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# The llama.cpp source directories its build needs (the rest — models,
# docs, tests, Python — stays out of the pack).
SOURCE_SKIP='^(models|docs|examples|benches|tests|gguf-py|conversion|media|pocs|requirements|requirements.txt|ci|grammars|prompts|ui|skills|convert_.*[.]py)$'

# pack writes $1/apiary-proof.tgz.
pack() {
  local out=$1 root prefix stage
  root=$(cd "$(dirname "$SELF")/.." && pwd)
  [ -x "$root/bin/apiary" ] || die "no $root/bin/apiary: run make build first"
  prefix=$("$root/scripts/llamacpp.sh" prefix)
  [ -d "$prefix/src/.git" ] || die "no llama.cpp source at $prefix/src: run make build first"
  mkdir -p "$out"
  stage=$(mktemp -d)
  trap "rm -rf '$stage'; trap - RETURN" RETURN
  mkdir -p "$stage/bin" "$stage/src/llama.cpp"
  cp "$root/bin/apiary" "$stage/bin/" && strip "$stage/bin/apiary"
  # Every library but the CPU backends of desktop CPUs a GPU server does
  # not have (the CPU backend chosen there is in `apiary version`).
  cp "$root"/bin/lib*.so "$stage/bin/"
  rm -f "$stage"/bin/libggml-cpu-{sse42,sandybridge,ivybridge,piledriver,alderlake,cannonlake,cooperlake}.so
  # shellcheck disable=SC2046
  git -C "$prefix/src" archive HEAD $(git -C "$prefix/src" ls-tree --name-only HEAD | grep -vE "$SOURCE_SKIP") |
    tar -x -C "$stage/src/llama.cpp"
  cp "$prefix/pin" "$stage/src/llama.cpp.pin"
  cp "$SELF" "$stage/gpu-proof.sh"
  cp "$(dirname "$SELF")/llamacpp-options.sh" "$stage/"
  # The side-by-side harness, for bench-cpu (the GPU machine has no Go).
  (cd "$root" && CGO_ENABLED=0 go test -c -tags llamaserver -o "$stage/bench.test" ./internal/benchmark) ||
    die "cannot build internal/benchmark's test binary"
  tar -czf "$out/apiary-proof.tgz" -C "$stage" .
  log "packed $out/apiary-proof.tgz ($(du -h "$out/apiary-proof.tgz" | cut -f1)); on the GPU machine: scripts/gpu-proof.sh all $out"
}

# cuda_archs is CMAKE_CUDA_ARCHITECTURES: CUDA_ARCHS, else every compute
# capability nvidia-smi reports (9.0 → 90), else native.
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

# build unpacks $1/apiary-proof.tgz and builds the CUDA backend and a CUDA
# llama-server in one CMake build of the packed source; the backend goes
# beside $1/bin/apiary, llama-server stays with its libraries in the build.
build() {
  local out=$1
  [ -f "$out/apiary-proof.tgz" ] || die "no $out/apiary-proof.tgz: run pack first"
  command -v nvcc >/dev/null || die "no nvcc: the CUDA toolkit is needed (its bin/ on PATH)"
  command -v cmake >/dev/null || die "no cmake"
  command -v readelf >/dev/null || die "no readelf (binutils), to check the library's run path"
  tar -xzf "$out/apiary-proof.tgz" -C "$out"
  local cuda archs start=$SECONDS b=$out/build
  cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$cuda" ] || die "cannot read the CUDA version from nvcc --version"
  archs=$(cuda_archs)
  log "building ggml-cuda and llama-server (CUDA $cuda, architectures $archs, $(nproc) jobs)"
  # scripts/llamacpp.sh's options (beside this script, in the archive
  # too), with CUDA.
  . "$(dirname "$SELF")/llamacpp-options.sh"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$out/src/llama.cpp" -B "$b" "${gen[@]}" "${OPTIONS[@]}" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    >"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; die "cmake configure failed (log: $out/build.log)"; }
  cmake --build "$b" -j "$(nproc)" --target ggml-cuda llama-server llama-quantize >>"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log" >&2; die "the build failed (log: $out/build.log)"; }
  local lib=$b/bin/libggml-cuda.so dyn
  [ -f "$lib" ] || die "the build made no libggml-cuda.so"
  dyn=$(readelf -d "$lib")
  grep -Eq '\((RUNPATH|RPATH)\).*\[\$ORIGIN\]' <<<"$dyn" ||
    die "$lib has no run path \$ORIGIN: it would not find libggml-base.so beside it"$'\n'"$dyn"
  grep -q 'NEEDED.*\[libggml-base\.so\]' <<<"$dyn" ||
    die "$lib does not need libggml-base.so by that name"$'\n'"$dyn"
  cp "$lib" "$out/bin/libggml-cuda.so"
  printf '%s\n' "$cuda" >"$out/bin/libggml-cuda.cuda-version"
  echo "$((SECONDS - start))" >"$out/build-seconds"
  log "built in $((SECONDS - start))s; placed $out/bin/libggml-cuda.so (needs CUDA $cuda)"
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
    sleep 0.2
  done
}

# nvml_used PID prints the GPU memory (MiB) NVML reports for PID, or nothing.
nvml_used() {
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', *' -v p="$1" '$1 == p {print $2}'
}

# gpu_used prints the memory in use on the GPU (MiB).
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$DEVICE" | tr -d ' '; }

# bench A_URL B_URL compares two servers on the model, alternating them
# round by round: it prints "GEN_A PROMPT_A GEN_B PROMPT_B SAME PROMPT" (medians
# of tokens per second; SAME is how many rounds gave the same greedy text;
# PROMPT the long prompt's length in tokens).
bench() {
  python3 - "$1" "$2" "$GEN" "$ROUNDS" <<'PY'
import json, statistics, sys, time, urllib.request
a, b, gen, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def complete(url, prompt, n):
    body = json.dumps({"model": "proof", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json", "Authorization": "Bearer gpu-proof"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        ans = json.load(r)
    return ans, time.monotonic() - t
long = " ".join(["the quick brown fox jumps over the lazy dog"] * 60)
rates = {a: ([], []), b: ([], [])}
same = 0
prompt_tokens = 0
for url in (a, b):
    complete(url, "warm up", 8)
for r in range(rounds):
    texts = {}
    for url in ((a, b) if r % 2 == 0 else (b, a)):
        ans, dt = complete(url, "Once upon a time", gen)
        rates[url][0].append(ans["usage"]["completion_tokens"] / dt)
        texts[url] = ans["choices"][0]["text"]
        # A prompt of its own each time: a server's prompt cache would
        # otherwise skip it.
        ans, dt = complete(url, f"{2 * r + (url == b)} {long}", 1)
        rates[url][1].append(ans["usage"]["prompt_tokens"] / dt)
        prompt_tokens = ans["usage"]["prompt_tokens"]
    same += texts[a] == texts[b]
m = statistics.median
print(f"{m(rates[a][0]):.1f} {m(rates[a][1]):.1f} {m(rates[b][0]):.1f} {m(rates[b][1]):.1f} {same} {prompt_tokens}")
PY
}

# verdict OK prints PASS or FAIL.
verdict() { if [ "$1" = 1 ]; then echo PASS; else echo FAIL; fi; }

# run is the proof: hive, worker on the GPU, accounting, release, bench.
run() {
  local out=$1 bin work
  bin=$out/bin/apiary
  [ -x "$bin" ] || die "no $bin: run pack and build first"
  [ -f "$out/bin/libggml-cuda.so" ] || die "no $out/bin/libggml-cuda.so: run build first"
  command -v nvidia-smi >/dev/null || die "no nvidia-smi: is the NVIDIA driver installed?"
  work=$(mktemp -d)
  # The logs stay in OUT/logs for whoever reads a FAIL.
  # The logs stay in OUT/logs for whoever reads a FAIL (the trap runs
  # after run's locals are gone: globals only).
  PROOF_OUT=$out PROOF_WORK=$work PROOF_PIDS=()
  trap 'for p in "${PROOF_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; mkdir -p "$PROOF_OUT/logs"; cp "$PROOF_WORK"/*.log "$PROOF_OUT/logs/" 2>/dev/null; rm -rf "$PROOF_WORK"' EXIT
  mkdir -p "$work/models"
  local model=$work/models/proof.gguf
  "$bin" models testmodel "$model" --text=false --dim "$DIM" --layers "$LAYERS" --heads "$HEADS" --ff "$FF" --vocab "$VOCAB" >&2
  local res=$out/results.md
  {
    echo "# gpu-proof results"
    echo
    echo "- machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$DEVICE"), $(nproc) CPUs"
    echo "- apiary: $("$bin" version | paste -sd ';' | sed 's/;/; /g')"
    echo "- backend: libggml-cuda.so for CUDA $(cat "$out/bin/libggml-cuda.cuda-version"), built in $(cat "$out/build-seconds" 2>/dev/null || echo ?) s with llama-server from the same source"
    echo "- model: $(stat -c %s "$model") bytes (apiary models testmodel --text=false --dim $DIM --layers $LAYERS --heads $HEADS --ff $FF --vocab $VOCAB)"
    echo
    echo "| check | measured | bar | verdict |"
    echo "|---|---|---|---|"
  } >"$res"

  log "starting a hive"
  "$bin" hive --addr 127.0.0.1:19200 --data-dir "$work/hive" --models-dir "$work/models" >"$work/hive.log" 2>&1 &
  PROOF_PIDS+=($!)
  local hive=http://127.0.0.1:19200
  wait_for http GET "$hive/health"
  # A hive left from an earlier run would answer too.
  kill -0 "${PROOF_PIDS[-1]}" 2>/dev/null || { cat "$work/hive.log" >&2; die "the hive exited"; }
  local why
  why=$(http GET "$hive/v2/gpus" | json "next((g.get('unusable', '') for g in j['gpus'] if g['id'] == $DEVICE), 'no such device')")
  echo "| the hive offers GPU $DEVICE | ${why:-usable} | usable | $(verdict "$([ -z "$why" ] && echo 1)") |" >>"$res"
  [ -z "$why" ] || { cat "$res"; die "the hive marks GPU $DEVICE unusable: $why"; }

  local base id pid w vram used
  base=$(gpu_used)
  log "starting a worker on GPU $DEVICE through the hive (GPU memory in use before: $base MiB)"
  id=$(http POST "$hive/v2/workers/start" "{\"model_ref\":\"proof\",\"gpu_device\":$DEVICE}" | json "j['worker_id']")
  wait_for sh -c "curl -sf $hive/v2/workers/$id | grep -q '\"status\": *\"ready\"'"
  w=$(http GET "$hive/v2/workers/$id")
  pid=$(echo "$w" | json "j['pid']")
  vram=$(echo "$w" | json "j['vram_bytes']")
  used=$(nvml_used "$pid")
  # What the driver shows with the worker loaded, for whoever reads a FAIL.
  { nvidia-smi; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; } >"$work/nvidia-smi.log" 2>&1 || true
  local within=0 grew
  grew=$(($(gpu_used) - base))
  if [ -n "$used" ]; then
    within=$(python3 -c "print(1 if abs($vram / 1048576 - $used) <= 0.05 * $used else 0)")
  else
    # Inside a container without the host's process namespace NVML
    # lists host pids (or none); say so and go on with the device total.
    used="none listed for pid $pid"
  fi
  echo "| worker's vram_bytes vs NVML's count of its pid | $((vram / 1048576)) MiB vs $used MiB (the device's use grew $grew MiB) | within 5 % | $(verdict "$within") |" >>"$res"

  log "stopping the worker; the driver must have the memory back"
  local t0 back=""
  t0=$(date +%s.%N)
  http POST "$hive/v2/workers/$id/stop" '{}' >/dev/null
  local deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ]; do
    if [ -z "$(nvml_used "$pid")" ] && [ "$(gpu_used)" -le $((base + 64)) ]; then
      back=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")
      break
    fi
    sleep 0.05
  done
  echo "| GPU memory back to its baseline ($base MiB, +64) after the stop | ${back:-not within 60} s | within 2 s | $(verdict "$(python3 -c "print(1 if '$back' and float('${back:-99}') <= 2 else 0)")") |" >>"$res"
  deadline=$((SECONDS + 60))
  why="no verdict in the hive's log within 60 s"
  while [ $SECONDS -lt $deadline ]; do
    if grep -q "the driver gave the worker's GPU memory back" "$work/hive.log"; then
      why=""
      break
    fi
    if grep -q "GPU memory not given back" "$work/hive.log"; then
      why=$(grep -o "GPU memory not given back.*" "$work/hive.log" | head -1)
      break
    fi
    sleep 0.2
  done
  echo "| the hive's release check | ${why:-memory given back} | no leak | $(verdict "$([ -z "$why" ] && echo 1)") |" >>"$res"

  # The hive goes (it would register with the queen infer starts).
  kill "${PROOF_PIDS[0]}" && wait "${PROOF_PIDS[0]}" || true

  log "apiary infer: an ephemeral queen, hive and worker answer a prompt; the worker must be on GPU $DEVICE"
  local sampler peak answer size ok=0
  base=$(gpu_used)
  (while :; do gpu_used; sleep 0.1; done) >"$work/infer-gpu-used" &
  sampler=$!
  if answer=$("$bin" infer --model "$model" --prompt "Once upon a time" --max-tokens 16 --debug 2>"$work/infer.log"); then
    ok=1
  fi
  kill "$sampler" 2>/dev/null || true
  peak=$(($(sort -n "$work/infer-gpu-used" | tail -1) - base))
  size=$(($(stat -c %s "$model") / 1048576))
  [ "$ok" = 1 ] && [ -n "$answer" ] && [ "$peak" -ge $((size / 2)) ] || ok=0
  echo "| apiary infer (ephemeral queen, hive, worker) runs on the GPU | $([ -n "$answer" ] && echo "answered ${#answer} characters" || echo "no answer, see logs/infer.log"); the GPU's use peaked $peak MiB above $base MiB (model $size MiB) | answered, peak ≥ half the model | $(verdict "$ok") |" >>"$res"

  log "benchmark: apiary worker vs llama-server of the same source, both on GPU $DEVICE"
  export APIARY_WORKER_TOKEN=gpu-proof
  CUDA_VISIBLE_DEVICES=$DEVICE "$bin" worker --model "$model" --port 18001 --gpu-device 0 --ctx-size 4096 >"$work/worker.log" 2>&1 &
  PROOF_PIDS+=($!)
  CUDA_VISIBLE_DEVICES=$DEVICE "$out/build/bin/llama-server" -m "$model" --port 18002 -ngl 999 -c 4096 -np 1 --api-key gpu-proof >"$work/llama-server.log" 2>&1 &
  PROOF_PIDS+=($!)
  wait_for curl -sf http://127.0.0.1:18001/health
  wait_for curl -sf http://127.0.0.1:18002/health
  local r ga pa gb pb same ptok
  r=$(bench http://127.0.0.1:18001 http://127.0.0.1:18002)
  read -r ga pa gb pb same ptok <<<"$r"
  ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
  ok() { python3 -c "print(1 if $1 / $2 >= 0.95 else 0)"; }
  {
    echo "| generation, apiary / llama-server | $ga / $gb tok/s = $(ratio "$ga" "$gb") | ≥ 0.95 | $(verdict "$(ok "$ga" "$gb")") |"
    echo "| prompt processing, apiary / llama-server | $pa / $pb tok/s = $(ratio "$pa" "$pb") | ≥ 0.95 | $(verdict "$(ok "$pa" "$pb")") |"
    echo "| greedy output identical | $same of $ROUNDS rounds | every round | $(verdict "$([ "$same" = "$ROUNDS" ] && echo 1)") |"
    echo
    echo "Medians of $ROUNDS rounds, the servers alternating; generation: $GEN tokens, prompt: $ptok tokens, one generated. Measured by: scripts/gpu-proof.sh run $out"
  } >>"$res"
  cat "$res"
}

# bench_cpu runs internal/benchmark's side-by-side harness (the one
# docs/benchmarks.md's figures come from) with the GPU hidden: apiary's
# worker against the CUDA build's llama-server, both on the CPU, on the
# q8_0 model of those figures.
bench_cpu() {
  local out=$1
  local bin=$out/bin/apiary ls=$out/build/bin
  [ -x "$out/bench.test" ] || die "no $out/bench.test: pack it again (it is new)"
  [ -x "$ls/llama-server" ] && [ -x "$ls/llama-quantize" ] || die "no llama-server or llama-quantize in $ls: run build first"
  local models=$out/models shape=d768-l12-h12-ff2048-v4000
  mkdir -p "$models"
  if [ ! -f "$models/testmodel-$shape-q8_0.gguf" ]; then
    "$bin" models testmodel "$models/testmodel-$shape-f32.gguf" --text=false --dim 768 --layers 12 --heads 12 --ff 2048 --vocab 4000 >&2
    "$ls/llama-quantize" "$models/testmodel-$shape-f32.gguf" "$models/testmodel-$shape-q8_0.gguf" q8_0 >"$models/quantize.log" 2>&1 ||
      { tail -20 "$models/quantize.log" >&2; die "llama-quantize failed"; }
  fi
  local variant=${GPU_PROOF_CPU_VARIANT:-}
  if [ -n "$variant" ]; then
    # llama-server loads the best CPU backend beside it: leave it one.
    [ -f "$ls/libggml-cpu-$variant.so" ] || die "no CPU backend $variant in $ls"
    local held=$out/llama-server-$variant f
    rm -rf "$held" && mkdir -p "$held"
    for f in "$ls"/*; do
      case $(basename "$f") in libggml-cpu-*) [ "$(basename "$f")" = "libggml-cpu-$variant.so" ] || continue ;; esac
      cp -r "$f" "$held/"
    done
    ls=$held
    export APIARY_CPU_VARIANT=$variant
  fi
  log "apiary vs llama-server on the CPU ($(nproc) CPUs, ${BENCH_THREADS:=8} threads, CPU backend ${variant:-each its best})"
  (cd "$out" && CUDA_VISIBLE_DEVICES="" BENCH_THREADS=$BENCH_THREADS \
    BENCH_LLAMA_SERVER=$ls/llama-server BENCH_LLAMA_BUILD_INFO=$out/src/llama.cpp.pin \
    BENCH_LOG_DIR=$out/logs BENCH_MODEL=$models/testmodel-$shape-q8_0.gguf BENCH_DOCS=$out/bench-cpu.md \
    APIARY_BIN=$bin ./bench.test -test.run '^$' -test.bench '^BenchmarkLlamaServer$' -test.benchtime 1x -test.timeout 30m -test.v)
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
  -h|--help|help) usage ;;
  cuda)
    [ $# -eq 0 ] || { log "cuda takes no argument"; usage; }
    exec "$(dirname "$SELF")/llamacpp.sh" cuda ;;
  pack|build|run|all|bench-cpu) ;;
  *) log "unknown step $cmd (want pack, build, run, all, bench-cpu or cuda)"; usage ;;
esac
[ $# -eq 1 ] || { log "$cmd needs one argument: the output directory"; usage; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
case $cmd in
  pack) pack "$OUT" ;;
  build) build "$OUT" ;;
  run) run "$OUT" ;;
  all) build "$OUT"; run "$OUT" ;;
  bench-cpu) bench_cpu "$OUT" ;;
esac
