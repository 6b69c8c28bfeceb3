"""Latency of SGLang's prefix-cache calls on radixkv's backend and on SGLang
0.5.23's own caches, in one Python process, on the same operation trace.

Caches: `radixkv.sglang.RadixKVCache` (radixkv), SGLang's default
`UnifiedRadixCache` (its Rust tree core) and its Python `RadixCache`. Each
gets the same calls, `match_prefix(MatchPrefixParams)` and
`insert(InsertParams)`, with every `RadixKey` and value tensor built
before the clock starts; each call is timed alone (`perf_counter_ns`), and
p50 / p99 are over all calls of a kind. Workloads:

* `synthetic`: 64 prompts x 1,000 tokens, 16 requests each with a distinct
  208-token suffix (1,024 requests), shuffled; every request inserted,
  then every request matched;
* `mooncake`: the first N requests of the Mooncake conversation trace (its
  512-token block ids expanded to tokens), in trace order; each request
  matched, then inserted.

Page sizes 1 and 16. Then the match throughput of 1, 2 and 4 Python
threads sharing one cache of each kind, each thread matching its share of
the synthetic requests, in `--thread-cycles` cycles that each measure the
three counts in turn: the medians per count, and the median (and
quartiles) of each cycle's 2/1 and 4/1 ratios, which cancel most of this
machine's drift between runs. Prints one line per measurement and writes
JSON.

With `--gil-sweep`, instead: where radixkv's GIL release pays. For keys
of 16 to 262,144 tokens (64 keys, page size 16, all inserted), the match
p50 on one thread and the match throughput of 1, 2 and 4 threads, with
the GIL released on every call (`radixkv.set_gil_release_tokens(0)`) and
on none; the threshold (`radixkv.gil_release_tokens()`) is the length
from which releasing gives more throughput to several threads.

Opt-in (not run by CI): `bash scripts/sglang-bench.sh`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import threading
import time
import warnings
from array import array
from pathlib import Path

warnings.filterwarnings("ignore")

import torch
from radixkv.sglang import RadixKVCache
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_context

ROOT = Path(__file__).resolve().parents[3]

#: How long each match-throughput measurement runs, about (seconds).
THROUGHPUT_SECONDS = 0.5


class NoFree:
    """An allocator that frees nothing (nothing is evicted here)."""

    device = "cpu"

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    def free_segment(self, values, start_pos: int = 0) -> None:
        pass

    def free(self, values) -> None:
        pass


def make_cache(kind: str, ps: int):
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=NoFree(ps),
        page_size=ps,
        tree_components=(ComponentType.FULL,),
    )
    return {"radixkv": RadixKVCache, "UnifiedRadixCache": UnifiedRadixCache, "RadixCache": RadixCache}[kind](params)


def synthetic(seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for p in range(64):
        prompt = [rng.randrange(1, 50_000) for _ in range(1000)]
        for _ in range(16):
            out.append(prompt + [rng.randrange(1, 50_000) for _ in range(208)])
    rng.shuffle(out)
    return out


def mooncake(path: Path, n: int) -> list[list[int]]:
    text = subprocess.run(["zstd", "-dc", str(path)], check=True, capture_output=True).stdout.decode()
    out = []
    for line in text.splitlines()[:n]:
        r = json.loads(line)
        tokens: list[int] = []
        for h in r["hash_ids"]:
            tokens.extend(range(h * 512, h * 512 + 512))
        out.append(tokens[: r["input_length"]])
    return out


def pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0


def timed(cache, calls: list) -> tuple[list[int], list[int]]:
    """Runs `calls` ((kind, params) in order); per-call ns by kind."""
    match, insert = [], []
    clock = time.perf_counter_ns
    m, i = cache.match_prefix, cache.insert
    for kind, params in calls:
        if kind == "m":
            t = clock()
            m(params)
            match.append(clock() - t)
        else:
            t = clock()
            i(params)
            insert.append(clock() - t)
    return match, insert


def plan(workload: str, requests: list[list[int]], ps: int) -> list:
    """The operation trace: (kind, params), keys and values built now."""
    calls = []
    base = 1
    inserts, matches = [], []
    for tokens in requests:
        n = len(tokens) // ps * ps
        key = RadixKey(array("q", tokens[:n]))
        value = torch.arange(base, base + n, dtype=torch.int64)
        base += n
        inserts.append(("i", InsertParams(key=key, value=value)))
        matches.append(("m", MatchPrefixParams(key=RadixKey(array("q", tokens)))))
    if workload == "synthetic":
        calls = inserts + matches
    else:
        for m, i in zip(matches, inserts, strict=True):
            calls += [m, i]
    return calls


def filled(kind: str, requests: list[list[int]], ps: int) -> tuple[object, list]:
    """A `kind` cache holding every request (the synthetic plan's inserts),
    and a match key for each request (the matches split no node)."""
    cache = make_cache(kind, ps)
    for op, params in plan("synthetic", requests, ps):
        if op == "i":
            cache.insert(params)
    return cache, [MatchPrefixParams(key=RadixKey(array("q", t))) for t in requests]


def match_rate(cache, keys: list, threads: int, rounds: int) -> float:
    """Matches per second of `threads` Python threads sharing `cache`, each
    matching its share of `keys` `rounds` times (threads started before
    the clock)."""
    shares = [keys[k::threads] for k in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def work(share):
        barrier.wait()
        m = cache.match_prefix
        for _ in range(rounds):
            for p in share:
                m(p)

    ts = [threading.Thread(target=work, args=(s,)) for s in shares]
    for t in ts:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in ts:
        t.join()
    return rounds * len(keys) / (time.perf_counter() - start)


def threads_paired(kind: str, requests: list[list[int]], ps: int, rounds: int, cycles: int) -> dict:
    """Match throughput of 1, 2 and 4 threads sharing one `kind` cache, in
    `cycles` cycles that each measure the three in turn (the order reversed
    every other cycle): this machine's speed drifts between runs by more
    than the thread counts differ, and within a cycle the drift mostly
    cancels. Returns each count's median rate and each cycle's 2/1 and 4/1
    ratios."""
    cache, keys = filled(kind, requests, ps)
    match_rate(cache, keys, 1, 1)
    runs = []
    for c in range(cycles):
        order = (1, 2, 4) if c % 2 == 0 else (4, 2, 1)
        runs.append({n: match_rate(cache, keys, n, rounds) for n in order})
    return {
        "median_per_s": {n: statistics.median(r[n] for r in runs) for n in (1, 2, 4)},
        "ratios": {f"{n}/1": sorted(r[n] / r[1] for r in runs) for n in (2, 4)},
    }


def gil_sweep(out: str) -> None:
    """See the module docs (`--gil-sweep`)."""
    import radixkv

    rng = random.Random(11)
    rows = []
    default = radixkv.gil_release_tokens()
    print("key tokens | release | 1-thread match p50 us | matches/s with 1 / 2 / 4 threads", flush=True)
    for n in (16, 64, 256, 1024, 4096, 16384, 65536, 262144):
        reqs = [[rng.randrange(1, 50_000) for _ in range(n)] for _ in range(64)]
        # About 0.2 s of matches per cell (1 us a call plus 3 ns a token).
        rounds = max(4, int(0.2 / (1e-6 + n * 3e-9) / 64))
        for release in ("always", "never"):
            radixkv.set_gil_release_tokens(0 if release == "always" else 1 << 62)
            cache, keys = filled("radixkv", reqs, 16)
            lat = []
            clock = time.perf_counter_ns
            for _ in range(rounds):
                for k in keys:
                    t = clock()
                    cache.match_prefix(k)
                    lat.append(clock() - t)
            # The same cache: the timed matches split no node.
            rates = [match_rate(cache, keys, t, rounds) for t in (1, 2, 4)]
            del cache
            rows.append({"tokens": n, "release": release, "match_p50_us": pct(lat, 0.5), "per_s": rates})
            print(
                f"{n:10d} | {release:7s} | {pct(lat, 0.5):8.2f} | "
                + " / ".join(f"{r:,.0f}" for r in rates),
                flush=True,
            )
    radixkv.set_gil_release_tokens(default)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"gil_sweep": rows}, indent=1))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mooncake-requests", type=int, default=1000)
    traces = Path(os.environ.get("RADIXKV_TRACES", ROOT.parent / "shared" / "workloads"))
    ap.add_argument("--trace", default=str(traces / "mooncake_conversation_trace.jsonl.zst"))
    ap.add_argument(
        "--repeats", type=int, default=3, help="fresh caches per (workload, page size, cache); best p50 kept"
    )
    ap.add_argument(
        "--thread-cycles", type=int, default=7, help="cycles of the 1/2/4-thread match throughput (medians kept)"
    )
    ap.add_argument("--out", default="target/sglang-bench.json")
    ap.add_argument("--gil-sweep", action="store_true", help="where the GIL release pays (see the docs)")
    a = ap.parse_args()
    if a.gil_sweep:
        with get_context().override_server_args():
            gil_sweep(a.out)
        return
    workloads = {"synthetic": synthetic()}
    if Path(a.trace).exists():
        workloads["mooncake"] = mooncake(Path(a.trace), a.mooncake_requests)
    else:
        print(f"the Mooncake trace is not at {a.trace} (set RADIXKV_TRACES or --trace): synthetic only", flush=True)
    results = []
    kinds = ("radixkv", "UnifiedRadixCache", "RadixCache")
    with get_context().override_server_args():
        for wname, reqs in workloads.items():
            for ps in (1, 16):
                calls = plan(wname, reqs, ps)
                row = {"workload": wname, "page_size": ps}
                for kind in kinds:
                    best = None
                    for _ in range(a.repeats):
                        cache = make_cache(kind, ps)
                        match, insert = timed(cache, calls)
                        r = {
                            "match_p50": pct(match, 0.5),
                            "match_p99": pct(match, 0.99),
                            "insert_p50": pct(insert, 0.5),
                            "insert_p99": pct(insert, 0.99),
                        }
                        if best is None or r["match_p50"] + r["insert_p50"] < best["match_p50"] + best["insert_p50"]:
                            best = r
                        del cache
                    row[kind] = best
                results.append(row)
                u, k = row["UnifiedRadixCache"], row["radixkv"]
                print(
                    f"{wname:9s} ps {ps:2d} | "
                    + " | ".join(
                        f"{kind}: match {row[kind]['match_p50']:.1f}/{row[kind]['match_p99']:.1f} us, "
                        f"insert {row[kind]['insert_p50']:.1f}/{row[kind]['insert_p99']:.1f} us"
                        for kind in kinds
                    )
                    + f" | radixkv/Unified p50: match {k['match_p50'] / u['match_p50']:.2f}, "
                    f"insert {k['insert_p50'] / u['insert_p50']:.2f}",
                    flush=True,
                )
        tput = {}
        by_ps = {r["page_size"]: r for r in results if r["workload"] == "synthetic"}
        for ps in (1, 16):
            for kind in kinds:
                # Enough rounds for about THROUGHPUT_SECONDS of matching at
                # the p50 measured above: far longer than the interpreter's
                # GIL switch interval (5 ms), so that the hand-offs between
                # threads are measured in steady state, not one or two of
                # them across a run as short as the interval.
                per_round = len(workloads["synthetic"]) * by_ps[ps][kind]["match_p50"] * 1e-6
                rounds = max(5, math.ceil(THROUGHPUT_SECONDS / per_round))
                t = threads_paired(kind, workloads["synthetic"], ps, rounds, a.thread_cycles)
                tput[f"{kind}_ps{ps}"] = t
                med, rat = t["median_per_s"], t["ratios"]
                print(
                    f"match throughput, {kind}, ps {ps}, medians of {a.thread_cycles} cycles: "
                    + " / ".join(f"{med[n]:,.0f}" for n in (1, 2, 4))
                    + " per s (1 / 2 / 4 threads); per cycle, median [quartiles]: "
                    + ", ".join(
                        f"{k} {statistics.median(v):.2f} [{v[len(v) // 4]:.2f}-{v[3 * len(v) // 4]:.2f}]"
                        for k, v in rat.items()
                    ),
                    flush=True,
                )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"latency_us": results, "match_throughput_per_s": tput}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
