#!/usr/bin/env python3
"""Probes `radixkv serve` as an operator would, on loopback only, bounded in
time: held connections under a small descriptor limit, 300 clients that
stop reading mid-stream, an oversized Content-Length and malformed heads, a
stop sequence, a subscriber across a SIGKILL restart, and every numeric
flag at its extremes. After each probe of a running server the clean-state
check must hold: nothing in flight or outstanding, nothing pinned, the
audit ok. Standard library only; run by scripts/fault-probe.sh.

usage: fault_probe.py RADIXKV_BIN SUBSCRIBE_BIN [--only PROBE] [--control]

`--control` (with `--only slow_readers`): the server runs without a send
timeout (a day), so the stalled streams keep their admission slots and the
new completion is never served: the probe must fail.
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
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
CONTROL = "--control" in sys.argv
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
        """The clean-state check, waiting (bounded) for completions to settle
        (and for connections to free a slot of the cap: on a health slot
        /stats is a 503 until one does)."""
        deadline = time.monotonic() + PATIENCE
        while True:
            status, st, _ = self.request("GET", "/stats")
            ok = (
                status == 200
                and isinstance(st, dict)
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


def metric(srv: Server, name: str) -> float:
    """One sample of /metrics (answered on a health slot too; retried for a
    moment while a flood of new connections holds every health slot with
    its own 503s, as a monitor would)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            status, text, _ = srv.request("GET", "/metrics", timeout=5.0)
        except OSError:
            status, text = 0, ""
        if status == 200:
            for line in str(text).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
            raise SystemExit(f"no {name} in /metrics")
        if time.monotonic() > deadline:
            raise SystemExit(f"/metrics did not answer: {status} {str(text)[:200]}")
        time.sleep(0.05)


def stalled_streams(srv: Server, n: int, max_tokens: int) -> list:
    """`n` streamed completions whose clients stop reading at once (a
    4 KiB receive buffer, nothing ever read); the sockets the server did not
    close at once."""
    body = json.dumps({"prompt": "a client that stops reading", "max_tokens": max_tokens, "stream": True}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.connect(srv.addr)
            s.sendall(head % len(body) + body)
            socks.append(s)
        except OSError:
            s.close()  # refused at the connection limit
    return socks


def health_within_a_second(srv: Server, what: str) -> None:
    """Five /health checks, each answered 200 within a second (a check
    that lands while a flood's own refusals hold every health slot tries
    again within its second, as a load balancer's probe would)."""
    took = []
    for _ in range(5):
        t = time.monotonic()
        status = 0
        while status != 200 and time.monotonic() - t < 1.0:
            try:
                status, _, _ = srv.request("GET", "/health", timeout=1.0)
            except OSError:
                status = 0
        took.append((status, time.monotonic() - t))
    ok = all(s == 200 and t < 1.0 for s, t in took)
    slowest = max(t for _, t in took)
    check(ok, f"{what}: /health 200 x5, each within 1 s (slowest {slowest:.3f} s)")


def slow_readers() -> None:
    """300 clients that stop reading mid-stream. Every connection slot
    working: /health still answers within a second (a health slot). Streams
    too large for the socket buffers: the send timeout closes them, their
    requests are cancelled and their admission slots freed, and a new
    completion is served."""
    if not CONTROL:
        # Slow tokens (a token every ~6 ms): each stream keeps its slot
        # working, and its socket never fills.
        srv = Server("--devices", "1", "--pages-per-device", "8192", "--speedup", "1", nofile=256)
        socks = stalled_streams(srv, 300, 4096)
        deadline = time.monotonic() + PATIENCE
        while metric(srv, "radixkv_http_in_flight") < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        busy = metric(srv, "radixkv_http_in_flight")
        check(busy >= 150, f"300 stalled streams under ulimit -n 256: {busy:.0f} of the cap's slots working")
        health_within_a_second(srv, "every connection slot working")
        for s in socks:
            s.close()
        srv.clean("300 stalled streams")
        check(srv.stop() == 0, "the server exits 0 on SIGTERM after the stalled streams")

    # Fast tokens, 40,000 per stream (about 6 MB of events: more than the
    # sockets buffer), 16 admission slots: the 16 admitted streams hold
    # them until the send timeout closes their connections.
    send_timeout = "86400" if CONTROL else "2"
    srv = Server(
        "--devices", "1", "--pages-per-device", "65536", "--speedup", "1000000", "--max-queue", "16",
        "--max-tokens-limit", "100000", "--send-timeout-s", send_timeout,
    )
    socks = stalled_streams(srv, 300, 40_000)
    health_within_a_second(srv, "16 admission slots held by stalled streams")
    t = time.monotonic()
    served = None
    while time.monotonic() - t < PATIENCE and served is None:
        status, _, _ = srv.post("/v1/completions", {"prompt": "a new client", "max_tokens": 4})
        if status == 200:
            served = time.monotonic() - t
        else:
            time.sleep(0.1)
    check(
        served is not None,
        "a new completion served once the send timeout freed the stalled streams' slots"
        + (f" ({served:.2f} s)" if served is not None else f" (none within {PATIENCE:.0f} s)"),
    )
    # Each stalled stream's timer runs from its own last write, so the
    # first freed slot can serve the new client before the last of the 16
    # times out: count until all 16 have, within the same patience.
    t = time.monotonic()
    timeouts = metric(srv, "radixkv_http_send_timeouts_total")
    while timeouts < 16 and time.monotonic() - t < PATIENCE:
        time.sleep(0.1)
        timeouts = metric(srv, "radixkv_http_send_timeouts_total")
    check(
        timeouts >= 16,
        f"the 16 stalled streams ended by the send timeout: {timeouts:.0f} "
        f"({time.monotonic() - t:.1f} s after the new completion)",
    )
    for s in socks:
        s.close()
    srv.clean("the send timeouts")
    check(srv.stop() == 0, "the server exits 0 on SIGTERM after the send timeouts")


def malformed_heads() -> None:
    """hyper's own refusals of a request head carry OpenAI-shaped bodies."""
    srv = Server("--devices", "1", "--pages-per-device", "64")
    cases = [
        (b"GARBAGE\r\n\r\n", 400),
        # More header fields than hyper reads (100), and a head past its
        # buffer (about 400 KiB).
        (b"GET / HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431),
        (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 2_000_000 + b"\r\n\r\n", 431),
    ]
    for raw, want in cases:
        with socket.create_connection(srv.addr, timeout=PATIENCE) as s:
            s.sendall(raw)
            status, body = parse(read_all(s))
        check(
            status == want and isinstance(body, dict) and body["error"]["code"] == want and body["error"]["type"],
            f"hyper's {want} is OpenAI-shaped: {body}",
        )
    srv.clean("the malformed heads")
    check(srv.stop() == 0, "the server exits 0 on SIGTERM")


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
    "--max-connections", "--drain-timeout-s", "--send-timeout-s", "--watermarks",
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
    for probe in (held_connections, slow_readers, malformed_heads, oversized_and_stop, restart, flag_extremes):
        if ONLY is not None and probe.__name__ != ONLY:
            continue
        print(f"-- {probe.__name__}", flush=True)
        probe()
    print(f"fault probe: {len(failures)} failures in {time.monotonic() - t0:.1f} s", flush=True)
    sys.exit(1 if failures else 0)
