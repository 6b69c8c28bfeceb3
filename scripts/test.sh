#!/usr/bin/env bash
# Every test radixkv has, in one command (what CI runs after fmt and clippy):
# unit, integration and property tests; doctests; the loom model suite; and
# the loom negative controls (each model must fail without its protecting
# step). Long modes are opt-in through environment variables:
#   RADIXKV_STRESS_OPS=N       ops per stress thread (default 25,000)
#   RADIXKV_PROPTEST_CASES=N   property-test cases (default 384)
#   RADIXKV_SOAK_SECS=N        soak duration (default 10)
#   LOOM_MAX_PREEMPTIONS=N     loom preemption bound (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit, integration, property and stress tests"
cargo test --workspace --release --lib --bins --tests --examples

echo "== benchmarks compile (running them is opt-in: see BENCHMARKS.md)"
cargo build --workspace --release --benches

echo "== doctests"
cargo test --workspace --doc

echo "== --features cuda (cudarc loaded at run time: builds without a toolkit; GPU checks skip without a driver)"
cargo build --release --features cuda
cargo test --release --features cuda --test kvpool --test tiny

echo "== loom models (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3})"
RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
  RADIXKV_NEGATIVE= cargo test -p loom-tests --release --target-dir target/loom

echo "== loom negative controls"
bash loom-tests/negative.sh
