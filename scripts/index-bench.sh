#!/usr/bin/env bash
# Opt-in: `radixkv index` against NVIDIA Dynamo's standalone indexer
# (ai-dynamo-runtime 1.6.1), one run, the same event streams and queries
# (crates/radixkv-index-service/examples/index_bench/): the Mooncake
# conversation trace and the agentic trace from ../shared/workloads spread
# over 8 workers x 2 ranks; ingestion (events/s), RSS growth per
# holder-block, answers against the streams' truth, /query p50/p99 and
# queries/s from 1 and 8 clients. Extra arguments go to the benchmark
# (e.g. --requests 3000 --seconds 5). Writes target/index-bench.json.
set -euo pipefail
cd "$(dirname "$0")/.."
workloads=../shared/workloads
if [ ! -d "$workloads" ]; then
  echo "SKIPPED: no $workloads (the traces this benchmark reads)"
  exit 1
fi
# shellcheck source=scripts/client-venv.sh
source scripts/client-venv.sh
dyn=$client_venv
cargo build --release --quiet -p radixkv-cli
cargo build --release --quiet -p radixkv-index-service --example index_bench
target/release/examples/index_bench --radixkv target/release/radixkv --dynamo-python "$dyn/bin/python" \
  --trace "$workloads/mooncake_conversation_trace.jsonl.zst" \
  --trace "$workloads/cc_agentic_conversations.jsonl.zst" \
  --out target/index-bench.json "$@"
