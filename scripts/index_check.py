"""`radixkv index` against real producers and against NVIDIA Dynamo's
standalone indexer, on the same event streams.

Workers:

* SGLang 0.5.23 worker processes (`worker` mode of this script, run under
  the SGLang venv): each runs SGLang's own `RadixCache` on the CPU and
  publishes its KV events through SGLang's own `ZmqEventPublisher` (PUB
  plus replay ROUTER, rank offsets on the ports), one batch per step, as
  SGLang's scheduler does. Two instances of two ranks at page size 1 and
  two at page size 16, each rank's cache held to a capacity by evictions.
* `radixkv serve --kv-events` with two devices (its own routing).

Both `radixkv index` and Dynamo's indexer (`python -m dynamo.indexer`,
ai-dynamo-runtime 1.6.1) are told of every worker rank through
`POST /register`, with its replay endpoint: one model per page size.

A trace drives the workers (the Mooncake conversation trace from
../shared/workloads when present, expanded to tokens; otherwise a
generated shared-prefix workload; the script says which). At quiescent
points, every prompt's score per (worker, rank) from `radixkv index` must
equal that worker's own match length (whole blocks): 0 mismatches; and
Dynamo's answer on the same streams must equal it too.

Then the faults: a worker rank killed (SIGKILL) and started again on the
same ports (radixkv index must follow it; Dynamo 1.6.1 ignores a
restarted worker until it is registered again, which is reported, not
required); a batch dropped, duplicated, sent after the next one, or sent
among junk messages on the wire, with the replay endpoint: no mismatch
after any; and the negative control: a worker that silently drops one
batch, registered with radixkv index without its replay endpoint, must
mismatch.

Usage: index_check.py --radixkv BIN --dynamo-python PY  (the controller)
       index_check.py worker ...                         (spawned by it)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.environ.get("RADIXKV_TRACES") or os.path.join(HERE, "..", "..", "shared", "workloads")


# --- the worker: SGLang's RadixCache and publisher ---------------------------------


def worker_main(a: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    from array import array

    import torch
    from sglang.srt.disaggregation.kv_events import (
        AllBlocksCleared,
        KVEventBatch,
        ZmqEventPublisher,
    )
    from sglang.srt.mem_cache import radix_cache as rc
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    class Slots:
        """The allocator SGLang's tree frees evicted values to (nothing to
        free here: the values are only ids)."""

        device = "cpu"
        page_size = a.page_size

        def free(self, values) -> None:
            pass

        def free_segment(self, values, start_pos: int = 0) -> None:
            pass

    cache = rc.RadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=Slots(),
            page_size=a.page_size,
            eviction_policy="lru",
            enable_kv_cache_events=True,
        )
    )
    pub = ZmqEventPublisher(
        attn_dp_rank=a.rank,
        endpoint=f"tcp://127.0.0.1:{a.port}",
        replay_endpoint=f"tcp://127.0.0.1:{a.replay_port}",
        bind=True,
    )
    # Batches published so far (the publisher numbers them in this order).
    published = 0
    inserts = 0
    # The sequence number of the batch the fault hits.
    lose = {"seq": -1}
    if a.fault_batch >= 0:
        # One batch, on the wire (the replay buffer keeps it as it was):
        # lost (as a PUB drops at its high-water mark), sent twice, sent
        # after the next one, or sent among junk messages.
        real = pub._pub

        class Faulty:
            held = None

            def send_multipart(self, frames, *args, **kw):
                hit = int.from_bytes(frames[1], "big") == lose["seq"]
                if a.fault == "drop" and hit:
                    return None
                if a.fault == "duplicate" and hit:
                    real.send_multipart(frames, *args, **kw)
                if a.fault == "swap" and hit:
                    Faulty.held = frames
                    return None
                if a.fault == "junk" and hit:
                    real.send_multipart([b"junk"])
                    real.send_multipart([b"", frames[1], b"\xc1 not msgpack"])
                    real.send_multipart([b"", frames[1], b"\x93\x01\x02"])
                r = real.send_multipart(frames, *args, **kw)
                if Faulty.held is not None and not hit:
                    real.send_multipart(Faulty.held)
                    Faulty.held = None
                return r

            def __getattr__(self, name):
                return getattr(real, name)

        pub._pub = Faulty()

    def publish(events) -> None:
        nonlocal published
        pub.publish(KVEventBatch(ts=time.time(), events=events))
        published += 1

    next_value = 1
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        reply: dict = {}
        if op == "hello":
            # A clearing batch (changes nothing): the subscribers' probe.
            cache.take_events()
            publish([AllBlocksCleared()])
        elif op == "insert":
            tokens = cmd["tokens"]
            n = len(tokens) // a.page_size * a.page_size
            values = torch.arange(next_value, next_value + n, dtype=torch.int64)
            next_value += n
            cache.insert(InsertParams(key=rc.RadixKey(array("q", tokens[:n])), value=values))
            over = cache.total_size() - a.capacity
            reply["evicted"] = 0
            if over > 0:
                reply["evicted"] = cache.evict(EvictParams(num_tokens=over)).num_tokens_evicted
            events = cache.take_events()
            if events:
                if inserts == a.fault_batch:
                    lose["seq"] = published
                inserts += 1
                publish(events)
            reply["events"] = len(events)
        elif op == "match":
            out = []
            for tokens in cmd["prompts"]:
                m = cache.match_prefix(MatchPrefixParams(key=rc.RadixKey(array("q", tokens))))
                out.append(int(m.device_prefix_len))
            reply["lens"] = out
        elif op == "quiesce":
            pub._event_queue.join()
        else:
            reply["error"] = f"unknown op {op}"
        print(json.dumps(reply), flush=True)
    pub.shutdown()


# --- the controller -----------------------------------------------------------------


def free_block(n: int) -> int:
    """The first of `n` consecutive free ports."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p + n > 65000:
            continue
        ok = True
        for i in range(n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p + i))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return p


def http(url: str, body=None, timeout: float = 10.0):
    """(status, JSON or text) of a GET (no body) or POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read().decode()
        status = e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def wait_http(url: str, what: str, proc: subprocess.Popen, limit: float = 60.0) -> None:
    deadline = time.time() + limit
    while True:
        if proc.poll() is not None:
            sys.exit(f"FAIL: {what} exited ({proc.returncode})")
        try:
            status, _ = http(url, timeout=2)
            if status in (200, 503):
                return
        except OSError:
            pass
        if time.time() > deadline:
            sys.exit(f"FAIL: {what} never answered {url}")
        time.sleep(0.1)


class SglangRank:
    """One SGLang worker rank: a process of this script in `worker` mode."""

    def __init__(self, python: str, instance: int, rank: int, ps: int, port: int, rport: int, capacity: int,
                 fault: str = "none", fault_batch: int = -1):
        self.instance, self.rank, self.ps = instance, rank, ps
        self.port, self.rport, self.capacity = port, rport, capacity
        self.fault, self.fault_batch = fault, fault_batch
        self.python = python
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.python, __file__, "worker", "--rank", str(self.rank), "--page-size", str(self.ps),
             "--port", str(self.port), "--replay-port", str(self.rport), "--capacity", str(self.capacity),
             "--fault", self.fault, "--fault-batch", str(self.fault_batch)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )

    def call(self, **cmd) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"FAIL: SGLang worker {self.instance}:{self.rank} died")
        return json.loads(line)

    def endpoints(self):
        # SGLang offsets both ports by the rank.
        return f"tcp://127.0.0.1:{self.port + self.rank}", f"tcp://127.0.0.1:{self.rport + self.rank}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def trace_prompts(n: int, tokens_per_id: int):
    """Prompts of the Mooncake conversation trace (ids expanded to
    `tokens_per_id` tokens each), or a generated workload without it."""
    path = os.path.join(WORKLOADS, "mooncake_conversation_trace.jsonl.zst")
    if not os.path.exists(path) and os.environ.get("RADIXKV_REQUIRE_TRACES") == "1":
        raise SystemExit(f"FAIL: no {path} and RADIXKV_REQUIRE_TRACES=1: the trace workload cannot run")
    if os.path.exists(path):
        out = subprocess.run(["zstd", "-dc", path], capture_output=True, check=True).stdout.decode()
        prompts = []
        for line in out.splitlines()[:n]:
            ids = json.loads(line)["hash_ids"][:12]
            prompts.append([h * tokens_per_id + j for h in ids for j in range(tokens_per_id)])
        return "the Mooncake conversation trace (first %d requests, ≤12 blocks each)" % n, prompts
    rng = random.Random(5)
    systems = [[rng.randrange(1 << 20) for _ in range(6 * tokens_per_id)] for _ in range(12)]
    prompts = []
    for i in range(n):
        s = systems[rng.randrange(len(systems))]
        prompts.append(s + [rng.randrange(1 << 20) for _ in range(rng.randrange(1, 6) * tokens_per_id)])
    return "a generated shared-prefix workload (../shared/workloads absent)", prompts


class Indexes:
    """`radixkv index` and Dynamo's indexer, told of the same workers."""

    def __init__(self, radixkv: str, dynamo_python: str) -> None:
        self.rport, self.dport = free_block(1), free_block(1)
        # The logs, named on a failure.
        self.logs = tempfile.mkdtemp(prefix="index-check-")
        rlog = open(os.path.join(self.logs, "radixkv-index.log"), "w")
        dlog = open(os.path.join(self.logs, "dynamo-indexer.log"), "w")
        self.r = subprocess.Popen([radixkv, "index", "--host", "127.0.0.1", "--port", str(self.rport)],
                                  stdout=rlog, stderr=subprocess.STDOUT)
        self.d = subprocess.Popen([dynamo_python, "-m", "dynamo.indexer", "--port", str(self.dport),
                                   "--threads", "1"], stdout=dlog, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.rport}/health", "radixkv index", self.r)
        wait_http(f"http://127.0.0.1:{self.dport}/health", "Dynamo's indexer", self.d)

    def register(self, instance: int, rank: int, model: str, ps: int, ep: str, replay, dynamo: bool = True) -> None:
        body = {"instance_id": instance, "dp_rank": rank, "endpoint": ep, "model_name": model, "block_size": ps}
        if replay:
            body["replay_endpoint"] = replay
        s, v = http(f"http://127.0.0.1:{self.rport}/register", body)
        assert s == 201, f"radixkv index /register: {s} {v}"
        if dynamo:
            s, v = http(f"http://127.0.0.1:{self.dport}/register", body)
            assert s == 201, f"Dynamo /register: {s} {v}"

    def scores(self, which: str, model: str, tokens) -> dict:
        port = self.rport if which == "radixkv" else self.dport
        s, v = http(f"http://127.0.0.1:{port}/query", {"token_ids": tokens, "model_name": model})
        if s == 404:
            return {}
        assert s == 200, f"{which} /query: {s} {v}"
        return {(int(w), int(r)): n for w, ranks in v.get("scores", {}).items() for r, n in ranks.items() if n}

    def live_batches(self, instance: int, rank: int) -> int:
        _, text = http(f"http://127.0.0.1:{self.rport}/metrics")
        key = f'instance_id="{instance}",dp_rank="{rank}"}} '
        for line in str(text).splitlines():
            if line.startswith("radixkv_index_live_batches_total{") and key in line:
                return int(line.rsplit(" ", 1)[1])
        return 0

    def unregister(self, instance: int, model: str) -> None:
        for port in (self.rport, self.dport):
            http(f"http://127.0.0.1:{port}/unregister", {"instance_id": instance, "model_name": model})

    def close(self) -> None:
        for p in (self.r, self.d):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def truth_sglang(ranks, prompts):
    """{prompt index: {(instance, rank): tokens}} from each rank's own match."""
    out = {i: {} for i in range(len(prompts))}
    for w in ranks:
        for i, n in enumerate(w.call(op="match", prompts=prompts)["lens"]):
            if n:
                out[i][(w.instance, w.rank)] = n
    return out


def compare(ix: Indexes, which: str, model: str, prompts, truth, limit: float = 20.0):
    """Polls until `which`'s answers equal the truth (or `limit` passes);
    returns the mismatches [(prompt, want, got)]."""
    deadline = time.time() + limit
    while True:
        bad = []
        for i, p in enumerate(prompts):
            got = ix.scores(which, model, p)
            if got != truth[i]:
                bad.append((i, truth[i], got))
        if not bad or time.time() > deadline:
            return bad
        time.sleep(0.2)


def hello(ix: Indexes, ranks) -> None:
    """Probes each rank until radixkv index hears it."""
    for w in ranks:
        deadline = time.time() + 60
        while ix.live_batches(w.instance, w.rank) == 0:
            if time.time() > deadline:
                sys.exit(f"FAIL: radixkv index never heard SGLang worker {w.instance}:{w.rank}")
            w.call(op="hello")
            time.sleep(0.1)


def drive(ranks, prompts, start: int = 0) -> int:
    """Each prompt to one rank (by its first block, as a prefix-aware
    router would, with a spill every fifth), one step each; returns the
    tokens the ranks evicted."""
    evicted = 0
    for i, p in enumerate(prompts):
        h = hash(tuple(p[:16])) + (i % 5 == 0) * (start + i)
        evicted += ranks[h % len(ranks)].call(op="insert", tokens=p)["evicted"]
    for w in ranks:
        w.call(op="quiesce")
    return evicted


def sglang_phase(ix: Indexes, python: str, radixkv_only_control: bool):
    """The SGLang workers at page sizes 1 and 16: exactness, a restart, and
    the dropped batch. Returns lines to print; exits on a failure."""
    lines = []
    failures = []
    for ps in (1, 16):
        model = f"sglang-ps{ps}"
        tpi = 16 if ps == 16 else 4
        what, prompts = trace_prompts(160 if ps == 16 else 240, tpi)
        ranks = []
        for instance in (10 * ps + 1, 10 * ps + 2):
            base, rbase = free_block(2), free_block(2)
            for rank in (0, 1):
                ranks.append(SglangRank(python, instance, rank, ps, base, rbase, capacity=48 * tpi))
        for w in ranks:
            # Registered once up (its sockets bound), as a worker announces
            # itself: Dynamo's listener does not follow an endpoint that
            # is not bound yet when it is registered.
            w.call(op="hello")
            ep, rep = w.endpoints()
            ix.register(w.instance, w.rank, model, ps, ep, rep)
        hello(ix, ranks)
        evicted = drive(ranks, prompts)
        if evicted == 0:
            failures.append(f"page size {ps}: nothing was evicted")
        truth = truth_sglang(ranks, prompts)
        held = sum(1 for t in truth.values() if t)
        lines.append(f"page size {ps}: 2 workers x 2 ranks, {len(prompts)} requests, {evicted} tokens evicted")
        for which in ("radixkv", "dynamo"):
            bad = compare(ix, which, model, prompts, truth)
            lines.append(f"page size {ps}, {what}: {which}: {len(prompts) - len(bad)} of {len(prompts)} prompts equal "
                         f"to the workers' own matches ({held} held somewhere), {len(bad)} mismatches")
            if bad:
                failures.append(f"{which} at page size {ps}: {bad[:3]}")

        # A rank killed and started again on its ports: a fresh cache,
        # sequence 0 again, its clearing first.
        victim = ranks[0]
        victim.kill()
        victim.start()
        more = prompts[: len(prompts) // 2]
        drive(ranks, more, start=len(prompts))
        truth = truth_sglang(ranks, prompts)
        bad = compare(ix, "radixkv", model, prompts, truth, limit=60.0)
        lines.append(f"page size {ps}, after SIGKILL and restart of {victim.instance}:{victim.rank}: radixkv: "
                     f"{len(bad)} mismatches")
        if bad:
            failures.append(f"radixkv after the restart at page size {ps}: {bad[:3]}")
        dbad = compare(ix, "dynamo", model, prompts, truth, limit=5.0)
        lines.append(f"page size {ps}, after the restart: Dynamo 1.6.1: {len(dbad)} mismatches "
                     "(it ignores a restarted worker until registered again; reported, not required)")
        for w in ranks:
            w.kill()
        for instance in {w.instance for w in ranks}:
            ix.unregister(instance, model)

    # Faults on the wire, with the replay endpoint: no mismatch after
    # any. Then the negative control: a dropped batch without it.
    for fault, replay in (("drop", True), ("duplicate", True), ("swap", True), ("junk", True), ("drop", False)):
        model = f"{fault}-{'replay' if replay else 'none'}"
        _, prompts = trace_prompts(80, 4)
        base, rbase = free_block(1), free_block(1)
        w = SglangRank(python, 900, 0, 1, base, rbase, capacity=10_000, fault=fault, fault_batch=5)
        w.call(op="hello")
        ep, rep = w.endpoints()
        ix.register(900, 0, model, 1, ep, rep if replay else None, dynamo=False)
        hello(ix, [w])
        drive([w], prompts)
        truth = truth_sglang([w], prompts)
        bad = compare(ix, "radixkv", model, prompts, truth, limit=10.0 if replay else 3.0)
        if replay:
            how = {"drop": "dropped", "duplicate": "sent twice", "swap": "sent after the next", "junk": "sent among junk"}
            lines.append(f"batch 5 {how[fault]} on the wire, replay on: {len(bad)} mismatches")
            if bad:
                failures.append(f"radixkv after a {fault} with replay on: {bad[:3]}")
        else:
            lines.append(f"negative control, a batch dropped, replay off: {len(bad)} mismatches (must be > 0)")
            if not bad:
                failures.append("the negative control (a dropped batch without replay) did not mismatch")
        w.kill()
        ix.unregister(900, model)
    return lines, failures


def serve_phase(ix: Indexes, radixkv: str):
    """`radixkv serve --kv-events` with two devices, its own routing."""
    events, replay, port = free_block(2), free_block(2), free_block(1)
    log = open(os.devnull, "w")
    proc = subprocess.Popen(
        [radixkv, "serve", "--port", str(port), "--devices", "2", "--page-size", "16",
         "--pages-per-device", "96", "--host-pages", "0", "--speedup", "1000",
         "--kv-events", f"tcp://127.0.0.1:{events}", "--kv-events-replay", f"tcp://127.0.0.1:{replay}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/health", "radixkv serve", proc)
        for d in (0, 1):
            ix.register(1, d, "radixkv", 16, f"tcp://127.0.0.1:{events + d}", f"tcp://127.0.0.1:{replay + d}")
        what, prompts = trace_prompts(120, 16)
        prompts = [[t % 50_000 for t in p] for p in prompts]
        for p in prompts:
            s, v = http(base + "/v1/completions", {"prompt": p, "max_tokens": 2}, timeout=60)
            assert s == 200, v
        truth = {}
        for i, p in enumerate(prompts):
            _, v = http(base + "/query", {"token_ids": p})
            l1 = v["data"]["radixkv"]["L1"]
            truth[i] = {(1, int(k[2:])): n for k, n in l1.items() if n}
        lines, failures = [], []
        for which in ("radixkv", "dynamo"):
            bad = compare(ix, which, "radixkv", prompts, truth, limit=30.0)
            lines.append(f"radixkv serve, 2 devices, {what}: {which}: {len(bad)} mismatches of {len(prompts)} prompts")
            if bad:
                failures.append(f"{which} on radixkv serve: {bad[:3]}")
        return lines, failures
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        p = argparse.ArgumentParser()
        p.add_argument("worker")
        p.add_argument("--rank", type=int, required=True)
        p.add_argument("--page-size", type=int, required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--replay-port", type=int, required=True)
        p.add_argument("--capacity", type=int, required=True)
        p.add_argument("--fault", choices=("none", "drop", "duplicate", "swap", "junk"), default="none")
        p.add_argument("--fault-batch", type=int, default=-1)
        worker_main(p.parse_args())
        return
    p = argparse.ArgumentParser()
    p.add_argument("--radixkv", required=True)
    p.add_argument("--dynamo-python", required=True)
    a = p.parse_args()
    ix = Indexes(a.radixkv, a.dynamo_python)
    try:
        lines, failures = sglang_phase(ix, sys.executable, False)
        l2, f2 = serve_phase(ix, a.radixkv)
    finally:
        ix.close()
    for line in lines + l2:
        print("  " + line)
    if failures + f2:
        for f in failures + f2:
            print("FAIL: " + f)
        print(f"(the indexes' logs: {ix.logs})")
        sys.exit(1)
    shutil.rmtree(ix.logs, ignore_errors=True)
    print("ok   radixkv index equals every worker's own match, and Dynamo's indexer on the same streams")


if __name__ == "__main__":
    main()
