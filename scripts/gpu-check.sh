#!/usr/bin/env bash
# CUDA checks on a GPU machine, in well under 5 minutes: the KV pool round
# trip, page copies each way, and page-copy bandwidth (host <-> GPU and
# between two pools on one GPU).
#
# The GPU machine needs no Rust toolchain: build the test binary beforehand
#   cargo test --release --features cuda --test kvpool --no-run
# and run this script from the repository root (or pass the binary's path).
# Without a CUDA driver the checks report "no CUDA driver" and skip.
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
timeout 300 "$bin" --nocapture --test-threads=1 cuda
