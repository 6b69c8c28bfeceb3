#!/usr/bin/env bash
# The venv of the clients and peers the checks drive radixkv with, sourced
# by scripts/python-check.sh, smollm2-check.sh, index-check.sh,
# index-bench.sh and model-bench.sh: the openai SDK and httpx, pyzmq
# (libzmq) and msgpack, and NVIDIA Dynamo's standalone indexer
# (ai-dynamo-runtime 1.6.1). Cached outside the repository
# ($RADIXKV_PY_CACHE, default ~/.cache/radixkv, as scripts/sglang-venv.sh);
# pip runs only when a package is missing, so a warm venv downloads
# nothing. Sets `client_venv` (the venv's folder, an absolute path).
# Without python3 it prints SKIPPED and fails, so a check is never
# reported done when it was not.
if ! command -v python3 >/dev/null 2>&1; then
  echo "SKIPPED: the checks with Python clients (no python3 on this machine)"
  exit 1
fi
client_venv="${RADIXKV_PY_CACHE:-$HOME/.cache/radixkv}/client-venv"
mkdir -p "$(dirname "$client_venv")"
if [ ! -x "$client_venv/bin/python" ]; then
  python3 -m venv "$client_venv"
fi
if ! "$client_venv/bin/python" - <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
import openai, httpx, zmq, msgpack  # noqa: F401
sys.exit(m.version("ai-dynamo-runtime") != "1.6.1")
PY
  "$client_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai>=1.40" "httpx>=0.27" "pyzmq>=25" "msgpack>=1.0" "ai-dynamo-runtime==1.6.1"
fi
