#!/usr/bin/env bash
# Outside the core (which scripts/check-core-structure.sh holds to 700),
# no Rust file under a crate's `src/` is over 800 lines: a file that
# grows past it is cut along its identities. In every crate, the core
# included, no files import each other in a circle
# (scripts/import_circles.py says what counts as an import). Fails naming
# each culprit. `--self-test` plants an 801-line file and a circle of two
# files in scratch crates and requires both to be reported, and requires a
# folder using its own children (and a test module's `use super::*`) not
# to be.
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
# Every crate's folder: the core (.), crates/*, their nested crates, the
# peer bench and the loom models.
crate_dirs() {
  find "$@" -path '*/target' -prune -o -name Cargo.toml -print | while IFS= read -r toml; do
    d=$(dirname "$toml")
    [ -d "$d/src" ] && echo "$d"
  done | sort
}
circles() {
  local dirs
  mapfile -t dirs < <(crate_dirs "$@")
  python3 "$(dirname "$0")/import_circles.py" "${dirs[@]}"
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
  # A folder using its children, children using their parent, a test
  # module's `use super::*`: no circle.
  c="$scratch/circle"
  mkdir -p "$c/src/room"
  echo '[package]' >"$c/Cargo.toml"
  printf 'mod a;\nmod b;\nmod room;\npub struct Root;\n' >"$c/src/lib.rs"
  printf 'mod inner;\nuse inner::Inner;\npub struct Room(Inner);\n' >"$c/src/room/mod.rs"
  printf 'use super::Room;\npub struct Inner;\nfn f(_: &Room) {}\n' >"$c/src/room/inner.rs"
  printf 'use crate::Root;\npub struct A;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n' >"$c/src/a.rs"
  printf 'use crate::a::A;\n// use crate::c::C; (a comment is not an import)\npub struct B(A);\n' >"$c/src/b.rs"
  if ! out=$(circles "$c" 2>&1); then
    echo "FAIL: the self-test's crate without a circle was reported: $out"
    exit 1
  fi
  # Now a.rs takes B from b.rs, which takes A from a.rs: a circle.
  printf 'use crate::b::B;\npub struct A;\nfn g(_: B) {}\n' >"$c/src/a.rs"
  if out=$(circles "$c" 2>&1); then
    echo "FAIL: the self-test's circle (a.rs <-> b.rs) passed"
    exit 1
  fi
  grep -qF "src/a.rs -> $c/src/b.rs (B)" <<<"$out" || { echo "FAIL: the circle was not reported as a.rs -> b.rs: $out"; exit 1; }
  echo "workspace structure self-test: an 801-line file and a circle of two files are reported; a folder using its own children is not a circle"
  exit 0
fi
status=0
check crates bench-peers loom-tests || status=1
circles . || status=1
[ "$status" -eq 0 ] || exit 1
echo "no Rust file under a crate's src/ outside the core is over $max_lines lines; no crate's files import each other in a circle"
