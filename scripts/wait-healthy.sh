#!/usr/bin/env bash
# Waits until a radixkv server started in the background answers
# GET BASE/health. Exits 0 then; exits 1, printing the server's log, if
# the process PID exits first or TRIES polls 50 ms apart (default 600)
# go unanswered. Used by the scripts that drive `radixkv serve`.
#
#   bash scripts/wait-healthy.sh BASE PID LOG [TRIES]
set -euo pipefail
base="$1" pid="$2" log="$3" tries="${4:-600}"
for _ in $(seq 1 "$tries"); do
  if curl -sf "$base/health" >/dev/null 2>&1; then exit 0; fi
  if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "radixkv serve exited"; exit 1; fi
  sleep 0.05
done
cat "$log"
echo "radixkv serve did not answer $base/health after $tries polls"
exit 1
