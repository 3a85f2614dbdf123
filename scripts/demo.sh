#!/usr/bin/env bash
# The README's first command: generate the deterministic test model and answer
# a prompt with `apiary infer`. With no queen running, infer works in
# ephemeral mode: it starts a queen (SQLite in a throwaway data dir) and a
# local hive, which starts a worker; the tokens stream to stdout; then
# everything it started shuts down. With a queen running it uses that one and
# leaves it running.
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${APIARY_DEMO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/apiary/demo}"
model="$dir/tiny.gguf"
[ -f "$model" ] || bin/apiary models testmodel "$model"

echo "demo: model tiny has random weights: expect gibberish, streamed token by token" >&2
bin/apiary infer --model "$model" --prompt "${1:-Say hello to the bees.}" --max-tokens 32 --worker-threads 1
