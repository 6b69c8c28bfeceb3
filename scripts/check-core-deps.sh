#!/usr/bin/env bash
# The core crate an engine embeds stays light: `radixkv`'s normal
# dependencies (default features) must be at most 30 distinct crates and
# none of the application's heavy ones. Fails, naming the culprit, if one
# comes back.
set -euo pipefail
cd "$(dirname "$0")/.."

max=30
forbidden="tokio axum hyper candle-core tokenizers zip clap indicatif ruzstd serde_json ctrlc"
crates="$(cargo tree -p radixkv -e normal --prefix none --offline 2>/dev/null || cargo tree -p radixkv -e normal --prefix none)"
names="$(printf '%s\n' "$crates" | sed 's/ (\*)//; s/ (proc-macro)//' | sort -u)"
count="$(printf '%s\n' "$names" | grep -c .)"
echo "radixkv (core) normal dependencies: $count distinct crates, itself included (limit $max)"
status=0
if [ "$count" -gt "$max" ]; then
  echo "FAIL: more than $max crates:"
  printf '%s\n' "$names"
  status=1
fi
for f in $forbidden; do
  if printf '%s\n' "$names" | awk '{print $1}' | grep -qx "$f"; then
    echo "FAIL: the core depends on $f"
    status=1
  fi
done
exit "$status"
