#!/usr/bin/env bash
# radixkv against SGLang 0.5.23's own code, on the CPU: the Python package
# (crates/radixkv-py) and SGLang's `RadixCache` side by side in one venv,
# cached outside the repository ($RADIXKV_PY_CACHE, default
# ~/.cache/radixkv; the first run downloads about 3 GB: torch 2.14.1 with
# its CUDA libraries, which run on the CPU here), the wheel rebuilt every
# run. Then:
#   - crates/radixkv-py/tests/sglang/tree_vs_sglang.py: random operation
#     sequences on both trees, every result compared (7 policies, 4 page
#     sizes);
#   - its negative controls, which must report a difference:
#     RADIXKV_DIFF_FAULT=priority (radixkv drops the insert priority) and
#     RADIXKV_DIFF_FAULT=hits (radixkv counts hits on match) and
#     RADIXKV_DIFF_FAULT=slru (radixkv's slru without the threshold).
# SGLang 0.5.23's wheel is built for CPython 3.11: without python3.11 this
# prints SKIPPED and fails, so the check is never reported done when it
# was not.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
here="$root/crates/radixkv-py/tests/sglang"

if ! command -v python3.11 >/dev/null 2>&1; then
  echo "SKIPPED: the checks against SGLang 0.5.23 (no python3.11 on this machine; its wheel is cp311)"
  exit 1
fi
cache="${RADIXKV_PY_CACHE:-$HOME/.cache/radixkv}"
venv="$cache/sglang-venv"
mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ]; then
  python3.11 -m venv "$venv"
fi
# pip's output goes to a log, shown when it fails: with sglang installed
# without its dependencies, every install lists the GPU packages it lacks.
piplog="$cache/sglang-venv-pip.log"
: >"$piplog"
pip_install() {
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >>"$piplog" 2>&1; then
    echo "FAIL: pip install $* (the log follows)"
    tail -n 40 "$piplog"
    exit 1
  fi
}
# Each step only when missing: a warm venv costs no download.
if ! "$venv/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.14.1")' 2>/dev/null; then
  pip_install torch==2.14.1 torchvision==0.29.1
fi
if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("sglang") != "0.5.23")' 2>/dev/null; then
  pip_install --no-deps sglang==0.5.23
fi
pip_install -r "$here/requirements.txt"
CARGO_TARGET_DIR="$root/target/py" pip_install --force-reinstall --no-deps ./crates/radixkv-py

cd "$cache"
# SGLang JIT-builds its KV-event hash with the venv's ninja.
export PATH="$venv/bin:$PATH"
"$venv/bin/python" -c 'import radixkv, sglang, torch; print("radixkv", radixkv.__version__, "| sglang", sglang.__version__, "| torch", torch.__version__)'

echo "-- radixkv's tree against SGLang's RadixCache (tree_vs_sglang.py)"
"$venv/bin/python" "$here/tree_vs_sglang.py"

echo "-- its negative controls: each must report a difference"
control() {
  local fault=$1 policies=$2 log
  log=$(mktemp)
  if RADIXKV_DIFF_FAULT=$fault "$venv/bin/python" "$here/tree_vs_sglang.py" --policies "$policies" >"$log" 2>&1; then
    echo "FAIL: tree_vs_sglang.py found no difference with RADIXKV_DIFF_FAULT=$fault"
    rm -f "$log"
    exit 1
  fi
  if grep -q "^DIFFERENT:" "$log"; then
    echo "control RADIXKV_DIFF_FAULT=$fault: failed as required: $(grep -m1 '^DIFFERENT:' "$log" | cut -c1-160)"
    rm -f "$log"
  else
    echo "FAIL: the control $fault failed, but not with a reported difference:"
    tail -n 30 "$log"
    rm -f "$log"
    exit 1
  fi
}
# radixkv without insert priorities.
control priority priority
# radixkv counting hits on match, as SGLang 0.5.9 did.
control hits lfu,slru
# radixkv's slru without SGLang 0.5.23's threshold.
control slru slru
