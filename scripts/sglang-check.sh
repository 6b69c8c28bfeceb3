#!/usr/bin/env bash
# radixkv against SGLang 0.5.23's own code, on the CPU: the Python package
# (crates/radixkv-py) and SGLang's `RadixCache` side by side in the venv
# scripts/sglang-venv.sh makes (cached outside the repository; about 3 GB
# on the first run), the wheel rebuilt every run. Then, each under
# crates/radixkv-py/tests/sglang/:
#   - tree_vs_sglang.py: random operation sequences on radixkv's tree and
#     SGLang's RadixCache, every result compared (7 policies, 4 page sizes),
#     and tlru the same way against SGLang's UnifiedRadixCache;
#   - backend_vs_sglang.py: radixkv.sglang.RadixKVCache and SGLang's
#     RadixCache each driven as SGLang's scheduler drives them (real
#     ReqToTokenPool and allocators; admissions, chunked prefill, decode,
#     finish, abort, evictions, SchedulePolicy ordering), free lists, rows,
#     sizes and KV events compared after every step;
#   - chaos_vs_sglang.py: random scheduler call sequences beside SGLang's
#     RadixCache with what the differential never does (aborts at every
#     point, retraction, checkpoints at any up_to, resets in flight,
#     evictions past the evictable size, locks on held nodes, two Python
#     threads), the slot accounting checked after every step;
#   - plugin_check.py: SGLang's load_plugins() and create_tree_cache build
#     the backend (also as create_simulated builds SGLang's: no pools, the
#     LoRA name table None), and refuse what it does not support;
#   - tensor_inputs.py: ids and values from torch tensors of every kind
#     read as a list reads them, bad ones refused by name;
#   - conformance.py: the shared conformance vectors through the Python API
#     and through the backend;
#   - dp_dispatch.py: radixkv's cache-aware DP dispatch installed by
#     load_plugins() on SGLang's own DataParallelController, ranks of
#     SGLang's RadixCache, then of radixkv's backend, publishing through
#     SGLang's publisher: every
#     decision equal to an oracle from the ranks' caches and loads;
#     routed_dp_rank, a restarted rank, a lost batch (total_tokens until
#     the rank clears), events off refused; its negative control (a router
#     that forgets what it sent) must spread a burst; again on SGLang's
#     caches with keep_prefix_tokens set (decisions that keep a long
#     prefix on a loaded rank among them); decisions made by the ranks'
#     recent writes (the plug-in's new_prefix="least_written") among them;
#   - negative controls, each of which must report a difference:
#     RADIXKV_DIFF_FAULT=priority (radixkv drops the insert priority),
#     =hits (radixkv counts hits on match), =slru (radixkv's slru without
#     the threshold), =tlru (radixkv's tlru without its threshold),
#     =free_order (the backend frees an eviction in one call, not one per
#     node), =old_checkpoint (the backend's checkpoint as
#     c5b5d3e had it: an up_to below the protected length lowered it),
#     and for dp_dispatch.py =least_loaded (the dispatcher's router places
#     new prompts by load, not by recent writes).
# Without python3.11 (SGLang 0.5.23's wheel is cp311) it prints SKIPPED and
# fails, so the check is never reported done when it was not.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
here="$root/crates/radixkv-py/tests/sglang"

# shellcheck source=scripts/sglang-venv.sh
source "$root/scripts/sglang-venv.sh"

cd "$cache"
"$venv/bin/python" -c 'import radixkv, sglang, torch; print("radixkv", radixkv.__version__, "| sglang", sglang.__version__, "| torch", torch.__version__)'

echo "-- radixkv's tree against SGLang's RadixCache (tree_vs_sglang.py)"
"$venv/bin/python" "$here/tree_vs_sglang.py"

echo "-- radixkv's SGLang backend against SGLang's RadixCache, request by request (backend_vs_sglang.py)"
"$venv/bin/python" "$here/backend_vs_sglang.py"

echo "-- chaos beside SGLang's RadixCache: aborts at every point, retraction, any checkpoint, resets in flight, two threads; every slot accounted for after every step (chaos_vs_sglang.py)"
"$venv/bin/python" "$here/chaos_vs_sglang.py"

echo "-- token ids and values from torch tensors (tensor_inputs.py)"
"$venv/bin/python" "$here/tensor_inputs.py"

echo "-- SGLang loads, builds and refuses the backend through its own path (plugin_check.py)"
"$venv/bin/python" "$here/plugin_check.py"

echo "-- the shared conformance vectors through the Python API and the backend (conformance.py)"
"$venv/bin/python" "$here/conformance.py"

echo "-- radixkv's DP dispatch inside SGLang's DataParallelController (dp_dispatch.py)"
"$venv/bin/python" "$here/dp_dispatch.py"
echo "-- the same with RADIXKV_DP_OPTIONS' keep_prefix_tokens (a loaded rank keeps a long prefix)"
RADIXKV_DP_CHECK_OPTIONS='{"keep_prefix_tokens": 64}' "$venv/bin/python" "$here/dp_dispatch.py"

echo "-- negative controls: each must report a difference"
# control SCRIPT FAULT ARGS...: SCRIPT run with RADIXKV_DIFF_FAULT=FAULT
# must fail with a reported difference.
control() {
  local script=$1 fault=$2
  shift 2
  bash "$root/scripts/expect-failure.sh" "$script RADIXKV_DIFF_FAULT=$fault" "^DIFFERENT:" \
    env RADIXKV_DIFF_FAULT="$fault" "$venv/bin/python" "$here/$script" "$@"
}
# radixkv's tree without insert priorities.
control tree_vs_sglang.py priority --policies priority
# radixkv's tree counting hits on match (its default rule).
control tree_vs_sglang.py hits --policies lfu,slru
# radixkv's slru without SGLang 0.5.23's threshold.
control tree_vs_sglang.py slru --policies slru
# radixkv's tlru without its threshold (lru's order).
control tree_vs_sglang.py tlru --policies tlru
# A backend that frees an eviction's slots in one call, not one per node.
control backend_vs_sglang.py free_order --policies lru --page-sizes 2,4
# The checkpoint of c5b5d3e, which lowered the protected length.
control chaos_vs_sglang.py old_checkpoint --policies lru --page-sizes 1,4
# A DP dispatcher that places new prompts by load, not by recent writes.
control dp_dispatch.py least_loaded
