#!/usr/bin/env bash
# End-to-end checks of a running `radixkv serve` from Python, as a new user
# would drive it: the official `openai` client (models, completions, chat,
# streaming, a cached second turn, errors), pyzmq (libzmq) subscribing to
# and replaying its KV events, /query, and 1,000 concurrent streaming
# clients with a bounded number of server threads, and NVIDIA Dynamo's
# standalone KV indexer (ai-dynamo-runtime's `python -m dynamo.indexer`)
# subscribed to the server's events; then pyzmq subscribed across three
# SIGKILL restarts (scripts/kv_restart_check.py: AllBlocksCleared first,
# within a second) and that check's negative control (no startup hold:
# it must fail). The packages come from scripts/client-venv.sh's venv
# (cached outside the repository). Without python3 it prints SKIPPED and
# fails: it never passes silently.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/client-venv.sh
source scripts/client-venv.sh
venv=$client_venv

# RADIXKV_BIN: a radixkv binary already built (test.sh passes the one its
# release test run built); otherwise build it.
bin="${RADIXKV_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --quiet -p radixkv-cli
  bin=target/release/radixkv
fi

# Four free ports: HTTP, KV events for two devices, the replay socket of
# device 0 (device 1's replay takes the next one).
read -r http events replay < <("$venv/bin/python" - <<'PY'
import socket
def block(n):
    while True:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
        if p + n > 65000: continue
        ok = True
        for i in range(n):
            t = socket.socket()
            try: t.bind(("127.0.0.1", p + i))
            except OSError: ok = False
            finally: t.close()
        if ok: return p
p = block(5)
print(p, p + 1, p + 3)
PY
)

# 1,000 clients and the server's side of their connections.
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)"
log=$(mktemp)
"$bin" serve --port "$http" --devices 2 --api-key sk-radixkv-test --max-queue 2000 \
  --kv-events "tcp://127.0.0.1:$events" --kv-events-replay "tcp://127.0.0.1:$replay" \
  >"$log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
bash scripts/wait-healthy.sh "http://127.0.0.1:$http" "$pid" "$log"
"$venv/bin/python" scripts/python_check.py "http://127.0.0.1:$http" sk-radixkv-test \
  "tcp://127.0.0.1:$events" "tcp://127.0.0.1:$replay" "$pid"
cleanup
trap - EXIT

echo "-- pyzmq (libzmq) across SIGKILL restarts of radixkv serve (scripts/kv_restart_check.py)"
"$venv/bin/python" scripts/kv_restart_check.py "$bin"
bash scripts/expect-failure.sh "kv_restart_check.py --control (no startup hold)" "^DIFFERENT:" \
  "$venv/bin/python" scripts/kv_restart_check.py "$bin" --control
