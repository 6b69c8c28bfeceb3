#!/usr/bin/env bash
# Negative controls: for every loom model, remove exactly the step that
# protects it (RADIXKV_NEGATIVE_STEP=<step> when the model runs: a loom build
# of radixkv chooses the step at run time, src/negative.rs, so one build
# serves every control) and require the model to FAIL with its own assertion
# message. A model that cannot fail proves nothing. Exits non-zero unless
# every control fails its model that way.
set -uo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom --cfg crossbeam_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
target="${LOOM_TARGET_DIR:-target/loom}"
# The build the positive suite ran (RADIXKV_NEGATIVE empty, as scripts/test.sh
# sets it: radixkv's build script reruns when that variable changes).
export RADIXKV_NEGATIVE=
if ! cargo build -q -p loom-tests --release --target-dir "$target" --tests; then
  echo "FAIL: the loom models do not build"
  exit 1
fi

# the models' file | model | control step | the model's own assertion message it must fail with
# (alternatives separated by ";;": a model with two assertions on the same
# invariant may trip either first) [| the preemption bound it needs, when
# more than the default]. A panic with any other message, a build failure
# or an unwrap does not count as failing "as required".
pairs=(
  "pins_and_eviction|match_vs_evict|evict_pin_check|value 10 was evicted while a lease on it was live"
  "structure|insert_below_a_leaf_being_evicted|leaf_check|I1: node 3 is resident on device 0 but its parent 2 is not"
  "structure|split_vs_pin_counts|split_moves_no_pin|I6: device 0 has 1 live leases but 2 pins"
  "structure|split_vs_reader|reader_parent_check|the whole key stayed cached"
  "structure|two_inserts_of_one_new_prefix|attach_recheck|exactly one insert must own it"
  "structure|unlink_vs_adopting_insert|unlink_check|the insert must not be lost"
  "structure|replaced_image_outlives_its_reader|defer_destroy|use after free: a reader still holds an image that was freed"
  "pins_and_eviction|residency_aba|pin_then_read|a lease returned values of an older residency"
  "structure|split_vs_evict|split_recheck|radixkv audit failed: node gauge is 2, the tree has 1"
  "pins_and_eviction|lease_drop_vs_pin_and_evict|unpin_rmw|I6: device 0 has 1 live leases but 2 pins"
  "structure|two_tiers_evict_below_one_parent|parent_lock|no node may survive without residency"
  "pins_and_eviction|pinned_insert_vs_evict|born_pinned|the committed chunk must stay the request's"
  "structure|split_vs_reader_at_page_size_two|reader_parent_check|the whole key stayed cached (page size 2)"
  "structure|two_inserts_below_a_table_that_grows|attach_recheck|under a wide node: exactly one insert must own it"
  "structure|two_inserts_below_a_table_that_grows|table_retire|use after free: a reader still holds a children table that was freed"
  "allocator|two_claimers_and_a_free|claim_cas|a page was handed to two spans;;is both held and free"
  "pins_and_eviction|pin_vs_evictor_candidates|evict_pin_check|was freed while a lease on it was live"
  "namespaces|namespace_root_reclaimed_vs_insert|root_obsolete_check|the insert into a reclaimed namespace must not be lost"
  "copies|copy_vs_evict_source|copy_source_pin|was freed mid-copy"
  "copies|copy_completion_vs_insert_on_dest|copy_frees_dups|the duplicate pages of device 1 must go back;;I2: device 1"
  "copies|write_back_vs_evict|copy_source_pin|the write-back read page"
  "events|store_event_vs_evict|event_in_lock|a removal came before its store"
  "events|split_event_vs_evict|split_event_in_lock|a removal's pages differ from what the node's store and splits left"
  "pins_and_eviction|policy_switch_vs_insert|switch_rescans|a leaf inserted during a switch to a heap policy must be a candidate"
  "structure|table_removal_vs_reader_behind_it|table_tomb|a child filed behind a removed one must stay findable"
  "structure|split_below_a_table_vs_reader|reader_parent_check|the whole key stayed cached (below a table)"
  "structure|split_vs_deepening_insert|split_rereads_deepest|I8: node"
  "structure|split_vs_deepening_insert|split_raises_ancestors|I8: node|3"
)

failed_as_expected=0
held=0
for pair in "${pairs[@]}"; do
  IFS='|' read -r file model step want bound <<<"$pair"
  log=$(mktemp)
  LOOM_MAX_PREEMPTIONS="${bound:-$LOOM_MAX_PREEMPTIONS}" RADIXKV_NEGATIVE_STEP="$step" cargo test -q -p loom-tests --release --target-dir "$target" \
    --test "$file" -- --exact "$model" >"$log" 2>&1
  rc=$?
  # The model's own assertion: the first panic message that is not loom's.
  why=$(grep -A1 "panicked at" "$log" | grep -v "panicked at\|^--\|loom-0\|scheduler" | head -n 1)
  patterns=()
  while IFS= read -r alt; do
    [ -n "$alt" ] && patterns+=(-e "$alt")
  done <<<"${want//;;/$'\n'}"
  if [ $rc -ne 0 ] && grep -qF "${patterns[@]}" "$log"; then
    printf 'FAILS as required  %-40s without %-20s: %s\n' "$model" "$step" "$why"
    failed_as_expected=$((failed_as_expected + 1))
  elif [ $rc -ne 0 ]; then
    printf 'FAILS, WRONG WHY   %-36s without %-20s: wanted "%s", got: %s\n' "$model" "$step" "$want" "$why"
    tail -n 20 "$log"
    held=$((held + 1))
  else
    printf 'STILL PASSES (bad) %-36s without %-20s (exit %s)\n' "$model" "$step" "$rc"
    tail -n 20 "$log"
    held=$((held + 1))
  fi
  rm -f "$log"
done
echo "negative controls: ${failed_as_expected} failed as required, ${held} did not"
[ "$held" -eq 0 ]
