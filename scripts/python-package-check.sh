#!/usr/bin/env bash
# The Python package (crates/radixkv-py) as a user gets it: `pip install
# ./crates/radixkv-py` into a fresh virtual environment (maturin builds the
# abi3 wheel; a Rust toolchain is all it needs), then its tests
# (crates/radixkv-py/tests: the core's API, inputs, errors, the GIL, a
# panic). The venv is cached outside the repository
# ($RADIXKV_PY_CACHE, default ~/.cache/radixkv) and reused; the wheel is
# rebuilt every run. Without python3 it prints SKIPPED and fails: the
# package is never reported as checked when it was not.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIPPED: the Python package checks (no python3 on this machine)"
  exit 1
fi
cache="${RADIXKV_PY_CACHE:-$HOME/.cache/radixkv}"
venv="$cache/package-venv"
mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "numpy>=1.21" "pytest>=7"
# The wheel, built as pip builds it for a user (maturin fetched into an
# isolated build environment); its Rust build reuses a
# target folder of the repository's.
CARGO_TARGET_DIR="$root/target/py" "$venv/bin/python" -m pip install --quiet \
  --disable-pip-version-check --force-reinstall --no-deps \
  ./crates/radixkv-py
# Imported from the installed wheel, not from the source tree.
cd "$cache"
"$venv/bin/python" -c 'import radixkv, sys; print("radixkv", radixkv.__version__, "from", radixkv.__file__, "on Python", sys.version.split()[0])'
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/crates/radixkv-py/tests"

# The GIL test's negative control: a wheel whose inserts keep the GIL (the
# feature `negative-hold-gil`) must fail that test, with its own message.
control="$cache/package-control-venv"
if [ ! -x "$control/bin/python" ]; then
  python3 -m venv "$control"
fi
"$control/bin/python" -m pip install --quiet --disable-pip-version-check "numpy>=1.21" "pytest>=7"
MATURIN_PEP517_ARGS="--features negative-hold-gil" CARGO_TARGET_DIR="$root/target/py-control" \
  "$control/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
  --no-deps "$root/crates/radixkv-py"
log=$(mktemp)
if "$control/bin/python" -m pytest -q -p no:cacheprovider "$root/crates/radixkv-py/tests" \
  -k test_the_gil_is_released >"$log" 2>&1; then
  echo "FAIL: the GIL test passed with inserts that keep the GIL (control negative-hold-gil)"
  rm -f "$log"
  exit 1
fi
if grep -q "the GIL was held inside the insert" "$log"; then
  echo "GIL control (negative-hold-gil): failed as required, with the test's own message"
  rm -f "$log"
else
  echo "FAIL: the GIL control failed, but not with the test's message:"
  tail -n 30 "$log"
  rm -f "$log"
  exit 1
fi
