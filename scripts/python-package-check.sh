#!/usr/bin/env bash
# The Python package (crates/radixkv-py) as a user gets it: `pip install
# ./crates/radixkv-py` into a fresh virtual environment (maturin builds the
# abi3 wheel; a Rust toolchain is all it needs), then its tests
# (crates/radixkv-py/tests: the core's API, inputs, errors, the SGLang
# tree). Then:
#   - the released wheel carries no test hook (`_panic_inside`,
#     `_hold_next_store`, …: the cargo feature `test-hooks`, which
#     pyproject.toml does not enable);
#   - every entry point is declared through the panic guard's attributes
#     (no bare #[pymethods] / #[pyfunction] in its sources);
#   - a wheel built with `test-hooks` passes tests/test_hooks.py (every
#     entry point's panic a RuntimeError, a broken mirror refusing every
#     call, the GIL released inside an insert);
#   - the GIL test's negative control: that wheel, imported with
#     RADIXKV_NEGATIVE_HOLD_GIL=1 (no call releases the GIL), must fail it.
# The venvs are cached outside the repository ($RADIXKV_PY_CACHE, default
# ~/.cache/radixkv) and reused; the wheels are rebuilt every run. Without
# python3 it prints SKIPPED and fails: the package is never reported as
# checked when it was not.
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
# msgpack and pyzmq: tests/test_dp_router.py encodes KV-event batches and
# publishes them as vLLM and SGLang do.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "numpy>=1.21" "pytest>=7" "msgpack>=1.0" "pyzmq>=25"
# The wheel, built as pip builds it for a user (maturin fetched into an
# isolated build environment); its Rust build reuses a
# target folder of the repository's.
CARGO_TARGET_DIR="$root/target/py" "$venv/bin/python" -m pip install --quiet \
  --disable-pip-version-check --force-reinstall --no-deps \
  ./crates/radixkv-py
# Imported from the installed wheel, not from the source tree.
cd "$cache"
"$venv/bin/python" -c 'import radixkv, sys; print("radixkv", radixkv.__version__, "from", radixkv.__file__, "on Python", sys.version.split()[0])'
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/crates/radixkv-py/tests" \
  --ignore="$root/crates/radixkv-py/tests/test_hooks.py"

echo "-- the released wheel has no test hook"
"$venv/bin/python" - <<'PY'
import radixkv
from radixkv import _radixkv as ext

found = sorted(
    f"{owner.__name__}.{name}"
    for owner in [ext] + [c for c in vars(ext).values() if isinstance(c, type)]
    for name in vars(owner)
    if name.startswith("_") and not name.startswith("__")
)
if found:
    raise SystemExit(f"FAIL: the released wheel carries test hooks: {found}")
print("no test hook in", radixkv.__file__)
PY

echo "-- every entry point is declared through the panic guard (#[py_methods] / #[py_function])"
if grep -rnE '#\[(pyo3::)?(pymethods|pyfunction)\]' "$root/crates/radixkv-py/src"; then
  echo "FAIL: a bare PyO3 attribute (above): its functions would run outside the panic guard; use #[py_methods] / #[py_function]"
  exit 1
fi

# The wheel with the test hooks (feature `test-hooks`), in its own venv.
echo "-- a wheel with the test hooks: tests/test_hooks.py"
hooks="$cache/package-hooks-venv"
if [ ! -x "$hooks/bin/python" ]; then
  python3 -m venv "$hooks"
fi
"$hooks/bin/python" -m pip install --quiet --disable-pip-version-check "numpy>=1.21" "pytest>=7"
MATURIN_PEP517_ARGS="--features test-hooks" CARGO_TARGET_DIR="$root/target/py-hooks" \
  "$hooks/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
  --no-deps "$root/crates/radixkv-py"
"$hooks/bin/python" -m pytest -q -p no:cacheprovider "$root/crates/radixkv-py/tests/test_hooks.py"

# The GIL test's negative control: the same wheel, imported with
# RADIXKV_NEGATIVE_HOLD_GIL=1 (no call releases the GIL; a switch only the
# test-hooks build has), must fail that test, with its own message.
echo "-- the GIL test's negative control"
RADIXKV_NEGATIVE_HOLD_GIL=1 bash "$root/scripts/expect-failure.sh" \
  "RADIXKV_NEGATIVE_HOLD_GIL=1 (no call releases the GIL)" "the GIL was held inside the insert" \
  "$hooks/bin/python" -m pytest -q -p no:cacheprovider "$root/crates/radixkv-py/tests/test_hooks.py" \
  -k test_the_gil_is_released
