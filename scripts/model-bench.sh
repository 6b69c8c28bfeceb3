#!/usr/bin/env bash
# What SmolLM2-135M costs and what the cache saves on this CPU (opt-in; the
# figures in BENCHMARKS.md "A real model" come from it):
#   1. prefill and decode tokens/s of radixkv's paged model
#      (examples/gguf_speed.rs) beside llama.cpp (scripts/llama_reference.py
#      --speed-only) on the same 1,500 tokens and thread count, ROUNDS
#      rounds alternating (default 3), medians and their ratio;
#   2. through `radixkv serve --model gguf:PATH`: the TTFT of a chat whose
#      ~1,500-token system prompt and history are cached against the same
#      chat cold, and a multi-turn chat's cached tokens and TTFT turn by
#      turn (scripts/model_bench.py, the openai client's venv);
#   3. `radixkv replay --model gguf:PATH` on a gsp-like and a chat workload
#      sized for 2 cores: with reuse, with --copy none and with
#      --no-prefix-sharing (no cache); and gsp under round-robin routing,
#      where a group's prompts reach both devices, with and without copies.
#
#   bash scripts/model-bench.sh [OUT_DIR]      (default target/model-bench)
#
# PARTS (default "1 2 3") picks the parts to run.
# Needs llama-cpp-python's venv (scripts/llama-reference.sh builds it) and
# about 10 minutes. THREADS (default 2) is both runtimes' thread count.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/model-bench}"
mkdir -p "$out"
threads="${THREADS:-2}"
rounds="${ROUNDS:-3}"
cache="${RADIXKV_CACHE:-$HOME/.cache/radixkv}"
llama_py="$cache/llama-venv/bin/python"
if [ ! -x "$llama_py" ]; then
  echo "model-bench: no llama.cpp venv at $cache/llama-venv: run bash scripts/llama-reference.sh first" >&2
  exit 1
fi
model="${RADIXKV_SMOLLM2:-$(bash scripts/fetch-smollm2.sh)}"
cargo build --release --quiet -p radixkv-cli
cargo build --release --quiet -p radixkv-models --features gguf --example gguf_speed
bin=target/release/radixkv
text="$out/library.txt"
"$llama_py" -c 'import sys; sys.path.insert(0, "scripts"); import llama_reference as r; print(r.LIBRARY * 24, end="")' >"$text"
parts="${PARTS:-1 2 3}"

if [[ " $parts " == *" 1 "* ]]; then
echo "== 1. speed: radixkv vs llama.cpp, 1,500 tokens, $threads threads, $rounds rounds"
: >"$out/speed.jsonl"
for i in $(seq 1 "$rounds"); do
  r=$(RAYON_NUM_THREADS="$threads" PROMPT_TOKENS=1500 target/release/examples/gguf_speed "$model" --text "$text")
  l=$("$llama_py" scripts/llama_reference.py --model "$model" --threads "$threads" --speed-only "$text" --tokens 1500)
  echo "round $i: radixkv $r; llama.cpp $l"
  echo "{\"radixkv\": $r, \"llama_cpp\": $l}" >>"$out/speed.jsonl"
done
python3 - "$out/speed.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for k in ("prefill_tokens_per_s", "decode_tokens_per_s"):
    a = statistics.median(r["radixkv"][k] for r in rows)
    b = statistics.median(r["llama_cpp"][k] for r in rows)
    print(f"{k}: radixkv {a:.1f}, llama.cpp {b:.1f}, ratio {a / b:.2f}")
EOF
fi

if [[ " $parts " == *" 2 "* ]]; then
echo "== 2. the server: cached vs cold TTFT, a multi-turn chat"
# shellcheck source=scripts/client-venv.sh
source scripts/client-venv.sh
venv=$client_venv
port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$out/serve.log"
"$bin" serve --port "$port" --model "gguf:$model" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
bash scripts/wait-healthy.sh "http://127.0.0.1:$port" "$pid" "$log"
"$venv/bin/python" scripts/model_bench.py "http://127.0.0.1:$port" "$text" | tee "$out/server.txt"
kill "$pid"; wait "$pid" 2>/dev/null || true; trap - EXIT
fi

if [[ " $parts " == *" 3 "* ]]; then
echo "== 3. replay: reuse, --copy none, no prefix cache"
run() {
  local name="$1"; shift
  "$bin" replay --model "gguf:$model" --quiet --json "$out/replay-$name.json" "$@" >/dev/null
  python3 - "$out/replay-$name.json" "$name" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:<16} finished {s['finished']}, prefill computed {s['prefill_tokens_computed']}, "
      f"saved {s['prefill_tokens_saved']} (host {s['tokens_host_loaded']}, peer {s['tokens_peer_copied']}), "
      f"TTFT p50/p90/p99 ms {s['ttft_p50_ms']:.0f}/{s['ttft_p90_ms']:.0f}/{s['ttft_p99_ms']:.0f}, "
      f"wall {s['wall_s']:.1f} s")
EOF
}
chat=(--workload chat --chat-conversations 12 --chat-turns 4 --chat-system 256 --chat-user 32 --output-len 16 --chat-think-s 2)
run gsp
run gsp-copy-none --copy none
run gsp-no-cache --no-prefix-sharing
run chat "${chat[@]}"
run chat-copy-none "${chat[@]}" --copy none
run chat-no-cache "${chat[@]}" --no-prefix-sharing
run gsp-round-robin --router round-robin
run gsp-round-robin-copy-none --router round-robin --copy none
fi
