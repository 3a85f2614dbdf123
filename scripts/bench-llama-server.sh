#!/usr/bin/env bash
# bench-llama-server.sh compares apiary's worker with llama.cpp's own
# llama-server on one GGUF, side by side, and writes the figures to
# docs/benchmarks.md (between <!-- llama-server:begin --> and
# <!-- llama-server:end -->).
#
#   scripts/bench-llama-server.sh [build|model|run|self-test|llama-bench|all]
#
#   build        obtain llama.cpp and build llama-server, llama-bench and
#                llama-quantize into the cache (skipped when already built)
#   model        make the benchmark model (skipped when already made)
#   run          the side-by-side benchmark, apiary worker vs llama-server
#   self-test    the same harness with llama-server on both sides (proves the
#                harness: the ratio should be ~1.0); writes no docs
#   llama-bench  llama.cpp's llama-bench on the benchmark model, for reference
#   all          build, model, llama-bench, run (the default)
#
# Where llama.cpp comes from: the very build apiary links
# (scripts/llamacpp.sh: llama.cpp v0.5.0, commit de3ff815, from the git
# bundle the npm package node-llama-cpp@3.22.1 ships), so that the
# comparison measures how apiary drives llama.cpp, not two llama.cpps:
# llama-server, llama-bench and llama-quantize are built in that tree, with
# the same options and the same CPU backend libraries beside them (each
# loads the best level this CPU runs, as the worker does). Everything goes
# to the cache outside the repo:
#   ${XDG_CACHE_HOME:-~/.cache}/apiary/llama.cpp/<pin>/server/
#     {llama-server,llama-bench,llama-quantize} and their libraries, logs/
#   ${XDG_CACHE_HOME:-~/.cache}/apiary/bench-models/<name>.gguf
#
# Knobs (environment):
#   BENCH_SESSIONS   times both servers are started afresh (4): each start
#                    lays memory out anew, which alone moves a server's speed
#                    by several percent, so one start is not a fair sample
#   BENCH_ROUNDS     A/B rounds a session (3); each round runs both sides
#                    once, in alternating order
#   BENCH_MAX_FOREIGN  CPUs other processes may take during a request before
#                    its round is run again (0.25; negative: no check)
#   BENCH_THREADS    threads for both servers (2)
#   BENCH_CTX        context size (512)
#   BENCH_GEN_TOKENS tokens generated per generation request (256)
#   BENCH_PROMPT_TOKENS prompt tokens per prompt-processing request, BOS
#                    included (500: a 512-token prompt, plus the token it
#                    generates, does not fit a 512 context; llama-bench, which
#                    sizes its own context, takes 512)
#   BENCH_MODEL      use this GGUF instead of making one
#   BENCH_DIM, BENCH_LAYERS, BENCH_HEADS, BENCH_FF, BENCH_VOCAB
#                    shape of the generated model (768, 12, 12, 2048, 4000:
#                    91.1 M parameters, the issue's model)
#   BENCH_DOCS       markdown file to update (docs/benchmarks.md)
#   APIARY_BIN       apiary binary (bin/apiary, built with `make build`)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/apiary
LS_DIR=$("$ROOT/scripts/llamacpp.sh" prefix)
LS_BIN=$LS_DIR/server
MODEL_DIR=$CACHE/bench-models
BENCH_DIM=${BENCH_DIM:-768}
BENCH_LAYERS=${BENCH_LAYERS:-12}
BENCH_HEADS=${BENCH_HEADS:-12}
BENCH_FF=${BENCH_FF:-2048}
BENCH_VOCAB=${BENCH_VOCAB:-4000}
MODEL_SHAPE=d${BENCH_DIM}-l${BENCH_LAYERS}-h${BENCH_HEADS}-ff${BENCH_FF}-v${BENCH_VOCAB}
APIARY_BIN=${APIARY_BIN:-$ROOT/bin/apiary}
BENCH_DOCS=${BENCH_DOCS:-$ROOT/docs/benchmarks.md}
JOBS=$(nproc)

log() { printf 'bench-llama-server: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# build builds the three tools the benchmark runs in the tree apiary's
# llama.cpp was built in, unless they are there already.
build() {
  "$ROOT/scripts/llamacpp.sh" server >/dev/null
  if [ -x "$LS_BIN/llama-server" ] && [ -x "$LS_BIN/llama-bench" ] && [ -x "$LS_BIN/llama-quantize" ]; then
    return
  fi
  log "building llama-bench and llama-quantize of $(sed -n 's/^tag=//p' "$LS_DIR/pin") with $JOBS jobs"
  cmake --build "$LS_DIR/build" -j "$JOBS" --target llama-bench llama-quantize >"$LS_DIR/bench-build.log" 2>&1 ||
    { tail -30 "$LS_DIR/bench-build.log" >&2; die "build failed (log: $LS_DIR/bench-build.log)"; }
  cp "$LS_DIR/build/bin/llama-bench" "$LS_DIR/build/bin/llama-quantize" "$LS_BIN/"
  # and the libraries they link ($ORIGIN), but the CUDA backend
  find "$LS_DIR/build/bin" -maxdepth 1 -name 'lib*.so' ! -name 'libggml-cuda.so' -exec cp {} "$LS_BIN/" \;
}

# model_path prints the benchmark model's path.
model_path() {
  if [ -n "${BENCH_MODEL:-}" ]; then echo "$BENCH_MODEL"; else echo "$MODEL_DIR/testmodel-${MODEL_SHAPE}-q8_0.gguf"; fi
}

# model makes the benchmark model: an F32 llama test model from
# `apiary models testmodel`, quantized to q8_0 with llama-quantize.
model() {
  local out
  out=$(model_path)
  [ -f "$out" ] && { log "model $out"; return; }
  [ -n "${BENCH_MODEL:-}" ] && die "BENCH_MODEL=$BENCH_MODEL does not exist"
  [ -x "$APIARY_BIN" ] || die "no apiary binary at $APIARY_BIN: run \`make build\` (or set APIARY_BIN)"
  build
  mkdir -p "$MODEL_DIR"
  local f32="$MODEL_DIR/testmodel-${MODEL_SHAPE}-f32.gguf"
  if [ ! -f "$f32" ]; then
    log "generating $f32"
    "$APIARY_BIN" models testmodel "$f32" --text=false --dim "$BENCH_DIM" --layers "$BENCH_LAYERS" \
      --heads "$BENCH_HEADS" --ff "$BENCH_FF" --vocab "$BENCH_VOCAB" >&2
  fi
  log "quantizing to q8_0"
  "$LS_BIN/llama-quantize" "$f32" "$out.tmp" q8_0 >"$MODEL_DIR/quantize.log" 2>&1 ||
    { tail -20 "$MODEL_DIR/quantize.log" >&2; die "llama-quantize failed"; }
  mv "$out.tmp" "$out"
  log "model $out"
}

# harness runs the Go side-by-side benchmark (internal/benchmark, build tag
# llamaserver) with B = apiary (run) or a second llama-server (self-test).
harness() {
  local mode=$1 docs=""
  build
  model
  if [ "$mode" = apiary ]; then
    [ -x "$APIARY_BIN" ] || die "no apiary binary at $APIARY_BIN: run \`make build\` (or set APIARY_BIN)"
    docs=$BENCH_DOCS
  fi
  cd "$ROOT"
  BENCH_B=$mode \
  BENCH_LLAMA_SERVER=$LS_BIN/llama-server \
  BENCH_LLAMA_BUILD_INFO=$LS_DIR/pin \
  BENCH_LLAMA_BENCH_MD=$(llama_bench_md) \
  BENCH_LOG_DIR=$LS_DIR/logs \
  BENCH_MODEL=$(model_path) \
  BENCH_DOCS=$docs \
  APIARY_BIN=$APIARY_BIN \
    go test -tags llamaserver -run '^$' -bench '^BenchmarkLlamaServer$' -benchtime 1x -timeout 60m -v ./internal/benchmark
}

# llama_bench_md is where llama-bench's table for the model is kept.
llama_bench_md() { echo "$LS_DIR/llama-bench-$(basename "$(model_path)" .gguf).md"; }

# busy_ticks prints the machine's busy CPU time so far, in clock ticks:
# user+nice+system+irq+softirq+steal of /proc/stat's "cpu" line.
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }

# wait_quiet waits up to three minutes for a second in which the machine
# is at most 0.25 CPUs busy: llama-bench's spinning threads lose most of their
# speed when anything else runs.
wait_quiet() {
  local deadline=$((SECONDS + 180)) a b
  while :; do
    a=$(busy_ticks); sleep 1; b=$(busy_ticks)
    [ $((b - a)) -le 25 ] && return
    [ $SECONDS -ge $deadline ] && { log "machine still busy ($((b - a))% of a CPU); going on"; return; }
    sleep 4
  done
}

llama_bench() {
  build
  model
  local out try a b wall cpu others
  out=$(llama_bench_md)
  # -fa 0,1: llama-bench defaults to flash attention off, llama-server (and
  # llama.cpp's context defaults, which apiary keeps) to auto, which is on
  # for the CPU; the fa=1 rows are the ones to hold against the servers.
  for try in 1 2 3; do
    wait_quiet
    a=$(busy_ticks)
    local t0=$EPOCHREALTIME
    local TIMEFORMAT='%U %S'
    cpu=$( { time "$LS_BIN/llama-bench" -m "$(model_path)" -t "${BENCH_THREADS:-2}" -fa 0,1 \
      -p "${BENCH_PROMPT_TOKENS:-512}" -n "${BENCH_GEN_TOKENS:-256}" -r 3 -o md >"$out.tmp" 2>/dev/null; } 2>&1 )
    b=$(busy_ticks)
    wall=$(awk -v t0="$t0" -v t1="$EPOCHREALTIME" 'BEGIN{print t1-t0}')
    # CPUs others used on average: the machine's busy time less llama-bench's.
    others=$(awk -v busy=$((b - a)) -v cpu="$cpu" -v wall="$wall" \
      'BEGIN{split(cpu, c, " "); v=(busy/100 - c[1] - c[2])/wall; if (v < 0) v = 0; printf "%.2f", v}')
    if awk -v o="$others" 'BEGIN{exit !(o <= 0.25)}'; then break; fi
    log "llama-bench: other processes used $others CPUs meanwhile (try $try of 3)"
  done
  local version
  version=$(sed -n 's/^build: //p' "$out.tmp")
  sed -i '/^build: /d' "$out.tmp"
  printf 'llama-bench %s, 3 repetitions; other processes used %s CPUs on average meanwhile.\n' \
    "$version" "$others" >>"$out.tmp"
  mv "$out.tmp" "$out"
  cat "$out"
  log "llama-bench table saved to $out"
}

case "${1:-all}" in
  build) build ;;
  model) model ;;
  run) harness apiary ;;
  self-test) harness llama-server ;;
  llama-bench) llama_bench ;;
  all) build; model; llama_bench; harness apiary ;;
  *) die "unknown step ${1} (want build, model, run, self-test, llama-bench or all)" ;;
esac
