#!/usr/bin/env bash
# The server under faults, probed as an operator would (loopback only,
# bounded: about a minute): 300 held connections under `ulimit -n 256`
# while /health and a completion are served; 300 clients that stop reading
# mid-stream (every connection slot working: /health within a second; the
# send timeout frees the stalled streams' admission slots, and a new
# completion is served), and that step's negative control (no send
# timeout: it must fail); hyper's own 400 and 431 with OpenAI-shaped
# bodies; a 99 GB Content-Length answered 413 before its body; a stop
# sequence that ends generation with exact usage; a KV-event subscriber
# across a SIGKILL restart that sees AllBlocksCleared first; every numeric
# flag of `radixkv serve` at its extremes (a usage error naming it, or a
# clean start and stop; never a panic). After each probe of a running
# server: nothing in flight or outstanding, nothing pinned, the audit ok
# (/stats).
#
#   bash scripts/fault-probe.sh
#
# Needs python3 (standard library only). scripts/test.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The whole workspace, as the test run builds it: a subset of its packages
# resolves their features differently and rebuilds most of the tree.
cargo build --release -q --workspace --bin radixkv --example subscribe
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
timeout 600 python3 scripts/fault_probe.py "$target_dir/release/radixkv" "$target_dir/release/examples/subscribe"
bash scripts/expect-failure.sh "fault_probe.py --only slow_readers --control (no send timeout)" \
  "^FAIL a new completion served once the send timeout" \
  timeout 600 python3 scripts/fault_probe.py "$target_dir/release/radixkv" "$target_dir/release/examples/subscribe" \
  --only slow_readers --control
