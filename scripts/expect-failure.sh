#!/usr/bin/env bash
# A negative control: runs COMMAND, which must fail, and its output must
# have a line matching MARKER (an extended regular expression: the check's
# own report of what it caught, so that a control that fails for another
# reason, a crash or a missing file, does not count). Prints the first such
# line and exits 0 when both hold; otherwise prints the output's tail and
# exits 1.
#
#   bash scripts/expect-failure.sh NAME MARKER COMMAND [ARGS...]
#
# Environment variables for COMMAND go before it as usual (`env VAR=x cmd`).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: expect-failure.sh NAME MARKER COMMAND [ARGS...]" >&2
  exit 2
fi
name=$1 marker=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$@" >"$log" 2>&1; then
  echo "FAIL: the control $name passed; it must fail"
  tail -n 30 "$log"
  exit 1
fi
if line=$(grep -m1 -E "$marker" "$log"); then
  echo "control $name: failed as required: $(printf '%s' "$line" | cut -c1-160)"
else
  echo "FAIL: the control $name failed, but without a line matching /$marker/:"
  tail -n 30 "$log"
  exit 1
fi
