#!/usr/bin/env bash
# Opt-in (not run by CI): a data-parallel serving simulation on a real
# trace (scripts/dp_sim.py): ranks of SGLang 0.5.23's own RadixCache with
# finite pools, requests finishing over modelled time, dispatched by
# SGLang's round_robin, total_requests and total_tokens and by radixkv's
# DpRouter fed by the ranks' KV events, beside one cache holding every
# pool. Uses the venv of scripts/sglang-venv.sh. Arguments go to the
# simulation (--ranks 4 8, --requests N, --pool-frac F, --balance-rel R;
# another trace: a path first, with --format agentic for the agentic one;
# SGLang's generated-shared-prefix workload: gsp --format gsp);
# the default trace is the Mooncake conversation trace of ../shared/workloads.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
trace="$root/../shared/workloads/mooncake_conversation_trace.jsonl.zst"
if [ $# -gt 0 ] && { [ -f "$1" ] || [ "$1" = gsp ]; }; then
  trace="$1"
  shift
fi
if [ "$trace" != gsp ] && [ ! -f "$trace" ]; then
  echo "SKIPPED: no $trace (the trace this simulation reads)"
  exit 1
fi
# shellcheck source=scripts/sglang-venv.sh
source "$root/scripts/sglang-venv.sh"
"$venv/bin/python" "$root/scripts/dp_sim.py" "$trace" "$@"
