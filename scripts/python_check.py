"""A running `radixkv serve` driven as a new user would: the official
`openai` client, pyzmq (libzmq) subscribing to its KV events, and a
thousand concurrent streaming clients. Run by scripts/python-check.sh,
which starts the server; prints one line per check and a closing
"N passed, M failed" line, and exits non-zero on any failure.

Usage: python_check.py BASE_URL API_KEY EVENTS_ENDPOINT REPLAY_ENDPOINT SERVER_PID
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import urllib.request

import httpx
import msgpack
import openai
import zmq

BASE, KEY, EVENTS, REPLAY, PID = sys.argv[1:6]
PID = int(PID)
RESULTS = []


def check(name):
    def wrap(f):
        try:
            detail = f()
            RESULTS.append((name, True))
            print(f"ok    {name}" + (f": {detail}" if detail else ""), flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported
            RESULTS.append((name, False))
            print(f"FAIL  {name}", flush=True)
            traceback.print_exc()
        return f

    return wrap


client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)


def wait_idle():
    """Polls /stats until the server is idle and its audit passes (every
    finished request's prefix is in the cache)."""
    deadline = time.time() + 20
    while time.time() < deadline:
        if json.load(urllib.request.urlopen(BASE + "/stats")).get("audit_ok"):
            return
        time.sleep(0.02)
    raise AssertionError("the server never became idle")


@check("models.list() names the served model")
def _():
    models = [m.id for m in client.models.list()]
    assert models == ["radixkv-sim"], models
    return models[0]


@check("a wrong API key is an AuthenticationError")
def _():
    bad = openai.OpenAI(base_url=BASE + "/v1", api_key="sk-wrong", max_retries=0)
    try:
        bad.models.list()
    except openai.AuthenticationError as e:
        assert e.status_code == 401
        return "401"
    raise AssertionError("no error")


@check("completions.create() returns text and usage")
def _():
    r = client.completions.create(model="radixkv-sim", prompt="Hello, radixkv.", max_tokens=8)
    assert r.object == "text_completion"
    assert len(r.choices[0].text) == 8, r.choices[0].text
    assert r.usage.prompt_tokens == len("Hello, radixkv.")
    assert r.usage.completion_tokens == 8
    return f"{r.choices[0].text!r}"


@check("a chat's second and third turns reuse cached KV")
def _():
    messages = [
        {"role": "system", "content": "You answer briefly. " * 8},
        {"role": "user", "content": "What is a radix tree?"},
    ]
    cached = []
    for turn in range(3):
        r = client.chat.completions.create(
            model="radixkv-sim", messages=messages, max_tokens=8, temperature=0.2, seed=7
        )
        assert r.object == "chat.completion"
        assert r.choices[0].message.role == "assistant"
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        messages.append({"role": "user", "content": f"Tell me more ({turn})."})
        wait_idle()
    assert cached[0] == 0 and 0 < cached[1] < cached[2], cached
    return f"cached tokens per turn {cached}"


@check("a streamed chat: role, deltas, finish reason, usage")
def _():
    stream = client.chat.completions.create(
        model="radixkv-sim",
        messages=[{"role": "user", "content": "Stream, please."}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(text) == 6 and finish == ["length"], (text, finish)
    assert chunks[-1].usage.completion_tokens == 6
    return f"{len(chunks)} chunks"


@check("unsupported fields are a BadRequestError naming them")
def _():
    try:
        client.chat.completions.create(
            model="radixkv-sim", messages=[{"role": "user", "content": "x"}], n=2
        )
    except openai.BadRequestError as e:
        assert "`n`" in str(e), e
        return "n=2 refused"
    raise AssertionError("no error")


@check("/query answers in the Mooncake RFC shape")
def _():
    prompt = "A prompt to be found by the query endpoint. " * 4
    client.completions.create(model="radixkv-sim", prompt=prompt, max_tokens=2)
    wait_idle()
    req = urllib.request.Request(
        BASE + "/query",
        data=json.dumps({"token_ids": list(prompt.encode())}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    v = json.load(urllib.request.urlopen(req))["data"]["radixkv"]
    whole = len(prompt.encode()) // 16 * 16
    assert v["matched_tokens"] == whole and max(v["L1"].values()) == whole, v
    return json.dumps(v)


def replay(ctx, endpoint):
    """Every buffered batch of one device's socket, through its replay socket."""
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    s.send_multipart([b"", (0).to_bytes(8, "big")])
    out = []
    while True:
        if not s.poll(5000):
            raise AssertionError("no replay answer within 5 s")
        frames = s.recv_multipart()
        if frames and frames[0] == b"":
            frames = frames[1:]
        seq = int.from_bytes(frames[0], "big", signed=True)
        if seq == -1:
            return out
        out.append((seq, msgpack.unpackb(frames[1])))


@check("pyzmq (libzmq) receives and replays the KV events")
def _():
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(EVENTS)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    # Live: keep sending requests until a batch with a store arrives on
    # device 0's socket (the subscription takes a moment to reach the
    # publisher, and for its first second it repeats AllBlocksCleared alone
    # while changes wait: the startup hold).
    deadline = time.time() + 20
    live = None
    i = 0
    while live is None and time.time() < deadline:
        client.completions.create(model="radixkv-sim", prompt=f"live event probe {i} " * 3, max_tokens=1)
        i += 1
        while sub.poll(200):
            frames = sub.recv_multipart()
            if any(e["type"] == "BlockStored" for e in msgpack.unpackb(frames[2])[1]):
                live = frames
                break
    assert live is not None, "no live batch with a store"
    topic, seq, payload = live
    ts, events, rank = msgpack.unpackb(payload)
    assert topic == b"" and len(seq) == 8 and isinstance(ts, float) and rank == 0
    batches = replay(ctx, REPLAY)
    seqs = [s for s, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gapless"
    first = batches[0][1][1][0]
    assert first["type"] == "AllBlocksCleared", first
    stored = [e for _, b in batches for e in b[1] if e["type"] == "BlockStored"]
    assert stored and all(e["block_size"] == 16 and e["medium"] == "GPU" for e in stored)
    assert all(len(e["token_ids"]) == 16 * len(e["block_hashes"]) for e in stored)
    ctx.destroy(linger=0)
    return f"{len(batches)} batches replayed, {len(stored)} BlockStored"


def post_json(url, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    return json.load(urllib.request.urlopen(req, timeout=10))


@check("NVIDIA Dynamo's standalone indexer (python -m dynamo.indexer) sees what /query sees")
def _():
    host, port = EVENTS.rsplit(":", 1)
    workers = f"1={host}:{port},1:1={host}:{int(port) + 1}"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    iport = s.getsockname()[1]
    s.close()
    log = open(os.devnull, "w")
    ix = subprocess.Popen(
        [sys.executable, "-m", "dynamo.indexer", "--block-size", "16", "--port", str(iport),
         "--threads", "1", "--workers", workers],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{iport}/query"

        def scores(tokens):
            v = post_json(url, {"token_ids": tokens, "model_name": "default"})
            return {int(r): n for r, n in v.get("scores", {}).get("1", {}).items()}

        # Live once a probe sent now shows up in the indexer (its SUB
        # sockets connect in the background).
        deadline = time.time() + 60
        i = 0
        while True:
            assert ix.poll() is None, "the indexer exited"
            assert time.time() < deadline, "the indexer never saw an event"
            probe = list(f"dynamo probe {i} ".encode() * 4)
            i += 1
            try:
                client.completions.create(model="radixkv-sim", prompt=probe, max_tokens=1)
                wait_idle()
                if sum(scores(probe).values()) > 0:
                    break
            except (OSError, ValueError):
                pass  # not listening yet
            time.sleep(0.2)
        prompts = [list((f"shared system prompt {g} " * 6 + f"question {q}").encode())
                   for g in range(3) for q in range(4)]
        for p in prompts:
            client.completions.create(model="radixkv-sim", prompt=p, max_tokens=2)
        wait_idle()

        def compare():
            out = []
            for p in prompts:
                ours = post_json(BASE + "/query", {"token_ids": p}, KEY)["data"]["radixkv"]["L1"]
                want = {int(k[2:]): v for k, v in ours.items() if v}
                got = {r: n for r, n in scores(p).items() if n}
                out.append((got, want))
            return out

        # The indexer applies events on its own threads: poll until it has
        # caught up (radixkv is idle, so its answer no longer moves).
        deadline = time.time() + 20
        pairs = compare()
        while any(g != w for g, w in pairs) and time.time() < deadline:
            time.sleep(0.1)
            pairs = compare()
        bad = [(g, w) for g, w in pairs if g != w]
        assert not bad, f"Dynamo vs radixkv: {bad}"
        assert all(w for _, w in pairs), "every prompt is cached somewhere"
        return f"{len(pairs)} prompts: per-rank overlap equal to radixkv's"
    finally:
        ix.terminate()
        ix.wait(10)


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


@check("1,000 concurrent streaming clients, with a bounded number of server threads")
def _():
    before = threads_of(PID)
    peak = [before]

    async def one(http, i):
        body = {"prompt": f"client {i}: " + "x" * 40, "max_tokens": 16, "stream": True}
        n = 0
        async with http.stream("POST", BASE + "/v1/completions", json=body,
                               headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status_code == 200, r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    n += 1
        return n

    async def watch(stop):
        while not stop.is_set():
            peak[0] = max(peak[0], threads_of(PID))
            await asyncio.sleep(0.05)

    async def main():
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            stop = asyncio.Event()
            w = asyncio.create_task(watch(stop))
            counts = await asyncio.gather(*(one(http, i) for i in range(1000)))
            stop.set()
            await w
            return counts

    counts = asyncio.run(main())
    assert all(c == 16 for c in counts), sorted(set(counts))
    assert peak[0] <= 64, f"the server ran {peak[0]} threads"
    return f"all 1,000 got 16 tokens; server threads {before} before, {peak[0]} at most"


passed = sum(ok for _, ok in RESULTS)
failed = len(RESULTS) - passed
print(f"python-check: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
