#!/usr/bin/env bash
# A bounded load run against `radixkv serve`, loopback only: starts the
# server on 127.0.0.1 with an ephemeral port, runs the load generator
# (crates/radixkv-server/examples/load.rs: requests/s, latency percentiles, cached share, then
# /stats with audit_ok), stops the server with SIGTERM and checks that it
# drained and exited 0.
#
#   scripts/load.sh                      # defaults below
#   LOAD_ARGS="--concurrency 64 --requests 5000" scripts/load.sh
#   SERVE_ARGS="--devices 8 --speedup 100" scripts/load.sh
#   RADIXKV_BIN=/tmp/old/target/release/radixkv scripts/load.sh   # another build
#
# Extra flags: SERVE_ARGS for `radixkv serve`, LOAD_ARGS for the generator
# (--concurrency, --requests, --max-seconds, --groups, --system-bytes,
# --max-tokens, --stream-every). Bounded: at most --requests requests and
# --max-seconds seconds (defaults 2,000 and 30).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p radixkv-cli --bin radixkv -p radixkv-server --example load
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
# RADIXKV_BIN: another build of `radixkv` to serve (an earlier revision, for
# a before/after comparison with the same load generator).
bin="${RADIXKV_BIN:-$target_dir/release/radixkv}"
load="$target_dir/release/examples/load"

log="$(mktemp)"
# shellcheck disable=SC2086
"$bin" serve --host 127.0.0.1 --port 0 --devices 4 --pages-per-device 4096 ${SERVE_ARGS:-} >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT

url=""
for _ in $(seq 1 100); do
  url="$(sed -n 's/.*listening on \(http:\/\/[^ ]*\).*/\1/p' "$log" | head -n 1)"
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "load.sh: the server did not start" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$log"; echo "load.sh: no address from the server" >&2; exit 1; }
echo "== radixkv serve at $url"

status=0
# shellcheck disable=SC2086
"$load" --url "$url" ${LOAD_ARGS:-} || status=$?

echo "== SIGTERM"
kill -TERM "$pid"
server_status=0
wait "$pid" || server_status=$?
cat "$log"
trap 'rm -f "$log"' EXIT
if [ "$server_status" -ne 0 ]; then
  echo "load.sh: the server exited with $server_status" >&2
  exit 1
fi
exit "$status"
