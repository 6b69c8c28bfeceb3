#!/usr/bin/env bash
# Outside the core (which scripts/check-core-structure.sh holds to 700),
# no Rust file under a crate's `src/` is over 800 lines: a file that
# grows past it is cut along its identities. Fails naming each culprit.
# `--self-test` plants an 801-line file in a scratch crate and requires it
# to be reported.
set -euo pipefail
cd "$(dirname "$0")/.."
max_lines=800
check() {
  local status=0 f n
  while IFS= read -r f; do
    n=$(wc -l <"$f")
    if [ "$n" -gt "$max_lines" ]; then
      echo "FAIL: $f has $n lines (the limit is $max_lines): cut it along its identities"
      status=1
    fi
  done < <(find "$@" -path '*/target' -prune -o -path '*/src/*' -name '*.rs' -print | sort)
  return $status
}
if [ "${1:-}" = "--self-test" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch/crates/long/src"
  for _ in $(seq 801); do echo '//'; done >"$scratch/crates/long/src/lib.rs"
  if out=$(check "$scratch/crates" 2>&1); then
    echo "FAIL: the self-test's 801-line file passed"
    exit 1
  fi
  grep -qF "crates/long/src/lib.rs has 801 lines" <<<"$out" || { echo "FAIL: not reported: $out"; exit 1; }
  echo "workspace structure self-test: an 801-line file is reported"
  exit 0
fi
check crates bench-peers loom-tests
echo "no Rust file under a crate's src/ outside the core is over $max_lines lines"
