#!/usr/bin/env bash
# The README's first command: build apiary, generate the deterministic test
# model, serve it with a worker and answer a prompt, then shut the worker down.
set -euo pipefail
cd "$(dirname "$0")/.."

data="${APIARY_DEMO_DIR:-$(mktemp -d)}"
model="$data/models/tiny.gguf"
[ -f "$model" ] || bin/apiary models testmodel "$model"

log="$data/worker.log"
ready="$data/ready.json"
# The worker reports ready by POSTing to a callback; without a hive running,
# the demo simply waits for /health to say ready.
bin/apiary worker --worker-id demo --model "$model" --port 0 --threads 1 --log-json 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT

url=""
for _ in $(seq 1 200); do
  url=$(grep '"msg":"listening"' "$log" 2>/dev/null | head -1 | sed -n 's/.*"addr":"\([^"]*\)".*/http:\/\/\1/p' || true)
  [ -n "$url" ] && curl -fsS "$url/health" 2>/dev/null | grep -q '"status":"ready"' && break
  kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "demo: worker did not come up; its log:" >&2; cat "$log" >&2; exit 1; }

echo "demo: worker ready at $url (model tiny, random weights: expect gibberish)" >&2
echo "demo: POST /v1/chat/completions, streamed token by token:" >&2
curl -sN "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","messages":[{"role":"user","content":"Say hello to the bees."}],"max_tokens":32,"stream":true,"seed":7}'
echo
