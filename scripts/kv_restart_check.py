#!/usr/bin/env python3
"""A libzmq subscriber (pyzmq, as NVIDIA Dynamo's indexer, vLLM's and
SGLang's consumers are) connected to `radixkv serve --kv-events` across a
SIGKILL and a restart on the same endpoint, completions served from the
moment the new process listens: the first message of the new run it
receives must be `AllBlocksCleared`, before any store of the new run, and
within a second of the new process's start. Three restarts.

The subscriber reconnects every 0.2 s (plus libzmq's random jitter of up to as much again; its default is 0.1 s; a router
may well wait longer), so that the run shows the clearing reaches a
subscriber that comes back well after the bind.

`--control`: the same with `--kv-events-startup-hold-s 0` (the new run's
first changes sent at once, as before the hold existed): the subscriber
must then see a store first, which the check reports and exits 1 on.

usage: kv_restart_check.py RADIXKV_BIN [--control]
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import msgpack
import zmq

BIN = sys.argv[1]
CONTROL = "--control" in sys.argv[2:]
RESTARTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kinds(payload: bytes) -> list:
    """The event types of one batch (map or array encoding)."""
    b = msgpack.unpackb(payload)
    events = b["events"] if isinstance(b, dict) else b[1]
    return [e["type"] if isinstance(e, dict) else e[0] for e in events]


class Server:
    def __init__(self, endpoint: str) -> None:
        hold = ["--kv-events-startup-hold-s", "0"] if CONTROL else []
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--devices", "1", "--pages-per-device", "512",
             "--kv-events", endpoint, *hold],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if "http://" not in line:
            raise SystemExit(f"FAIL: the server did not start: {line!r}")
        self.url = "http://" + line.strip().rsplit("http://", 1)[1]
        self.stop = False
        self.served = 0
        self.load = threading.Thread(target=self._serve, daemon=True)
        self.load.start()

    def _serve(self) -> None:
        """Completions back to back from the moment the server listens."""
        i = 0
        while not self.stop:
            body = json.dumps({"prompt": f"request {i} of this run, long enough to fill pages", "max_tokens": 2})
            req = urllib.request.Request(
                self.url + "/v1/completions", data=body.encode(), headers={"content-type": "application/json"}
            )
            try:
                urllib.request.urlopen(req, timeout=20).read()
                self.served += 1
            except OSError:
                if self.proc.poll() is not None:
                    return
            i += 1

    def kill(self) -> None:
        self.stop = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.load.join(30)


def main() -> int:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RECONNECT_IVL, 200)
    sub.connect(endpoint)
    srv = Server(endpoint)
    failures = []
    # The first run: wait until its stores arrive (the subscription holds).
    deadline = time.monotonic() + 30
    last = None
    while time.monotonic() < deadline:
        if sub.poll(100):
            _, seq, payload = sub.recv_multipart()
            last = int.from_bytes(seq, "big")
            if "BlockStored" in kinds(payload):
                break
    else:
        srv.kill()
        print("FAIL: the first run's stores never reached the subscriber")
        return 1
    for n in range(RESTARTS):
        srv.kill()
        # Whatever the old run still had in flight is drained first.
        while sub.poll(50):
            _, seq, _ = sub.recv_multipart()
            last = int.from_bytes(seq, "big")
        srv = Server(endpoint)
        first = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and first is None:
            if sub.poll(50):
                _, seq, payload = sub.recv_multipart()
                s = int.from_bytes(seq, "big")
                if last is not None and s <= last:
                    continue  # a late message of the old run
                first = (time.monotonic() - srv.started, s, kinds(payload))
        if first is None:
            failures.append(f"restart {n + 1}: nothing from the new run in 20 s ({srv.served} completions served)")
            continue
        took, _, got = first
        ok = got[:1] == ["AllBlocksCleared"] and took <= 1.0
        line = (
            f"restart {n + 1}: the new run's first batch the subscriber saw: {got}, "
            f"{took:.3f} s after the process started ({srv.served} completions served by then)"
        )
        print(("ok   " if ok else "FAIL ") + line, flush=True)
        if not ok:
            failures.append(line)
        # Then the new run's stores follow.
        deadline = time.monotonic() + 20
        stored = False
        while time.monotonic() < deadline and not stored:
            if sub.poll(50):
                _, seq, payload = sub.recv_multipart()
                last = int.from_bytes(seq, "big")
                stored = "BlockStored" in kinds(payload)
        if not stored:
            failures.append(f"restart {n + 1}: no store of the new run reached the subscriber")
    srv.kill()
    if failures:
        print("DIFFERENT: " + "; ".join(failures), flush=True)
        return 1
    print(f"a libzmq subscriber saw AllBlocksCleared first, within a second, across {RESTARTS} SIGKILL restarts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
