#!/usr/bin/env bash
# `radixkv index` against real producers and against NVIDIA Dynamo's
# standalone indexer on the same streams (scripts/index_check.py): SGLang
# 0.5.23 worker processes (its own RadixCache and ZmqEventPublisher, page
# sizes 1 and 16, evictions) and `radixkv serve --kv-events` with two
# devices, driven by a trace; every prompt's score per (worker, rank) must
# equal the worker's own match, and Dynamo's answer too; then a SIGKILL
# restart of a worker rank and a batch dropped on the wire (with replay:
# no mismatch; the negative control without replay: mismatches).
# SGLang runs in scripts/sglang-venv.sh's venv, Dynamo's indexer in
# scripts/client-venv.sh's (ai-dynamo-runtime 1.6.1). Without
# python3.11 it prints SKIPPED and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# shellcheck source=scripts/sglang-venv.sh
source "$root/scripts/sglang-venv.sh"

# shellcheck source=scripts/client-venv.sh
source "$root/scripts/client-venv.sh"

bin="${RADIXKV_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --quiet -p radixkv-cli
  bin=target/release/radixkv
fi

"$venv/bin/python" "$root/scripts/index_check.py" --radixkv "$(realpath "$bin")" --dynamo-python "$client_venv/bin/python"
