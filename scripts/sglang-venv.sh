#!/usr/bin/env bash
# The venv in which radixkv meets SGLang 0.5.23 on the CPU, sourced by
# scripts/sglang-check.sh and scripts/sglang-bench.sh (with `root` set to
# the repository): torch 2.14.1 and sglang 0.5.23 without its GPU
# dependencies, the versions SGLang pins (tests/sglang/requirements.txt),
# and this checkout's radixkv wheel, rebuilt every time. Cached outside the
# repository ($RADIXKV_PY_CACHE, default ~/.cache/radixkv; the first run
# downloads about 3 GB: torch with its CUDA libraries, which run on the CPU
# here). Sets `venv` and `cache`.
# SGLang 0.5.23's wheel is built for CPython 3.11: without python3.11 this
# prints SKIPPED and fails, so a check is never reported done when it was
# not.
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
CARGO_TARGET_DIR="$root/target/py" pip_install --force-reinstall --no-deps "$root/crates/radixkv-py"

# SGLang JIT-builds its KV-event hash with the venv's ninja.
export PATH="$venv/bin:$PATH"
