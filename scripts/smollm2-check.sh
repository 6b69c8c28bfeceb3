#!/usr/bin/env bash
# SmolLM2-135M-Instruct behind `radixkv serve --model gguf:PATH`, driven by
# the official `openai` client (scripts/smollm2_check.py): real text, eos
# and stop strings honoured, greedy continuations that part from
# llama.cpp's (crates/radixkv-models/tests/data/smollm2-llama-cpp.json)
# only where its top-2 margin is below 0.5 (how much is equal before each
# first near tie, margin 0.05, is printed), streaming equal to the whole answer, seeded sampling
# reproducible, a multi-turn chat whose cached tokens grow turn by turn,
# and the bad inputs answered 400. The client comes from
# scripts/client-venv.sh's venv. RADIXKV_BIN: a built binary
# (default: build one); RADIXKV_SMOLLM2: the GGUF (default: fetched).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/client-venv.sh
source scripts/client-venv.sh
venv=$client_venv

bin="${RADIXKV_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --quiet -p radixkv-cli
  bin=target/release/radixkv
fi
model="${RADIXKV_SMOLLM2:-$(bash scripts/fetch-smollm2.sh)}"

port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log=$(mktemp)
"$bin" serve --port "$port" --model "gguf:$model" >"$log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
bash scripts/wait-healthy.sh "http://127.0.0.1:$port" "$pid" "$log"
"$venv/bin/python" scripts/smollm2_check.py "http://127.0.0.1:$port" \
  crates/radixkv-models/tests/data/smollm2-llama-cpp.json
