#!/usr/bin/env bash
# The independent reference for radixkv's SmolLM2 path (opt-in; not in the
# test command): llama.cpp, through llama-cpp-python 0.3.36 built from
# source in its own venv, runs a fixed prompt set on the same GGUF and
# writes, per prompt, its tokens (tokenize with special=True), the argmax,
# top-5 and top-2 margin of every position's next-token logits, and a
# greedy continuation of 32 tokens; and its prefill and decode speed on
# this CPU with the same thread count. The JSON is committed as test data
# (crates/radixkv-models/tests/data/smollm2-llama-cpp.json), and
# crates/radixkv-models/tests/llama_cpp.rs checks radixkv against it.
#
#   bash scripts/llama-reference.sh [OUT.json]
#   bash scripts/llama-reference.sh --against-flash-attn
#
# The second form writes nothing: it prints how far llama.cpp itself moves
# from the committed reference with flash attention on (one change of
# summation order), by the measures tests/llama_cpp.rs applies to radixkv.
#
# The first run builds llama.cpp (CMake through pip, several minutes on 2
# cores; the venv is cached in $RADIXKV_CACHE/llama-venv, default
# ~/.cache/radixkv). THREADS (default 2) sets llama.cpp's threads.
set -euo pipefail
cd "$(dirname "$0")/.."
reference=crates/radixkv-models/tests/data/smollm2-llama-cpp.json
out="${1:-$reference}"
cache="${RADIXKV_CACHE:-$HOME/.cache/radixkv}"
venv="$cache/llama-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
  echo "llama-reference: building llama-cpp-python 0.3.36 in $venv (minutes)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install --quiet "llama-cpp-python==0.3.36" >&2
fi
model="${RADIXKV_SMOLLM2:-$(bash scripts/fetch-smollm2.sh)}"
if [ "$out" = --against-flash-attn ]; then
  exec "$venv/bin/python" scripts/llama_reference.py --model "$model" --threads "${THREADS:-2}" \
    --against-flash-attn "$reference"
fi
"$venv/bin/python" scripts/llama_reference.py --model "$model" --out "$out" --threads "${THREADS:-2}"
