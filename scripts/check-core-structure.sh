#!/usr/bin/env bash
# The core (`src/`) stays a house a maintainer can live in; fails, naming
# the culprit, on:
#   * a file of the core over 700 lines;
#   * a `too_many_arguments` allowance in the core (an operation takes one
#     argument struct instead);
#   * a negative control (`negative::removed("<step>")`) outside the
#     protecting function named after its step, a step with more or fewer
#     than one such control, or a step that build.rs does not know (each
#     protecting step is one function, named after the step, holding the
#     step's one control: `loom-tests/negative.sh` removes the step through it).
# Prints the count of control sites. `--self-test` runs the checks on a
# copy of the core with one of each violation put in, and fails unless each
# is reported.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--self-test" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch/scripts"
  cp -r src build.rs "$scratch/"
  cp "$0" "$scratch/scripts/"
  # A control outside its protecting function, an allowance, a long file.
  sed -i 's|^    pub(crate) fn evict_leaf<|    #[allow(clippy::too_many_arguments)]\n    pub(crate) fn evict_leaf<|' "$scratch/src/tree/ops/evict.rs"
  sed -i '0,/if node.is_root {/s//if node.is_root || crate::negative::removed("leaf_check") {/' "$scratch/src/tree/ops/evict.rs"
  for _ in $(seq 701); do echo '//'; done >>"$scratch/src/device.rs"
  out=$(bash "$scratch/scripts/check-core-structure.sh" 2>&1) && { echo "FAIL: the self-test's violations passed"; exit 1; }
  for want in "src/device.rs has" "too_many_arguments allowance" "stands in fn evict_leaf" 'step "leaf_check" has 2 control sites'; do
    if ! grep -qF "$want" <<<"$out"; then
      echo "FAIL: the self-test's violation \"$want\" was not reported:"
      printf '%s\n' "$out"
      exit 1
    fi
  done
  echo "core structure self-test: a long file, an allowance and a misplaced control are each reported"
  exit 0
fi

max_lines=700
status=0

while IFS= read -r f; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$max_lines" ]; then
    echo "FAIL: $f has $n lines (the core's limit is $max_lines): cut it along its identities"
    status=1
  fi
done < <(find src -name '*.rs' | sort)

if grep -rn "too_many_arguments" src; then
  echo "FAIL: a too_many_arguments allowance in the core (above): take one argument struct"
  status=1
fi

# The steps build.rs knows.
steps=$(awk '/^const STEPS: &\[&str\] = &\[/{on=1; next} on && /^\];/{on=0} on {gsub(/[",[:space:]]/, ""); if ($0 != "") print}' build.rs)
if [ -z "$steps" ]; then
  echo "FAIL: no control steps found in build.rs"
  exit 1
fi

# Every control site, as "file:line step enclosing-function" (the
# innermost `fn` whose body holds the line; strings and comments are
# dropped before braces are counted).
sites=$(find src -name '*.rs' | sort | while IFS= read -r f; do
  awk -v file="$f" '
    function strip(s) {
      gsub(/"([^"\\]|\\.)*"/, "\"\"", s)
      sub(/\/\/.*/, "", s)
      return s
    }
    {
      raw = $0
      line = strip(raw)
      code = raw
      sub(/\/\/.*/, "", code)   # a mention in a comment is not a control
      if (match(code, /negative::removed\("[a-z_]+"\)/)) {
        step = substr(code, RSTART, RLENGTH)
        sub(/^negative::removed\("/, "", step); sub(/"\)$/, "", step)
        fname = (depth_top > 0) ? names[depth_top] : "(none)"
        print file ":" NR " " step " " fname
      }
      if (match(line, /(^|[^a-z_])fn [a-z_0-9]+/)) {
        m = substr(line, RSTART, RLENGTH); sub(/.*fn /, "", m); pending = m
      }
      n = split(line, ch, "")
      for (i = 1; i <= n; i++) {
        if (ch[i] == "{") {
          depth++
          if (pending != "") { depth_top++; names[depth_top] = pending; at[depth_top] = depth; pending = "" }
        } else if (ch[i] == "}") {
          if (depth_top > 0 && at[depth_top] == depth) depth_top--
          depth--
        } else if (ch[i] == ";" && pending != "") {
          pending = ""   # a declaration without a body
        }
      }
    }' "$f"
done)

count=0
while IFS=' ' read -r where step fname; do
  [ -z "$where" ] && continue
  count=$((count + 1))
  if ! printf '%s\n' "$steps" | grep -qx "$step"; then
    echo "FAIL: $where: control step \"$step\" is not one of build.rs's STEPS"
    status=1
  fi
  if [ "$fname" != "$step" ]; then
    echo "FAIL: $where: the control of \"$step\" stands in fn $fname, not in the protecting function \`fn $step\`"
    status=1
  fi
done <<<"$sites"

for step in $steps; do
  n=$(printf '%s\n' "$sites" | awk -v s="$step" '$2 == s' | grep -c . || true)
  if [ "$n" -ne 1 ]; then
    echo "FAIL: control step \"$step\" has $n control sites in src/ (one, in \`fn $step\`, is the rule)"
    status=1
  fi
done

if [ "$status" -eq 0 ]; then
  echo "core structure: $(find src -name '*.rs' | wc -l) files of at most $max_lines lines; $count control sites, one per step, each in its protecting function"
fi
exit "$status"
