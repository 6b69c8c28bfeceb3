#!/usr/bin/env bash
# The negative control of tests/parked_writer.rs: rebuilt with
# RADIXKV_NEGATIVE=reader_never_waits, readers wait for a split's parent
# publication as they once did, so with a writer parked inside a split the
# test must fail, and with its own message. Exits 0 only if it does.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if RADIXKV_NEGATIVE=reader_never_waits cargo test -q --release -p radixkv --test parked_writer \
    --target-dir "${NEGATIVE_TARGET_DIR:-target/negative}" >"$log" 2>&1; then
  echo "FAIL: the parked-writer test passed with readers that wait (control reader_never_waits)"
  exit 1
fi
if grep -q "a reader did not finish while a writer was parked at Split" "$log"; then
  echo "parked-writer control (reader_never_waits): failed as required, with the test's own message"
else
  echo "FAIL: the control failed, but not with the test's message:"
  tail -n 30 "$log"
  exit 1
fi
