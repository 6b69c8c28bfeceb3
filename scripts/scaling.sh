#!/usr/bin/env bash
# The scaling phase of the peer bench (radixkv against Dynamo's CRTC at 1, 2,
# 4, 8 and 16 threads: routing queries and mixed 50/50 on W1 with 16 devices),
# for a host with 16 or more cores. Needs no Rust toolchain: it runs a
# prebuilt bench binary.
#
# Build the binary once where cargo is (any x86_64 Linux host):
#   cargo build --release --manifest-path bench-peers/Cargo.toml --target-dir target/peers
# copy target/peers/release/radixkv-peer-bench and this script to the big
# host, then run:
#   bash scaling.sh [BINARY] [OUT.json]
# BINARY defaults to target/peers/release/radixkv-peer-bench (or
# ./radixkv-peer-bench beside this script); OUT defaults to scaling.json.
# THREADS=1,2,4,8,16 and PROCESSES=3 (medians of fresh processes) override.
# QUICK=1 runs the CI-size workload (a smoke test on a small machine).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-}"
if [ -z "$bin" ]; then
  for c in "$here/../target/peers/release/radixkv-peer-bench" "$here/radixkv-peer-bench"; do
    if [ -x "$c" ]; then bin="$c"; break; fi
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "scaling.sh: no bench binary (pass its path; build it with" >&2
  echo "  cargo build --release --manifest-path bench-peers/Cargo.toml --target-dir target/peers)" >&2
  exit 2
fi
out="${2:-scaling.json}"
threads="${THREADS:-1,2,4,8,16}"
processes="${PROCESSES:-3}"
cores="$(nproc 2>/dev/null || echo 1)"
max="$(echo "$threads" | tr ',' '\n' | sort -n | tail -1)"
if [ "$cores" -lt "$max" ]; then
  echo "note: $cores cores for up to $max threads: the high thread counts share cores (figures are not a scaling result)"
fi
extra=()
if [ "${QUICK:-0}" = 1 ]; then extra+=(--quick); fi
"$bin" --scaling "$threads" --processes "$processes" --json "$out" "${extra[@]}"
echo "scaling figures (medians of $processes processes) in $out"
