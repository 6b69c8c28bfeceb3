#!/usr/bin/env bash
# CUDA checks on a GPU machine, in well under 5 minutes: the KV pool round
# trip, page copies each way, and page-copy bandwidth (host <-> GPU and
# between two pools on one GPU); then the tiny transformer's reuse proof
# with its KV pools in GPU memory (prefix reuse through the cache, page
# sizes 1 and 16, evictions, two devices: logits match a dense reference).
#
# The GPU machine needs no Rust toolchain: build the test binaries beforehand
#   cargo test --release --features cuda --test kvpool --test tiny --no-run
# and run this script from the repository root (or pass the binaries' paths:
# kvpool's, then tiny's). Without a CUDA driver the checks report "no CUDA
# driver" and skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-}"
if [ -z "$bin" ]; then
  bin=$(ls -t target/release/deps/kvpool-* 2>/dev/null | grep -v '\.d$' | head -n 1 || true)
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "gpu-check: no test binary; build it with: cargo test --release --features cuda --test kvpool --no-run" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "(nvidia-smi not available)"
tiny="${2:-}"
if [ -z "$tiny" ]; then
  tiny=$(ls -t target/release/deps/tiny-* 2>/dev/null | grep -v '\.d$' | head -n 1 || true)
fi
if [ -z "$tiny" ] || [ ! -x "$tiny" ]; then
  echo "gpu-check: no tiny test binary; build it with: cargo test --release --features cuda --test tiny --no-run" >&2
  exit 2
fi
if ! "$tiny" --list 2>/dev/null | grep -q '^cuda::'; then
  echo "gpu-check: $tiny was built without --features cuda; rebuild: cargo test --release --features cuda --test tiny --no-run" >&2
  exit 2
fi
timeout 180 "$bin" --nocapture --test-threads=1 cuda
timeout 100 "$tiny" --nocapture --test-threads=1 cuda
