#!/usr/bin/env bash
# CUDA checks on a GPU machine, in well under 5 minutes: the GPU and pinned
# host KV pools' round trips, run copies each way (one memcpy per run,
# layer and K/V; pageable and pinned host <-> GPU, GPU <-> GPU, checked
# against the same copies between host pools), and copy bandwidth: pageable
# and pinned host -> GPU, GPU -> pinned host, GPU -> GPU between two pools
# on one GPU, GPU 0 <-> GPU 1 when there are two GPUs (else a line saying
# peer bandwidth is unmeasured), and one memcpy per page for contrast; then
# the tiny transformer's reuse proof with its KV pools in GPU memory and
# its host tier in pinned memory (prefix reuse through the cache, page
# sizes 1 and 16, evictions, two devices, KV copied between devices and
# loaded from the host tier: logits match a dense reference).
#
# The GPU machine needs no Rust toolchain: build the test binaries beforehand
#   cargo test --release -p radixkv-models --features cuda --test kvpool --test tiny --no-run
# and run this script from the repository root (or pass the binaries' paths:
# kvpool's, then tiny's). The GPU tests are `#[ignore]`d in a plain
# `cargo test` (they need a driver and fail without one); this script runs
# them with --include-ignored. Without a CUDA driver it checks nothing,
# prints a SKIPPED line and exits 77 (the "skipped" status of automake and
# TAP), never 0.
set -euo pipefail
cd "$(dirname "$0")/.."
# test_binary NAME [PATH]: PATH, or the newest built binary of test NAME;
# exits with a build hint when there is none.
test_binary() {
  local b="${2:-}"
  if [ -z "$b" ]; then
    b=$(ls -t target/release/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | head -n 1 || true)
  fi
  if [ -z "$b" ] || [ ! -x "$b" ]; then
    echo "gpu-check: no $1 test binary; build it with: cargo test --release -p radixkv-models --features cuda --test $1 --no-run" >&2
    exit 2
  fi
  echo "$b"
}
bin=$(test_binary kvpool "${1:-}")
tiny=$(test_binary tiny "${2:-}")
# The driver, as the dynamic loader would find it (cudarc loads libcuda.so).
driver=no
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then
  driver=yes
fi
IFS=: read -r -a libdirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${libdirs[@]}"; do
  if [ -n "$d" ] && compgen -G "$d/libcuda.so*" >/dev/null; then driver=yes; fi
done
if [ "$driver" = no ]; then
  echo "SKIPPED: no CUDA driver (libcuda.so not found): no GPU check ran"
  exit 77
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "(nvidia-smi not available)"
if ! "$tiny" --list 2>/dev/null | grep -q '^cuda::'; then
  echo "gpu-check: $tiny was built without --features cuda; rebuild: cargo test --release -p radixkv-models --features cuda --test tiny --no-run" >&2
  exit 2
fi
timeout 120 "$bin" --include-ignored --nocapture --test-threads=1 cuda
timeout 150 "$tiny" --include-ignored --nocapture --test-threads=1 cuda
