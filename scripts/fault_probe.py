#!/usr/bin/env python3
"""Probes `radixkv serve` as an operator would, on loopback only, bounded in
time: held connections under a small descriptor limit, an oversized
Content-Length, a stop sequence, a subscriber across a SIGKILL restart, and
every numeric flag at its extremes. After each probe of a running server
the clean-state check must hold: nothing in flight or outstanding, nothing
pinned, the audit ok. Standard library only; run by scripts/fault-probe.sh.

usage: fault_probe.py RADIXKV_BIN SUBSCRIBE_BIN
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

BIN, SUBSCRIBE = sys.argv[1], sys.argv[2]
PATIENCE = 20.0
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`radixkv serve` on an ephemeral port, optionally under `ulimit -n`."""

    def __init__(self, *args: str, nofile: int | None = None) -> None:
        cmd = [BIN, "serve", "--host", "127.0.0.1", "--port", "0", *args]
        if nofile is not None:
            cmd = ["bash", "-c", f'ulimit -n {nofile} && exec "$0" "$@"', *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "http://" not in line:
            raise SystemExit(f"the server did not start: {line!r} {self.proc.stderr.read()}")
        host, port = line.strip().rsplit("http://", 1)[1].rsplit(":", 1)
        self.addr = (host, int(port))

    def request(self, method: str, path: str, body: bytes = b"", timeout: float = PATIENCE) -> tuple[int, dict | str, float]:
        """One request on its own connection: (status, JSON or text, seconds)."""
        t = time.monotonic()
        with socket.create_connection(self.addr, timeout=timeout) as s:
            head = f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
            if body:
                head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            s.sendall(head.encode() + b"\r\n" + body)
            reply = read_all(s)
        status, payload = parse(reply)
        return status, payload, time.monotonic() - t

    def post(self, path: str, obj: dict) -> tuple[int, dict | str, float]:
        return self.request("POST", path, json.dumps(obj).encode())

    def clean(self, after: str) -> None:
        """The clean-state check, waiting (bounded) for completions to settle."""
        deadline = time.monotonic() + PATIENCE
        while True:
            _, st, _ = self.request("GET", "/stats")
            ok = (
                isinstance(st, dict)
                and st["http"]["in_flight"] == 0
                and st["outstanding"] == 0
                and st["pinned_tokens"] == 0
                and st["audit_ok"] is True
            )
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        check(ok, f"clean state after {after}" + ("" if ok else f": {st}"))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def read_all(s: socket.socket) -> bytes:
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk


def parse(reply: bytes) -> tuple[int, dict | str]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    text = body.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2 :]
    return out


def held_connections() -> None:
    """300 held connections under a 256-descriptor limit: /health answers."""
    srv = Server("--devices", "2", "--pages-per-device", "512", nofile=256)
    held = []
    for i in range(300):
        s = socket.create_connection(srv.addr, timeout=PATIENCE)
        if i % 3 == 1:
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        elif i % 3 == 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        held.append(s)
    slowest = 0.0
    ok = True
    for _ in range(10):
        status, _, took = srv.request("GET", "/health", timeout=5.0)
        ok &= status == 200
        slowest = max(slowest, took)
    check(ok and slowest < 5.0, f"300 held connections under ulimit -n 256: /health 200 x10 (slowest {slowest:.3f} s)")
    _, st, _ = srv.request("GET", "/stats")
    check(st["http"]["max_connections"] < 256, f"the connection cap ({st['http']['max_connections']}) is below the descriptor limit")
    status, _, _ = srv.post("/v1/completions", {"prompt": "still serving", "max_tokens": 4})
    check(status == 200, "a completion under the flood")
    for s in held:
        s.close()
    srv.clean("the held connections")
    check(srv.stop() == 0, "the server exits 0 on SIGTERM after the flood")


def oversized_and_stop() -> None:
    # A token every ~6 ms: 4,096 would take ~25 s.
    srv = Server("--devices", "1", "--pages-per-device", "1024", "--speedup", "1")
    with socket.create_connection(srv.addr, timeout=PATIENCE) as s:
        t = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 99000000000\r\n\r\n")
        status, body = parse(read_all(s))
        took = time.monotonic() - t
    check(status == 413 and took < 2.0, f"Content-Length 99 GB: 413 before the body ({took:.3f} s)")
    check(isinstance(body, dict) and body["error"]["code"] == 413, f"the 413 is OpenAI-shaped: {body}")
    srv.clean("the oversized request")

    req = {"prompt": "stop test", "max_tokens": 4096, "stop": ["a", "e", "i", "o"]}
    status, v, took = srv.post("/v1/completions", req)
    text = v["choices"][0]["text"]
    used = v["usage"]["completion_tokens"]
    check(
        status == 200 and v["choices"][0]["finish_reason"] == "stop" and used == len(text) + 1 and took < 10.0,
        f"a stop sequence ends generation: {len(text)} characters, {used} completion tokens, {took:.2f} s",
    )
    srv.clean("a stopped request")
    _, st, _ = srv.request("GET", "/stats")
    generated = sum(d["output_tokens"] for d in st["devices"])
    check(generated < 512, f"the engine generated {generated} tokens, not 4,096")
    check(srv.stop() == 0, "the server exits 0 on SIGTERM")


def restart() -> None:
    """A subscriber across a SIGKILL restart sees AllBlocksCleared first."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = ("--devices", "1", "--pages-per-device", "256", "--kv-events", endpoint)
    srv = Server(*args)
    sub = subprocess.Popen([SUBSCRIBE, endpoint, str(PATIENCE * 3)], stdout=subprocess.PIPE, text=True)
    # The subscription is in effect once the repeated clearing arrives.
    seq, *kinds = sub.stdout.readline().split()
    last = int(seq)
    check(kinds == ["AllBlocksCleared"], f"a fresh server repeats AllBlocksCleared until its first change: {kinds}")
    srv.post("/v1/completions", {"prompt": "the first run's request, long enough", "max_tokens": 2})
    stored = False
    while not stored:
        line = sub.stdout.readline()
        if not line:
            break
        seq, *kinds = line.split()
        last = max(last, int(seq))
        stored = "BlockStored" in kinds
    check(stored, "the first run's stores reach the subscriber")
    srv.stop(signal.SIGKILL)
    srv = Server(*args)
    while True:
        line = sub.stdout.readline()
        if not line:
            break
        seq, *kinds = line.split()
        if int(seq) > last:
            break
    check(kinds == ["AllBlocksCleared"], f"the new run's first batch the subscriber sees: {kinds}")
    srv.post("/v1/completions", {"prompt": "the second run's first request, long enough", "max_tokens": 2})
    while True:
        line = sub.stdout.readline()
        kinds = line.split()[1:]
        if not line or any(k != "AllBlocksCleared" for k in kinds):
            break
    check(kinds[:1] == ["AllBlocksCleared"] and "BlockStored" in kinds, f"then the clearing leads the new run's stores: {kinds}")
    sub.kill()
    srv.clean("the restart")
    check(srv.stop() == 0, "the restarted server exits 0 on SIGTERM")


NUMERIC_FLAGS = [
    "--port", "--devices", "--page-size", "--pages-per-device", "--host-pages", "--host-gbps",
    "--peer-gbps", "--load-back-threshold", "--speedup", "--max-queue", "--max-tokens-limit",
    "--max-body-bytes", "--header-read-timeout-s", "--body-read-timeout-s", "--idle-timeout-s",
    "--max-connections", "--drain-timeout-s", "--watermarks",
]
EXTREMES = ["0", "-1", "1e-300", "1e300", "nan", "inf", "18446744073709551616", "4294967296", "", "1,2"]


def flag_extremes() -> None:
    """Every numeric flag at its extremes: a usage error naming it, or a
    server that starts and stops cleanly; never a panic."""
    bad = []
    for flag in NUMERIC_FLAGS:
        for value in EXTREMES:
            base = {"--port": "0", "--pages-per-device": "64"}
            base[flag] = value
            cmd = [BIN, "serve", "--host", "127.0.0.1", *(f"{k}={v}" for k, v in base.items())]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            if "listening" in line:
                p.send_signal(signal.SIGTERM)
            try:
                _, err = p.communicate(timeout=PATIENCE)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                bad.append(f"{flag}={value}: hung")
                continue
            started = "listening" in line
            if "panicked" in err or p.returncode < 0:
                bad.append(f"{flag}={value}: panicked or killed ({p.returncode}): {err.strip()[:200]}")
            elif started and p.returncode != 0:
                bad.append(f"{flag}={value}: started, then exited {p.returncode}")
            elif not started and (p.returncode != 2 or flag not in err):
                bad.append(f"{flag}={value}: exit {p.returncode} without naming the flag: {err.strip()[:200]}")
    check(not bad, f"{len(NUMERIC_FLAGS)} numeric flags x {len(EXTREMES)} extremes: no panic, errors name the flag" + "".join("\n     " + b for b in bad))


if __name__ == "__main__":
    t0 = time.monotonic()
    for probe in (held_connections, oversized_and_stop, restart, flag_extremes):
        print(f"-- {probe.__name__}", flush=True)
        probe()
    print(f"fault probe: {len(failures)} failures in {time.monotonic() - t0:.1f} s", flush=True)
    sys.exit(1 if failures else 0)
