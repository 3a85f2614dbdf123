#!/usr/bin/env bash
# The README's first command: generate the deterministic test model and answer
# a prompt with `apiary infer --ephemeral`: it starts a queen (SQLite in a
# throwaway data dir) and a local hive on free ports, the hive starts a
# worker, the tokens stream to stdout, then everything it started shuts
# down. A queen already running (at $APIARY_QUEEN or :8080) is left alone.
#
# The test model has random weights and a vocabulary of words besides its
# byte tokens; its weights let it write only the words, so the answer is
# random words, not bytes (TestDemoAnswersInWords runs this script).
#
# Knobs (environment): APIARY_DEMO_DIR, where the model goes (default
# ~/.cache/apiary/demo); APIARY_BIN, the apiary to run (default bin/apiary).
set -euo pipefail
cd "$(dirname "$0")/.."

apiary="${APIARY_BIN:-bin/apiary}"
dir="${APIARY_DEMO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/apiary/demo}"
model="$dir/tiny.gguf"
# Written each time (milliseconds): a model an older apiary left there may
# be another one.
"$apiary" models testmodel --force "$model" >&2

echo "demo: model tiny has random weights: expect random words, streamed token by token" >&2
"$apiary" infer --ephemeral --model "$model" --prompt "${1:-Say hello to the bees.}" --max-tokens 32 --worker-threads 1
