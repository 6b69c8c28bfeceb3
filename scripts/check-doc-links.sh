#!/usr/bin/env bash
# Every relative link in the repository's Markdown files resolves to a file
# or folder inside the repository (links to the web are not checked).
# `--self-test` plants a broken link and a link out of the repository in a
# scratch copy of one file and requires both to be reported.
set -euo pipefail
cd "$(dirname "$0")/.."
check() {
  python3 - "$@" <<'PY'
import os, re, sys
root = os.path.realpath(".")
bad = 0
for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    # Fenced code blocks are examples, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        full = os.path.realpath(os.path.join(os.path.dirname(path), target))
        if not full.startswith(root + os.sep) and full != root:
            print(f"{path}: {target} points outside the repository")
            bad += 1
        elif not os.path.exists(full):
            print(f"{path}: {target} does not exist")
            bad += 1
sys.exit(1 if bad else 0)
PY
}
if [ "${1:-}" = "--self-test" ]; then
  scratch=docs/.link-self-test.md
  trap 'rm -f "$scratch"' EXIT
  printf '[gone](no-such-file.md) and [out](../../outside.md)\n' >"$scratch"
  if out=$(check "$scratch"); then
    echo "FAIL: the link check passed a file with two bad links"
    exit 1
  fi
  if [ "$(printf '%s\n' "$out" | grep -c .)" -ne 2 ]; then
    echo "FAIL: the link check reported $(printf '%s\n' "$out" | grep -c .) of the 2 planted bad links:"
    printf '%s\n' "$out"
    exit 1
  fi
  echo "link check self-test: both planted bad links reported"
  exit 0
fi
mapfile -t files < <(git ls-files '*.md')
check "${files[@]}"
echo "every relative link in ${#files[@]} Markdown files resolves inside the repository"
