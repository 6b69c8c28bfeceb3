#!/usr/bin/env bash
# Opt-in (not run by CI): latency of SGLang 0.5.23's prefix-cache calls,
# `match_prefix` and `insert`, on radixkv's backend, on SGLang's default
# UnifiedRadixCache and on its RadixCache, in one Python process on the
# same operation traces (crates/radixkv-py/bench/sglang_bench.py says
# which), then match throughput of 1, 2 and 4 threads sharing one cache.
# Uses the venv of scripts/sglang-venv.sh. Arguments go to the bench
# (--mooncake-requests N, --trace PATH, --repeats N, --out PATH); results
# are printed and written as JSON (default target/sglang-bench.json).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# shellcheck source=scripts/sglang-venv.sh
source "$root/scripts/sglang-venv.sh"
out="$root/target/sglang-bench.json"
"$venv/bin/python" "$root/crates/radixkv-py/bench/sglang_bench.py" --out "$out" "$@"
